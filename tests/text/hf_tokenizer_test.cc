// HfTokenizer against the Hugging Face tokenizers package: for four tokenizer.json files in the
// forms the model families ship (GPT-2 and Qwen byte-level BPE, Llama-2 style normalizer with
// byte fallback, Mistral-style Metaspace), the ids and texts that the package produced for 1718
// strings (scripts/make-tokenizer-fixtures.py) must be reproduced exactly; plus the refusals.
#include "text/hf_tokenizer.h"

#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

using Json = nlohmann::json;

std::string FixtureDir(const std::string& name) {
  return std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/tokenizers/" + name;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

class HfTokenizerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerFixtureTest, MatchesTheReferenceOnEveryString) {
  auto tok = HfTokenizer::FromFile(FixtureDir(GetParam()) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in(FixtureDir(GetParam()) + "/expected.jsonl");
  ASSERT_TRUE(in.good());
  int lines = 0, wrong_ids = 0, wrong_special = 0, wrong_text = 0, wrong_skip = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++lines;
    const Json e = Json::parse(line);
    const std::string text = e["text"].get<std::string>();
    const auto want = e["ids"].get<std::vector<int32_t>>();
    const auto want_special = e["ids_with_special"].get<std::vector<int32_t>>();
    auto got = (*tok)->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(got.ok()) << got.status();
    if (*got != want && ++wrong_ids <= 5) {
      ADD_FAILURE() << "ids of " << e["text"].dump() << ": got " << Show(*got) << " want "
                    << Show(want);
    }
    auto got_special = (*tok)->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(got_special.ok()) << got_special.status();
    if (*got_special != want_special && ++wrong_special <= 5) {
      ADD_FAILURE() << "ids with special tokens of " << e["text"].dump() << ": got "
                    << Show(*got_special) << " want " << Show(want_special);
    }
    const std::string decoded = (*tok)->Decode(want, /*skip_special_tokens=*/false);
    if (decoded != e["decoded"].get<std::string>() && ++wrong_text <= 5) {
      ADD_FAILURE() << "decode of " << Show(want) << ": got " << Json(decoded).dump() << " want "
                    << e["decoded"].dump();
    }
    const std::string skipped = (*tok)->Decode(want_special, /*skip_special_tokens=*/true);
    if (skipped != e["decoded_skip_special"].get<std::string>() && ++wrong_skip <= 5) {
      ADD_FAILURE() << "decode skipping special tokens of " << Show(want_special) << ": got "
                    << Json(skipped).dump() << " want " << e["decoded_skip_special"].dump();
    }
  }
  EXPECT_GT(lines, 1000);
  EXPECT_EQ(wrong_ids, 0) << "of " << lines << " strings";
  EXPECT_EQ(wrong_special, 0) << "of " << lines << " strings";
  EXPECT_EQ(wrong_text, 0) << "of " << lines << " strings";
  EXPECT_EQ(wrong_skip, 0) << "of " << lines << " strings";
}

INSTANTIATE_TEST_SUITE_P(Families, HfTokenizerFixtureTest,
                         ::testing::Values("gpt2", "qwen", "llama", "mistral"));

// A minimal byte-level tokenizer.json, edited by each refusal case.
Json Minimal() {
  Json vocab = Json::object();
  vocab["a"] = 0;
  vocab["b"] = 1;
  vocab["ab"] = 2;
  return Json{
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", nullptr},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({Json::array({"a", "b"})})}}}};
}

TEST(HfTokenizerTest, MinimalMergesAndJoinsWithoutADecoder) {
  auto tok = HfTokenizer::FromJson(Minimal().dump(), "t");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("abab", false), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ((*tok)->Decode({2, 0}, false),
            "ab a");  // tokens joined with spaces, as the library does
  EXPECT_EQ((*tok)->vocab_size(), 3);
}

TEST(HfTokenizerTest, RefusesWhatItDoesNotImplementByName) {
  struct Case {
    const char* key;
    Json value;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}, "normalizer \"BertNormalizer\""},
      {"normalizer", {{"type", "Precompiled"}}, "normalizer \"Precompiled\""},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer \"Whitespace\""},
      {"decoder", {{"type", "WordPiece"}}, "decoder \"WordPiece\""},
      {"post_processor", {{"type", "Weird"}}, "post_processor \"Weird\""},
      {"model", {{"type", "Unigram"}, {"vocab", Json::array()}}, "model type \"Unigram\""},
  };
  for (const Case& c : cases) {
    Json j = Minimal();
    j[c.key] = c.value;
    auto tok = HfTokenizer::FromJson(j.dump(), "tok.json");
    ASSERT_FALSE(tok.ok()) << c.key;
    EXPECT_NE(std::string(tok.status().message()).find(c.needle), std::string::npos)
        << tok.status();
  }
  Json j = Minimal();
  j["model"]["dropout"] = 0.1;
  EXPECT_FALSE(HfTokenizer::FromJson(j.dump(), "t").ok());
  j = Minimal();
  j["model"]["merges"] = Json::array({Json::array({"a", "z"})});
  auto bad_merge = HfTokenizer::FromJson(j.dump(), "t");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(std::string(bad_merge.status().message()).find("merge 0"), std::string::npos);
  EXPECT_FALSE(HfTokenizer::FromJson("{not json", "t").ok());
}

TEST(HfTokenizerTest, InvalidUtf8IsAnErrorNotGarbage) {
  auto tok = HfTokenizer::FromFile(FixtureDir("gpt2") + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  auto ids = (*tok)->Encode("ok \xC3(", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(std::string(ids.status().message()).find("UTF-8"), std::string::npos);
}

TEST(HfTokenizerTest, AddedTokenOptionsStripAndWholeWords) {
  Json j = Minimal();
  j["added_tokens"] = Json::array({
      {{"id", 10},
       {"content", "<x>"},
       {"special", true},
       {"normalized", false},
       {"lstrip", true},
       {"rstrip", true},
       {"single_word", false}},
      {{"id", 11},
       {"content", "ab"},
       {"special", false},
       {"normalized", false},
       {"lstrip", false},
       {"rstrip", false},
       {"single_word", true}},
  });
  j["model"]["vocab"][" "] = 3;
  auto tok = HfTokenizer::FromJson(j.dump(), "t");
  ASSERT_TRUE(tok.ok()) << tok.status();
  // lstrip/rstrip take the spaces around "<x>"; "ab" inside a word is not the added token.
  EXPECT_EQ(*(*tok)->Encode("a  <x>  b", false), (std::vector<int32_t>{0, 10, 1}));
  EXPECT_EQ(*(*tok)->Encode("aab", false), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(*(*tok)->Encode("a ab", false), (std::vector<int32_t>{0, 3, 11}));
  EXPECT_TRUE((*tok)->IsSpecial(10));
  EXPECT_FALSE((*tok)->IsSpecial(11));
  EXPECT_EQ((*tok)->Decode({0, 10, 1}, true), "a b");
  EXPECT_EQ((*tok)->vocab_size(), 12);
}

}  // namespace
}  // namespace moeserve
