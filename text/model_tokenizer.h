// Everything about text that a checkpoint brings: its tokenizer (tokenizer.json, else
// tokenizer.model), the ids that end a generation (generation_config.json's eos_token_id, an
// int or a list, else config.json's), the BOS, and the chat template (tokenizer_config.json's
// chat_template, or chat_template.jinja beside it) with the bos/eos token strings it may use.
// moeserve's own checkpoints and presets use the byte tokenizer (text/tokenizer.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja_template.h"
#include "text/tokenizer.h"

namespace moeserve {

struct ModelTokenizer {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::vector<int32_t> eos_ids;  // generation stops at any of them (unless ignore_eos)
  std::optional<int32_t> bos_id;
  std::string chat_template;                    // Jinja source; empty: moeserve's ChatML rendering
  std::shared_ptr<const jinja::Template> chat;  // chat_template parsed (null when empty)
  std::string bos_token, eos_token;             // as a chat template names them
  std::string source;                           // e.g. "tokenizer.json", for logs and GetModelInfo

  // The byte tokenizer (as the tokenizer.json make-model writes) with EOS 257, BOS 256 and no
  // template.
  static ModelTokenizer Bytes();
  // Reads `dir`'s files; a directory without tokenizer files (moeserve's own checkpoints)
  // gets the byte tokenizer when config.json names its BOS/EOS (256/257). Ids past
  // `model_vocab` are refused: the model could not produce or read them.
  static absl::StatusOr<ModelTokenizer> FromDirectory(const std::string& dir, int64_t model_vocab);
  // vLLM's --skip-tokenizer-init: no tokenizer files read; requests bring token ids and get
  // token ids back (text is empty). EOS ids still come from generation_config.json or
  // config.json in `dir` (none for a preset).
  static absl::StatusOr<ModelTokenizer> IdsOnly(const std::string& dir, int64_t model_vocab);

  // False with IdsOnly: nothing can be encoded or decoded.
  bool has_text() const { return !ids_only; }
  bool ids_only = false;

  bool IsEos(int32_t id) const;
  // Parses `source` as the chat template (a template using what the Jinja subset does not
  // implement is refused, naming it).
  absl::Status SetChatTemplate(std::string source, const std::string& where);
  std::string Describe() const;
};

}  // namespace moeserve
