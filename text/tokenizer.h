// What serving needs of a tokenizer (Tokenizer), and moeserve's own byte-level one: ids 0..255
// are bytes, then BOS, EOS and PAD. A model's vocabulary may be larger; ids past the
// tokenizer's (and invalid UTF-8) decode to U+FFFD, never to garbage. Hugging Face tokenizers
// are text/hf_tokenizer.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/byte_tokens.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace moeserve {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // `add_special_tokens`: the tokens the tokenizer puts around a text (a BOS), as in Hugging
  // Face's encode. Fails on text that is not valid UTF-8.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      bool add_special_tokens) const = 0;
  // Valid UTF-8; special tokens are left out when `skip_special_tokens`.
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;
  // The id of a token named in the vocabulary (a chat template's "<|im_end|>"), if any.
  virtual std::optional<int32_t> TokenId(absl::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // The bytes one token stands for (a byte-level token may be part of a character), for
  // logprobs' "bytes"; by default its decoded text.
  virtual std::string TokenBytes(int32_t id) const { return Decode(std::vector<int32_t>{id}, false); }
  // Ids are in [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = kByteBos;
  static constexpr int32_t kEos = kByteEos;
  static constexpr int32_t kPad = kBytePad;
  static constexpr int32_t kMinVocab = kByteMinVocab;

  // Bytes of `text`, preceded by BOS when `add_bos`.
  static std::vector<int32_t> Bytes(absl::string_view text, bool add_bos);
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text, bool add_bos) const override {
    return Bytes(text, add_bos);
  }
  // Valid UTF-8: special tokens are dropped (or named "<bos>", "<eos>", "<pad>" when not
  // skipped), other non-byte ids become U+FFFD, and invalid or truncated UTF-8 sequences become
  // U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = true) const override;
  std::optional<int32_t> TokenId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override { return IsSpecialId(id); }
  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : Decode(std::vector<int32_t>{id}, false);
  }
  int32_t vocab_size() const override { return kMinVocab; }

  static bool IsSpecialId(int32_t id) { return id == kBos || id == kEos || id == kPad; }
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

// As Rust's String::from_utf8_lossy (which the tokenizers library decodes with): each maximal
// ill-formed subsequence becomes one U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Offset of the first byte that is not part of a valid UTF-8 sequence (a truncated tail
// included); nullopt when `bytes` is valid UTF-8.
std::optional<size_t> FirstInvalidUtf8(absl::string_view bytes);

}  // namespace moeserve
