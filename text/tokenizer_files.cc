// Tokenizer files for moeserve's own checkpoints.
#include "text/tokenizer_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/status.h"
#include "text/hf_text.h"
#include "text/tokenizer.h"

namespace moeserve {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

Json Added(int id, const char* content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

std::string ByteTokenizerJson() {
  Json vocab = Json::object();
  const std::vector<std::string>& alphabet = ByteLevelAlphabet();
  for (int b = 0; b < 256; ++b) vocab[alphabet[static_cast<size_t>(b)]] = b;
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens",
             Json::array({Added(ByteTokenizer::kBos, "<bos>"), Added(ByteTokenizer::kEos, "<eos>"),
                          Added(ByteTokenizer::kPad, "<pad>")})},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", true},
              {"use_regex", false}}},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single", Json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
              {"pair", Json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
              {"special_tokens",
               {{"<bos>",
                 {{"id", "<bos>"},
                  {"ids", Json::array({ByteTokenizer::kBos})},
                  {"tokens", Json::array({"<bos>"})}}}}}}},
            {"decoder",
             {{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", true},
              {"use_regex", false}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", Json::array()}}}};
  return j.dump(2) + "\n";
}

std::string ByteTokenizerConfigJson() {
  Json j = {{"tokenizer_class", "PreTrainedTokenizerFast"},
            {"bos_token", "<bos>"},
            {"eos_token", "<eos>"},
            {"pad_token", "<pad>"},
            {"model_max_length", 1 << 20},
            {"clean_up_tokenization_spaces", false},
            {"chat_template", kChatTemplate}};
  return j.dump(2) + "\n";
}

std::string ByteGenerationConfigJson() {
  Json j = {{"bos_token_id", ByteTokenizer::kBos},
            {"eos_token_id", ByteTokenizer::kEos},
            {"pad_token_id", ByteTokenizer::kPad},
            {"do_sample", false}};
  return j.dump(2) + "\n";
}

absl::Status WriteByteTokenizerFiles(const std::string& dir) {
  const std::filesystem::path d(dir);
  RETURN_IF_ERROR(WriteFileAtomically((d / "tokenizer.json").string(), ByteTokenizerJson()));
  RETURN_IF_ERROR(
      WriteFileAtomically((d / "tokenizer_config.json").string(), ByteTokenizerConfigJson()));
  return WriteFileAtomically((d / "generation_config.json").string(), ByteGenerationConfigJson());
}

}  // namespace moeserve
