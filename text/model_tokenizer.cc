// ModelTokenizer: a checkpoint directory's tokenizer files.
#include "text/model_tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/status.h"
#include "text/hf_tokenizer.h"
#include "text/sp_tokenizer.h"
#include "text/tokenizer_files.h"

namespace moeserve {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The JSON object in `dir/name`, or an empty object when the file is absent.
absl::StatusOr<Json> ReadJsonFile(const fs::path& dir, const char* name) {
  const fs::path p = dir / name;
  if (!fs::exists(p)) return Json::object();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(p.string()));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(p.string(), ": not a JSON object"));
  }
  return j;
}

// `key` as a list of token ids (an int or a list of ints); nullopt when absent or null.
absl::StatusOr<std::optional<std::vector<int32_t>>> ReadIds(const Json& j, const char* key,
                                                            const char* file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  std::vector<int32_t> ids;
  if (it->is_number_integer()) {
    ids.push_back(it->get<int32_t>());
  } else if (it->is_array() && !it->empty()) {
    for (const Json& v : *it) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": ", key, " must be a token id or a list of them, got ", it->dump()));
      }
      ids.push_back(v.get<int32_t>());
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", key, " must be a token id or a list of them, got ", it->dump()));
  }
  return ids;
}

// A token written as "…" or as {"content": "…", ...} (an AddedToken).
std::string TokenString(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

absl::StatusOr<bool> ReadFlag(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer_config.json: ", key, " must be true or false, got ", it->dump()));
  }
  return it->get<bool>();
}

// tokenizer_config.json's chat_template: a string, or a list of named templates ("default").
absl::StatusOr<std::string> ChatTemplate(const Json& config, const fs::path& dir) {
  auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) return it->get<std::string>();
  if (it != config.end() && it->is_array()) {
    for (const Json& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        return t["template"].get<std::string>();
      }
    }
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template is a list without a \"default\" template");
  }
  if (it != config.end() && !it->is_null()) {
    return absl::InvalidArgumentError("tokenizer_config.json: chat_template must be a string");
  }
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) return ReadFileToString(jinja.string());
  return std::string();
}

}  // namespace

ModelTokenizer ModelTokenizer::Bytes() {
  ModelTokenizer t;
  // The tokenizer.json make-model writes: the byte tokenizer's ids, and "<bos>", "<eos>",
  // "<pad>" in a text (a chat template's output) are the special tokens, as in transformers.
  // Parsed once per process (it is immutable) rather than per ServiceOptions.
  static const std::shared_ptr<const Tokenizer> bytes = [] {
    auto hf = HfTokenizer::FromJson(ByteTokenizerJson(), "moeserve's byte tokenizer.json");
    MS_CHECK(hf.ok());
    return std::shared_ptr<const Tokenizer>(*std::move(hf));
  }();
  t.tokenizer = bytes;
  t.eos_ids = {ByteTokenizer::kEos};
  t.bos_id = ByteTokenizer::kBos;
  t.bos_token = "<bos>";
  t.eos_token = "<eos>";
  t.source = "moeserve byte tokenizer";
  return t;
}

namespace {

// No vocabulary: encoding is refused, decoding gives no text.
class IdsOnlyTokenizer final : public Tokenizer {
 public:
  explicit IdsOnlyTokenizer(int32_t vocab) : vocab_(vocab) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view, bool) const override {
    return absl::InvalidArgumentError(
        "the server runs without a tokenizer (--skip-tokenizer-init): send token ids, not text");
  }
  std::string Decode(absl::Span<const int32_t>, bool) const override { return ""; }
  std::optional<int32_t> TokenId(absl::string_view) const override { return std::nullopt; }
  bool IsSpecial(int32_t) const override { return false; }
  int32_t vocab_size() const override { return vocab_; }

 private:
  int32_t vocab_;
};

// EOS ids as generate() takes them: generation_config.json's, else config.json's.
absl::StatusOr<std::vector<int32_t>> EosIds(const fs::path& dir, int64_t model_vocab) {
  ASSIGN_OR_RETURN(Json gen_config, ReadJsonFile(dir, "generation_config.json"));
  ASSIGN_OR_RETURN(Json config, ReadJsonFile(dir, "config.json"));
  ASSIGN_OR_RETURN(auto eos, ReadIds(gen_config, "eos_token_id", "generation_config.json"));
  if (!eos) {
    ASSIGN_OR_RETURN(eos, ReadIds(config, "eos_token_id", "config.json"));
  }
  for (int32_t id : eos.value_or(std::vector<int32_t>())) {
    if (id < 0 || id >= model_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": eos_token_id ", id,
                                                     " is outside the model's vocabulary [0, ", model_vocab, ")"));
    }
  }
  return eos.value_or(std::vector<int32_t>());
}

}  // namespace

absl::StatusOr<ModelTokenizer> ModelTokenizer::IdsOnly(const std::string& dir, int64_t model_vocab) {
  ModelTokenizer t;
  t.tokenizer = std::make_shared<IdsOnlyTokenizer>(static_cast<int32_t>(model_vocab));
  t.ids_only = true;
  t.source = "none (--skip-tokenizer-init: token ids in and out)";
  if (!dir.empty() && fs::is_directory(dir)) {
    ASSIGN_OR_RETURN(t.eos_ids, EosIds(fs::path(dir), model_vocab));
  }
  return t;
}

absl::StatusOr<ModelTokenizer> ModelTokenizer::FromDirectory(const std::string& dir_name,
                                                             int64_t model_vocab) {
  const fs::path dir(dir_name);
  ASSIGN_OR_RETURN(Json tok_config, ReadJsonFile(dir, "tokenizer_config.json"));
  ASSIGN_OR_RETURN(Json gen_config, ReadJsonFile(dir, "generation_config.json"));
  ASSIGN_OR_RETURN(Json config, ReadJsonFile(dir, "config.json"));
  ModelTokenizer t;
  if (fs::exists(dir / "tokenizer.json")) {
    ASSIGN_OR_RETURN(auto hf, HfTokenizer::FromFile((dir / "tokenizer.json").string()));
    t.tokenizer = std::move(hf);
    t.source = "tokenizer.json";
  } else if (fs::exists(dir / "tokenizer.model")) {
    ASSIGN_OR_RETURN(bool add_bos, ReadFlag(tok_config, "add_bos_token", true));
    ASSIGN_OR_RETURN(bool add_eos, ReadFlag(tok_config, "add_eos_token", false));
    ASSIGN_OR_RETURN(auto sp, SentencePieceTokenizer::FromFile((dir / "tokenizer.model").string(),
                                                               add_bos, add_eos));
    t.tokenizer = std::move(sp);
    t.source = "tokenizer.model";
  } else {
    // moeserve's own checkpoints: the byte tokenizer, whose ids config.json must agree with.
    ModelTokenizer bytes = Bytes();
    for (const auto& [key, want] : {std::pair{"eos_token_id", ByteTokenizer::kEos},
                                    std::pair{"bos_token_id", ByteTokenizer::kBos}}) {
      ASSIGN_OR_RETURN(auto ids, ReadIds(config, key, "config.json"));
      if (ids && (ids->size() != 1 || (*ids)[0] != want)) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir_name, ": no tokenizer.json or tokenizer.model, and config.json's ",
                         key, " ", config[key].dump(), " is not the byte tokenizer's (", want,
                         "); add the checkpoint's tokenizer files"));
      }
    }
    return bytes;
  }
  t.bos_token = TokenString(tok_config, "bos_token");
  t.eos_token = TokenString(tok_config, "eos_token");
  ASSIGN_OR_RETURN(std::string chat_template, ChatTemplate(tok_config, dir));
  RETURN_IF_ERROR(t.SetChatTemplate(std::move(chat_template), dir_name));

  // EOS: generation_config.json first (what generate() uses), then config.json, then the
  // tokenizer's eos_token.
  ASSIGN_OR_RETURN(t.eos_ids, EosIds(dir, model_vocab));
  if (t.eos_ids.empty() && !t.eos_token.empty()) {
    if (std::optional<int32_t> id = t.tokenizer->TokenId(t.eos_token)) t.eos_ids = {*id};
  }
  ASSIGN_OR_RETURN(auto bos, ReadIds(gen_config, "bos_token_id", "generation_config.json"));
  if (!bos) {
    ASSIGN_OR_RETURN(bos, ReadIds(config, "bos_token_id", "config.json"));
  }
  if (bos && !bos->empty()) t.bos_id = (*bos)[0];
  for (int32_t id : t.eos_ids) {
    if (id < 0 || id >= model_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(dir_name, ": eos_token_id ", id,
                                                     " is outside the model's vocabulary [0, ",
                                                     model_vocab, ")"));
    }
  }
  // A template that names the tokens by string needs them even when the config gives ids only.
  if (t.eos_token.empty() && !t.eos_ids.empty()) {
    t.eos_token = t.tokenizer->Decode(std::vector<int32_t>{t.eos_ids[0]}, false);
  }
  if (t.bos_token.empty() && t.bos_id) {
    t.bos_token = t.tokenizer->Decode(std::vector<int32_t>{*t.bos_id}, false);
  }
  return t;
}

absl::Status ModelTokenizer::SetChatTemplate(std::string source, const std::string& where) {
  chat_template = std::move(source);
  chat = nullptr;
  if (chat_template.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const jinja::Template>> parsed =
      jinja::Template::Parse(chat_template);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the chat template cannot be used: ", parsed.status().message()));
  }
  chat = *std::move(parsed);
  return absl::OkStatus();
}

bool ModelTokenizer::IsEos(int32_t id) const {
  for (int32_t e : eos_ids) {
    if (e == id) return true;
  }
  return false;
}

std::string ModelTokenizer::Describe() const {
  return absl::StrCat(source, " (vocab ", tokenizer->vocab_size(), ", eos ",
                      eos_ids.empty() ? "none" : absl::StrJoin(eos_ids, ","),
                      chat_template.empty() ? ", no chat template" : ", chat template", ")");
}

}  // namespace moeserve
