// SentencePieceTokenizer (Debian's libsentencepiece, loaded as a module) against the Python
// sentencepiece package: the ids and texts it produced for 1718 strings with a tokenizer.model
// in Llama-2's settings (scripts/make-sp-fixture.py) must be reproduced exactly.
#include "text/sp_tokenizer.h"

#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

using Json = nlohmann::json;

std::string FixtureDir() {
  return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/tokenizers/sentencepiece";
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

TEST(SentencePieceTokenizerTest, MatchesThePythonPackageOnEveryString) {
  auto tok = SentencePieceTokenizer::FromFile(FixtureDir() + "/tokenizer.model");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 600);
  std::ifstream in(FixtureDir() + "/expected.jsonl");
  ASSERT_TRUE(in.good());
  int lines = 0, wrong = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++lines;
    const Json e = Json::parse(line);
    const std::string text = e["text"].get<std::string>();
    const auto want = e["ids"].get<std::vector<int32_t>>();
    auto got = (*tok)->Encode(text, false);
    ASSERT_TRUE(got.ok()) << got.status();
    auto got_bos = (*tok)->Encode(text, true);
    ASSERT_TRUE(got_bos.ok()) << got_bos.status();
    const std::string decoded = (*tok)->Decode(*got, /*skip_special_tokens=*/true);
    const bool ok = *got == want && *got_bos == e["ids_with_special"].get<std::vector<int32_t>>() &&
                    decoded == e["decoded_plain"].get<std::string>();
    if (!ok && ++wrong <= 5) {
      ADD_FAILURE() << e["text"].dump() << ": ids " << Show(*got) << " want " << Show(want)
                    << "; decoded " << Json(decoded).dump() << " want "
                    << e["decoded_plain"].dump();
    }
  }
  EXPECT_EQ(lines, 1718);
  EXPECT_EQ(wrong, 0) << "of " << lines << " strings";
}

TEST(SentencePieceTokenizerTest, SpecialTokensAndBadInput) {
  auto tok = SentencePieceTokenizer::FromFile(FixtureDir() + "/tokenizer.model", true, true);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->TokenId("<s>"), 1);
  EXPECT_EQ((*tok)->TokenId("</s>"), 2);
  EXPECT_FALSE((*tok)->TokenId("no such piece").has_value());
  EXPECT_TRUE((*tok)->IsSpecial(1));
  auto ids = (*tok)->Encode("a</s>b", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(ids->back(), 2) << "add_eos";
  EXPECT_EQ((*tok)->Decode(*ids, false).find("</s>") != std::string::npos, true);
  EXPECT_EQ((*tok)->Decode(*ids, true).find("</s>"), std::string::npos);
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{5000}, true), "\xEF\xBF\xBD") << "out of range";
  EXPECT_FALSE((*tok)->Encode("\xff", false).ok());
  auto bad = SentencePieceTokenizer::FromFile(FixtureDir() + "/expected.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a sentencepiece model"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace moeserve
