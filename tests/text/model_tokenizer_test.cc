// ModelTokenizer::FromDirectory: which files of a checkpoint decide the tokenizer, the EOS ids,
// the BOS and the chat template, and what is refused (by name).
#include "text/model_tokenizer.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_files.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

class ModelTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("model_tokenizer_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  void CopyFixture(const std::string& tokenizer, const std::string& file) {
    fs::copy_file(
        fs::path(MOESERVE_SOURCE_DIR) / "tests/models/fixtures/tokenizers" / tokenizer / file,
        dir_ / file);
  }
  fs::path dir_;
};

TEST_F(ModelTokenizerTest, TokenizerJsonWithGenerationConfigEosListAndChatTemplate) {
  CopyFixture("qwen", "tokenizer.json");
  Write("config.json", R"({"eos_token_id": 3, "bos_token_id": null})");
  Write("generation_config.json", R"({"eos_token_id": [1, 2]})");
  Write(
      "tokenizer_config.json",
      R"({"eos_token": {"content": "<|im_end|>"}, "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "tokenizer.json");
  EXPECT_EQ(t->eos_ids, (std::vector<int32_t>{1, 2})) << "generation_config.json comes first";
  EXPECT_TRUE(t->IsEos(2));
  EXPECT_FALSE(t->bos_id.has_value());
  EXPECT_EQ(t->eos_token, "<|im_end|>");
  ASSERT_NE(t->chat, nullptr);
  auto text = t->chat->Render(
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_F(ModelTokenizerTest, EosFallsBackToConfigThenToTheEosToken) {
  CopyFixture("qwen", "tokenizer.json");
  Write("config.json", R"({"eos_token_id": 7})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->eos_ids, std::vector<int32_t>{7});
  fs::remove(dir_ / "config.json");
  Write("tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->eos_ids.size(), 1u);
  EXPECT_EQ(t->eos_ids[0], *t->tokenizer->TokenId("<|im_end|>"));
}

TEST_F(ModelTokenizerTest, SentencepieceWithAddBosFromTokenizerConfig) {
  CopyFixture("sentencepiece", "tokenizer.model");
  Write("tokenizer_config.json", R"({"add_bos_token": false})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 600);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "tokenizer.model");
  auto ids = t->tokenizer->Encode("hello", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_NE(ids->front(), 1) << "add_bos_token false";
}

TEST_F(ModelTokenizerTest, OwnCheckpointsUseTheByteTokenizerAndOthersAreRefused) {
  Write("config.json", R"({"eos_token_id": 257, "bos_token_id": 256})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 300);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->eos_ids, std::vector<int32_t>{ByteTokenizer::kEos});
  Write("config.json", R"({"eos_token_id": 2})");
  t = ModelTokenizer::FromDirectory(dir_.string(), 300);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no tokenizer.json or tokenizer.model"), std::string::npos)
      << t.status();
}

TEST_F(ModelTokenizerTest, BadFilesAreRefusedByName) {
  CopyFixture("qwen", "tokenizer.json");
  Write("generation_config.json", R"({"eos_token_id": 99999})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("eos_token_id 99999 is outside the model's vocabulary"),
            std::string::npos)
      << t.status();
  Write("generation_config.json", R"({"eos_token_id": "x"})");
  t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("generation_config.json: eos_token_id must be"),
            std::string::npos)
      << t.status();
  fs::remove(dir_ / "generation_config.json");
  Write("tokenizer_config.json", R"({"chat_template": "{% macro x() %}{% endmacro %}"})");
  t = ModelTokenizer::FromDirectory(dir_.string(), 5000);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("{% macro %} is not supported"), std::string::npos)
      << t.status();
}

// make-model's tokenizer.json is the byte tokenizer: the same ids for every fixture string, and
// its chat template gives the prompt moeserve renders for template-less models.
TEST_F(ModelTokenizerTest, MakeModelsTokenizerFilesAreTheByteTokenizer) {
  ASSERT_TRUE(WriteByteTokenizerFiles(dir_.string()).ok());
  Write("config.json", R"({"eos_token_id": 257, "bos_token_id": 256})");
  auto t = ModelTokenizer::FromDirectory(dir_.string(), 300);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "tokenizer.json");
  EXPECT_EQ(t->eos_ids, std::vector<int32_t>{ByteTokenizer::kEos});
  std::ifstream in(fs::path(MOESERVE_SOURCE_DIR) /
                   "tests/models/fixtures/tokenizers/gpt2/expected.jsonl");
  std::string line;
  int n = 0, wrong = 0;
  while (std::getline(in, line)) {
    const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    auto ids = t->tokenizer->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    if (*ids != ByteTokenizer::Bytes(text, true) || t->tokenizer->Decode(*ids, true) != text)
      ++wrong;
    ++n;
  }
  EXPECT_GT(n, 1000);
  EXPECT_EQ(wrong, 0);
  ASSERT_NE(t->chat, nullptr);
  auto chat = t->chat->Render({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                               {"add_generation_prompt", true},
                               {"bos_token", t->bos_token},
                               {"eos_token", t->eos_token}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto ids = t->tokenizer->Encode(*chat, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids,
            ByteTokenizer::Bytes("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", true));
}

}  // namespace
}  // namespace moeserve
