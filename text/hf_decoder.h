// tokenizer.json's decoder: turns the vocabulary strings of a list of tokens back into text, as
// the tokenizers library does (each step maps the list of token strings to a new list, and the
// result is their concatenation). Unsupported decoders are refused by name.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace moeserve {

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind;
  std::string pattern, content;  // Replace (a literal); Strip's content is one character
  int start = 0, stop = 0;       // Strip
  std::string replacement;       // Metaspace
  bool strip_first = true;       // Metaspace: drop the replacement in the first token
};

class TokenDecoder {
 public:
  // `decoder` is tokenizer.json's object (null: tokens are joined with spaces).
  static absl::StatusOr<TokenDecoder> Create(const nlohmann::json& decoder);
  std::string Decode(std::vector<std::string> tokens) const;
  // True when the decoder is ByteLevel alone (GPT-2, Qwen): a token's characters map to bytes.
  bool byte_level_only() const {
    return steps_.size() == 1 && steps_[0].kind == DecoderStep::Kind::kByteLevel;
  }

 private:
  std::vector<DecoderStep> steps_;
  bool none_ = true;
};

}  // namespace moeserve
