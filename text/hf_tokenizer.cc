// Loading tokenizer.json, the added-token split, the post-processor and decoding.
#include "text/hf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

absl::StatusOr<BpeModel> ReadModel(const Json& m, const std::string& where) {
  const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat(where, ": model type \"", type, "\" is not supported (only BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() &&
        !(m[key].is_string() && m[key].get<std::string>().empty())) {
      return absl::UnimplementedError(absl::StrCat(where, ": BPE ", key, " is not supported"));
    }
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0) {
    return absl::UnimplementedError(
        absl::StrCat(where, ": BPE dropout (random merges) is not supported"));
  }
  BpeModel::Options o;
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return Invalid(where, "model.vocab must be an object");
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer())
      return Invalid(where, "model.vocab[\"" + token + "\"] is not an integer");
    o.vocab.emplace(token, id.get<int32_t>());
  }
  for (const Json& merge : m.value("merges", Json::array())) {
    if (merge.is_string()) {  // the older "a b" form
      const std::string s = merge.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Invalid(where, "merge \"" + s + "\" is not two tokens separated by a space");
      }
      o.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      o.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Invalid(where, "a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  o.byte_fallback = m.value("byte_fallback", false);
  o.unk_token = m.contains("unk_token") && m["unk_token"].is_string()
                    ? m["unk_token"].get<std::string>()
                    : "";
  o.fuse_unk = m.value("fuse_unk", false);
  o.ignore_merges = m.value("ignore_merges", false);
  return BpeModel::Create(std::move(o));
}

// The post-processor's tokens before and after a single text. `token_id` resolves a name.
absl::Status ReadPostProcessor(
    const Json& p, const std::string& where,
    const std::function<std::optional<int32_t>(const std::string&)>& token_id,
    std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const Json& q : p.value("processors", Json::array())) {
      RETURN_IF_ERROR(ReadPostProcessor(q, where, token_id, prefix, suffix));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // it only adjusts offsets
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const Json& t = p.value(key, Json());
      if (!t.is_array() || t.size() != 2 || !t[1].is_number_integer()) {
        return Invalid(where,
                       absl::StrCat("post_processor ", type, ".", key, " must be [token, id]"));
      }
    }
    prefix->push_back(p["cls"][1].get<int32_t>());
    suffix->insert(suffix->begin(), p["sep"][1].get<int32_t>());
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(absl::StrCat(
        where, ": post_processor \"", type,
        "\" is not supported (supported: Sequence, ByteLevel, TemplateProcessing, BertProcessing, "
        "RobertaProcessing)"));
  }
  if (!prefix->empty() || !suffix->empty()) {
    return absl::UnimplementedError(where + ": more than one post-processor adds tokens");
  }
  bool seen_a = false;
  const Json specials = p.value("special_tokens", Json::object());
  for (const Json& item : p.value("single", Json::array())) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", "") != "A")
        return Invalid(where, "post_processor single uses a sequence other than $A");
      if (seen_a) return Invalid(where, "post_processor single uses $A twice");
      seen_a = true;
      continue;
    }
    if (!item.contains("SpecialToken"))
      return Invalid(where, "post_processor single has an unknown item " + item.dump());
    const std::string name = item["SpecialToken"].value("id", "");
    std::vector<int32_t> ids;
    if (specials.contains(name) && specials[name].contains("ids")) {
      for (const Json& id : specials[name]["ids"]) ids.push_back(id.get<int32_t>());
    } else if (auto id = token_id(name); id.has_value()) {
      ids.push_back(*id);
    } else {
      return Invalid(where,
                     "post_processor special token \"" + name + "\" is not in the vocabulary");
    }
    auto& dst = seen_a ? *suffix : *prefix;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  if (!seen_a) return Invalid(where, "post_processor single has no $A");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(absl::string_view json_text,
                                                                   const std::string& where) {
  Json j = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(where, "not a JSON object");
  // "truncation" and "padding" are ignored as transformers ignores them when it encodes a prompt.
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  ASSIGN_OR_RETURN(t->model_, ReadModel(j.value("model", Json()), where));
  ASSIGN_OR_RETURN(t->text_, TextPipeline::Create(j.value("normalizer", Json()),
                                                  j.value("pre_tokenizer", Json())));
  ASSIGN_OR_RETURN(t->decoder_, TokenDecoder::Create(j.value("decoder", Json())));
  t->vocab_size_ = t->model_.size();
  for (const Json& a : j.value("added_tokens", Json::array())) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return Invalid(where, "an added token lacks an integer id or a content string");
    }
    AddedToken tok{
        a["content"].get<std::string>(), a["id"].get<int32_t>(),
        a.value("special", false),       a.value("normalized", !a.value("special", false)),
        a.value("lstrip", false),        a.value("rstrip", false),
        a.value("single_word", false),   ""};
    if (tok.id < 0) return Invalid(where, "added token \"" + tok.content + "\" has a negative id");
    if (tok.content.empty())
      return Invalid(where, absl::StrCat("added token ", tok.id, " is empty"));
    tok.match = tok.content;
    if (tok.normalized) RETURN_IF_ERROR(t->text_.Normalize(&tok.match));  // matched normalized
    if (tok.match.empty())
      return Invalid(where, absl::StrCat("added token ", tok.id, " normalizes to nothing"));
    t->vocab_size_ = std::max(t->vocab_size_, tok.id + 1);
    t->added_by_id_[tok.id] = t->added_.size();
    t->added_by_byte_[tok.normalized][static_cast<unsigned char>(tok.match[0])].push_back(
        t->added_.size());
    t->added_.push_back(std::move(tok));
  }
  const HfTokenizer* self = t.get();
  RETURN_IF_ERROR(ReadPostProcessor(
      j.value("post_processor", Json()), where,
      [self](const std::string& name) { return self->TokenId(name); }, &t->prefix_, &t->suffix_));
  return t;
}

std::optional<int32_t> HfTokenizer::TokenId(absl::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }  // a linear scan: only chat templates and loading ask
  const int32_t id = model_.Find(token);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

std::vector<HfTokenizer::Part> HfTokenizer::SplitAdded(std::vector<Part> parts,
                                                       bool normalized) const {
  std::vector<Part> out;
  for (Part& part : parts) {
    if (part.added_id >= 0) {
      out.push_back(std::move(part));
      continue;
    }
    const std::string& s = part.piece.text;
    size_t emitted = 0;  // end of the last part pushed
    auto push_text = [&](size_t end) {
      if (end > emitted)
        out.push_back(
            {{s.substr(emitted, end - emitted), part.piece.at_start && emitted == 0}, -1});
    };
    for (size_t i = 0; i < s.size();) {
      // The longest added token starting here (leftmost-longest, as the library's Aho-Corasick).
      const AddedToken* best = nullptr;
      for (size_t k : added_by_byte_[normalized][static_cast<unsigned char>(s[i])]) {
        const AddedToken& a = added_[k];
        if ((best == nullptr || a.match.size() > best->match.size()) &&
            s.compare(i, a.match.size(), a.match) == 0) {
          best = &a;
        }
      }
      size_t start = i, stop = i + (best ? best->match.size() : 0);
      bool ok = best != nullptr;
      if (ok && best->single_word) {  // not inside a word
        const bool word_before = start > 0 && CharAt(s, PrevCharStart(s, start)).alnum;
        const bool word_after = stop < s.size() && CharAt(s, stop).alnum;
        ok = !word_before && !word_after;
      }
      if (!ok) {
        i += CharAt(s, i).len;
        continue;
      }
      if (best->lstrip) {
        while (start > emitted && CharAt(s, PrevCharStart(s, start)).space)
          start = PrevCharStart(s, start);
      }
      if (best->rstrip) {
        while (stop < s.size() && CharAt(s, stop).space) stop += CharAt(s, stop).len;
      }
      push_text(start);
      out.push_back({{"", part.piece.at_start && start == 0}, best->id});
      emitted = i = stop;
    }
    push_text(s.size());
    if (s.empty())
      out.push_back(std::move(part));  // an empty text is still normalized (and dropped)
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(absl::string_view text,
                                                         bool add_special_tokens) const {
  if (auto bad = FirstInvalidUtf8(text); bad.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (byte offset ", *bad, ")"));
  }
  std::vector<Part> parts = SplitAdded({Part{{std::string(text), true}, -1}}, /*normalized=*/false);
  for (Part& p : parts) {
    if (p.added_id < 0) RETURN_IF_ERROR(text_.Normalize(&p.piece.text));
  }
  parts = SplitAdded(std::move(parts), /*normalized=*/true);
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_;
  for (Part& p : parts) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    if (p.piece.text.empty()) continue;
    ASSIGN_OR_RETURN(std::vector<TextPiece> words, text_.PreTokenize({std::move(p.piece)}));
    for (const TextPiece& w : words) model_.Tokenize(w.text, &ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

std::string HfTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (!(skip_special_tokens && added_[it->second].special))
        tokens.push_back(added_[it->second].content);
      continue;
    }
    const std::string& t = model_.Token(id);
    if (!t.empty()) tokens.push_back(t);  // an id the tokenizer does not know gives no text
  }
  return decoder_.Decode(std::move(tokens));
}

std::string HfTokenizer::TokenBytes(int32_t id) const {
  if (!decoder_.byte_level_only() || added_by_id_.count(id) > 0) return Decode(std::vector<int32_t>{id}, false);
  // The token's characters through the inverse of the byte-level alphabet.
  static const std::unordered_map<std::string, char> inverse = [] {
    std::unordered_map<std::string, char> m;
    const std::vector<std::string>& alphabet = ByteLevelAlphabet();
    for (size_t b = 0; b < alphabet.size(); ++b) m[alphabet[b]] = static_cast<char>(b);
    return m;
  }();
  const std::string& token = model_.Token(id);
  std::string out;
  for (size_t i = 0; i < token.size();) {
    size_t n = 1;
    while (i + n < token.size() && (static_cast<unsigned char>(token[i + n]) & 0xC0) == 0x80) ++n;
    auto it = inverse.find(token.substr(i, n));
    if (it == inverse.end()) return Decode(std::vector<int32_t>{id}, false);
    out += it->second;
    i += n;
  }
  return out;
}

}  // namespace moeserve
