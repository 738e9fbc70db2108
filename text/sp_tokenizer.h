// A sentencepiece tokenizer.model (Llama-2 / Mixtral style) as a Tokenizer, on Debian's
// libsentencepiece: its own normalizer, dummy prefix and byte fallback. Control pieces
// ("<s>", "</s>") and the unknown piece written in the text are split out first and become
// their ids, as Hugging Face's slow tokenizer does; BOS/EOS are added as tokenizer_config.json's
// add_bos_token / add_eos_token say (Llama's defaults: BOS yes, EOS no).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/sp_processor.h"
#include "text/tokenizer.h"

namespace moeserve {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromFile(const std::string& path,
                                                                          bool add_bos = true,
                                                                          bool add_eos = false);

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;
  std::optional<int32_t> TokenId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override;
  int32_t vocab_size() const override { return vocab_size_; }

 private:
  SentencePieceTokenizer() = default;

  std::unique_ptr<SpProcessor> sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control and unknown pieces
  bool add_bos_ = true, add_eos_ = false;
  int32_t vocab_size_ = 0;
};

}  // namespace moeserve
