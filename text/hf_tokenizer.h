// A Hugging Face tokenizer.json with a BPE model, encoding and decoding as the tokenizers
// library (version 0.22) does: added tokens are split out of the raw text first (those marked
// "normalized" from each normalized piece), the rest is normalized, pre-tokenized and BPE-encoded,
// and the post-processor adds its special tokens. No C++ library for tokenizer.json is packaged
// for Debian (docs/tokenizers.md); the tests compare with the Python package on thousands of
// strings. Another model type or an unsupported component is refused by name.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/bpe.h"
#include "text/hf_decoder.h"
#include "text/hf_text.h"
#include "text/tokenizer.h"

namespace moeserve {

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromFile(const std::string& path);
  // `where` names the source in errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(absl::string_view json,
                                                               const std::string& where);

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;
  std::optional<int32_t> TokenId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::string TokenBytes(int32_t id) const override;

 private:
  struct AddedToken {
    std::string content;  // as decoded
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
    std::string match;  // as found in text: the content normalized when `normalized`
  };
  // A piece of the text: either text still to tokenize or an added token's id.
  struct Part {
    TextPiece piece;
    int32_t added_id = -1;
  };

  HfTokenizer() = default;
  // Splits the text parts of `parts` around the added tokens with `normalized` == `normalized`.
  std::vector<Part> SplitAdded(std::vector<Part> parts, bool normalized) const;

  BpeModel model_;
  TextPipeline text_;
  TokenDecoder decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;  // id -> index in added_
  std::vector<size_t> added_by_byte_[2][256];        // [normalized][first byte] -> indices
  std::vector<int32_t> prefix_, suffix_;             // the post-processor's tokens around a text
  int32_t vocab_size_ = 0;
};

}  // namespace moeserve
