// A byte-level tokenizer: ids 0..255 are bytes, then BOS, EOS and PAD. A model's vocabulary may
// be larger; ids past the tokenizer's (and invalid UTF-8) decode to U+FFFD, never to garbage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace moeserve {

class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kPad = 258;
  static constexpr int32_t kMinVocab = 259;

  // Bytes of `text`, preceded by BOS when `add_bos`.
  std::vector<int32_t> Encode(absl::string_view text, bool add_bos = true) const;
  // Valid UTF-8: special tokens are dropped, other non-byte ids become U+FFFD, and invalid or
  // truncated UTF-8 sequences become U+FFFD.
  std::string Decode(const std::vector<int32_t>& ids) const;

  static bool IsSpecial(int32_t id) { return id == kBos || id == kEos || id == kPad; }
};

// Streams text as tokens arrive: returns only complete UTF-8 characters and holds back a
// partial multi-byte sequence until it completes (or proves invalid).
class IncrementalDecoder {
 public:
  std::string Push(int32_t id);
  // Whatever is still pending, with an incomplete sequence rendered as U+FFFD.
  std::string Flush();

 private:
  std::string pending_;
};

// Replaces each byte that starts no valid UTF-8 sequence, and a truncated tail, with U+FFFD.
std::string SanitizeUtf8(absl::string_view bytes);

// Offset of the first byte that is not part of a valid UTF-8 sequence (a truncated tail
// included); nullopt when `bytes` is valid UTF-8.
std::optional<size_t> FirstInvalidUtf8(absl::string_view bytes);

}  // namespace moeserve
