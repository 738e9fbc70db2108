// The byte tokenizer's special ids (text/tokenizer.h), which the embedded presets' configs
// name as their bos/eos ids (models/model_config.cc): one definition for both.
#pragma once

#include <cstdint>

namespace moeserve {

inline constexpr int32_t kByteBos = 256;
inline constexpr int32_t kByteEos = 257;
inline constexpr int32_t kBytePad = 258;
inline constexpr int32_t kByteMinVocab = 259;  // the 256 bytes and the three special ids

}  // namespace moeserve
