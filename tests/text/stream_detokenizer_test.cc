// StreamDetokenizer against whole decoding (which the tokenizer tests hold to Hugging Face's):
// for every fixture tokenizer, each string's ids are split into a prompt and a generation at a
// random point; the streamed pieces must be valid UTF-8 and add up to what decoding everything
// gives past the prompt's text.
#include "text/stream_detokenizer.h"

#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "text/hf_tokenizer.h"
#include "text/sp_tokenizer.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

std::string Fixture(const std::string& name) {
  return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/tokenizers/" + name;
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  if (name == "sentencepiece")
    return *SentencePieceTokenizer::FromFile(Fixture(name) + "/tokenizer.model");
  return *HfTokenizer::FromFile(Fixture(name) + "/tokenizer.json");
}

class StreamDetokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDetokenizerTest, PiecesAreWholeCharactersAndAddUpToTheDecodedText) {
  std::unique_ptr<Tokenizer> tok = Load(GetParam());
  std::ifstream in(Fixture(GetParam() == "bytes" ? "gpt2" : GetParam()) + "/expected.jsonl");
  ASSERT_TRUE(in.good());
  std::mt19937 rng(std::random_device{}());
  int checked = 0, wrong = 0, split = 0;
  std::string line;
  while (std::getline(in, line)) {
    const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    auto ids = tok->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    if (ids->size() < 2) continue;
    const size_t cut = 1 + rng() % (ids->size() - 1);
    const std::vector<int32_t> prompt(ids->begin(), ids->begin() + static_cast<ptrdiff_t>(cut));
    const std::string before = tok->Decode(prompt, true);
    const std::string all = tok->Decode(*ids, true);
    if (all.compare(0, before.size(), before) != 0) continue;  // the cut splits a character
    const std::string want = all.substr(before.size());
    StreamDetokenizer stream(tok.get(), prompt);
    std::string got;
    for (size_t i = cut; i < ids->size(); ++i) {
      const std::string piece = stream.Push((*ids)[i]);
      if (FirstInvalidUtf8(piece).has_value()) ++split;
      got += piece;
    }
    got += stream.Flush();
    ++checked;
    if (got != want && ++wrong <= 5) {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << " cut at " << cut << ": streamed "
                    << nlohmann::json(got).dump() << " want " << nlohmann::json(want).dump();
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_EQ(wrong, 0) << "of " << checked;
  EXPECT_EQ(split, 0) << "pieces that were not valid UTF-8";
}

// Random ids, invalid byte sequences and special tokens included: every piece is valid UTF-8.
TEST(StreamDetokenizerFuzzTest, RandomBytesNeverGiveInvalidUtf8) {
  ByteTokenizer tok;
  std::mt19937 rng(std::random_device{}());
  int bad = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<int32_t> prompt(1 + rng() % 8);
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % 262);
    StreamDetokenizer stream(&tok, prompt);
    for (int i = 0; i < 30; ++i) {
      const int32_t id = static_cast<int32_t>(rng() % 4 == 0 ? 0xC0 + rng() % 0x30 : rng() % 262);
      if (FirstInvalidUtf8(stream.Push(id)).has_value()) ++bad;
    }
    if (FirstInvalidUtf8(stream.Flush()).has_value()) ++bad;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StreamDetokenizerTest,
                         ::testing::Values("bytes", "gpt2", "qwen", "llama", "mistral",
                                           "sentencepiece"));

}  // namespace
}  // namespace moeserve
