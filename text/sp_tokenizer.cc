// SentencePieceTokenizer.
#include "text/sp_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromFile(
    const std::string& path, bool add_bos, bool add_eos) {
  absl::StatusOr<std::unique_ptr<SpProcessor>> loaded = SpProcessor::Load(path);
  if (!loaded.ok()) return loaded.status();
  std::unique_ptr<SpProcessor> sp = *std::move(loaded);
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->vocab_size_ = sp->size();
  for (int id = 0; id < sp->size(); ++id) {
    if (sp->IsControl(id) || sp->IsUnknown(id)) {
      std::string piece = sp->IdToPiece(id);
      if (!piece.empty()) t->specials_.emplace_back(std::move(piece), id);
    }
  }
  if (add_bos && sp->bos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": add_bos_token is set but the model has no BOS piece"));
  }
  if (add_eos && sp->eos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": add_eos_token is set but the model has no EOS piece"));
  }
  t->add_bos_ = add_bos;
  t->add_eos_ = add_eos;
  t->sp_ = std::move(sp);
  return t;
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text,
                                                                    bool add_special_tokens) const {
  if (std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(absl::StrCat("text: invalid UTF-8 at byte ", *bad));
  }
  std::vector<int32_t> out;
  if (add_special_tokens && add_bos_) out.push_back(sp_->bos_id());
  auto encode = [&](absl::string_view piece) -> absl::Status {
    if (piece.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<int>> ids = sp_->Encode(piece);
    if (!ids.ok()) return ids.status();
    out.insert(out.end(), ids->begin(), ids->end());
    return absl::OkStatus();
  };
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : specials_) {
      if (text.substr(pos, s.first.size()) == s.first &&
          (hit == nullptr || s.first.size() > hit->first.size())) {
        hit = &s;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    if (absl::Status s = encode(text.substr(start, pos - start)); !s.ok()) return s;
    out.push_back(hit->second);
    pos += hit->first.size();
    start = pos;
  }
  if (absl::Status s = encode(text.substr(start)); !s.ok()) return s;
  if (add_special_tokens && add_eos_) out.push_back(sp_->eos_id());
  return out;
}

std::string SentencePieceTokenizer::Decode(absl::Span<const int32_t> ids,
                                           bool skip_special_tokens) const {
  // Skipped special tokens decode as nothing within one sentencepiece call (as sentencepiece
  // itself decodes control pieces), so the text around them keeps its spaces; shown ones split
  // the text into runs, each decoded alone, as Hugging Face's slow tokenizer does.
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (!run.empty()) out += sp_->Decode(run);
    run.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      flush();
      out += "\xEF\xBF\xBD";  // U+FFFD: not a token of this vocabulary
    } else if (!skip_special_tokens && (sp_->IsControl(id) || sp_->IsUnknown(id))) {
      flush();
      out += sp_->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return Utf8Lossy(out);
}

std::optional<int32_t> SentencePieceTokenizer::TokenId(absl::string_view token) const {
  const int id = sp_->PieceToId(token);
  if (sp_->IsUnknown(id) && sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

bool SentencePieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size_ && (sp_->IsControl(id) || sp_->IsUnknown(id));
}

}  // namespace moeserve
