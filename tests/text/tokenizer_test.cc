// ByteTokenizer and IncrementalDecoder: encoding, UTF-8 round trips, U+FFFD for invalid input,
// and streaming decode against whole-sequence decode, checked with an independent validator.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/tokenizer.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Independent UTF-8 validator (RFC 3629): decodes each code point and rejects bad leads,
// bad continuations, overlongs, surrogates and values past U+10FFFF.
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (b < 0x80) {
      len = 1;
      cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len]) return false;                   // overlong
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;     // surrogate
    if (cp > 0x10FFFF) return false;
    i += len;
  }
  return true;
}

std::string Hex(const std::string& s) {
  std::string out;
  for (unsigned char c : s) absl::StrAppendFormat(&out, "%02X ", c);
  return out;
}

std::vector<int32_t> BytesToIds(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

std::string Ascii(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x80) out.push_back(static_cast<char>(c));
  }
  return out;
}

TEST(Utf8ValidatorTest, SelfCheck) {
  // The validator the tests below rely on must itself reject what it should.
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xE2\x9C\x93 \xF0\x9F\x9A\x80"));
  EXPECT_TRUE(IsValidUtf8(kReplacement));
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(ByteTokenizerTest, EncodeAddsBosThenBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(ByteTokenizer::Bytes("hi", true), (std::vector<int32_t>{ByteTokenizer::kBos, 'h', 'i'}));
  EXPECT_EQ(ByteTokenizer::Bytes("hi", /*add_bos=*/false), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(ByteTokenizer::Bytes("", true), (std::vector<int32_t>{256}));
  EXPECT_EQ(ByteTokenizer::kBos, 256);
  // Bytes >= 0x80 are ids 128..255, never negative.
  EXPECT_EQ(ByteTokenizer::Bytes("\xC3\xA9", true), (std::vector<int32_t>{256, 0xC3, 0xA9}));
}

TEST(ByteTokenizerTest, DecodeInvertsEncode) {
  ByteTokenizer tok;
  const std::vector<std::string> texts = {
      "", "Hello, world!", "tabs\tand\nnewlines\r\n", std::string("nul\0byte", 8),
      "h\xC3\xA9llo w\xC3\xB6rld \xE2\x9C\x93 \xF0\x9F\x9A\x80",  // "héllo wörld ✓ 🚀"
      "\xE4\xB8\xAD\xE6\x96\x87",                                   // 中文
      "\xF4\x8F\xBF\xBF",                                           // U+10FFFF
  };
  for (const auto& t : texts) {
    const std::string got = tok.Decode(ByteTokenizer::Bytes(t, true));
    EXPECT_EQ(got, t) << "got " << Hex(got) << "want " << Hex(t);
    EXPECT_EQ(tok.Decode(ByteTokenizer::Bytes(t, false)), t);
  }
}

TEST(ByteTokenizerTest, SpecialIdsAreDropped) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.Decode({ByteTokenizer::kBos, 'a', ByteTokenizer::kEos, 'b', ByteTokenizer::kPad}), "ab");
  EXPECT_EQ(tok.Decode({ByteTokenizer::kPad, ByteTokenizer::kPad}), "");
  EXPECT_TRUE(ByteTokenizer::IsSpecialId(256));
  EXPECT_TRUE(ByteTokenizer::IsSpecialId(257));
  EXPECT_TRUE(ByteTokenizer::IsSpecialId(258));
  EXPECT_FALSE(ByteTokenizer::IsSpecialId(255));
  EXPECT_FALSE(ByteTokenizer::IsSpecialId(259));
}

TEST(ByteTokenizerTest, OutOfRangeIdsDecodeToReplacement) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.Decode({259}), kReplacement);
  EXPECT_EQ(tok.Decode({'a', 300, 'b'}), absl::StrCat("a", kReplacement, "b"));
  EXPECT_EQ(tok.Decode({1 << 30}), kReplacement);
  EXPECT_EQ(tok.Decode({-1}), kReplacement);
  EXPECT_EQ(tok.Decode({'x', -7, 'y'}), absl::StrCat("x", kReplacement, "y"));
}

TEST(ByteTokenizerTest, InvalidUtf8BecomesReplacement) {
  ByteTokenizer tok;
  struct Case {
    std::string name;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"lone continuation", "a\x80z"},
      {"overlong", "a\xC0\xAFz"},
      {"surrogate", "a\xED\xA0\x80z"},
      {"truncated at end", "a\xE2\x82"},
      {"truncated before ascii", "a\xE2\x82z"},
      {"invalid lead", "a\xFFz"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string got = tok.Decode(BytesToIds(c.bytes));
    EXPECT_TRUE(IsValidUtf8(got)) << "invalid output " << Hex(got);
    EXPECT_TRUE(absl::StrContains(got, kReplacement)) << "no U+FFFD in " << Hex(got);
    // ASCII around the bad bytes survives, in order.
    EXPECT_EQ(Ascii(got), Ascii(c.bytes)) << Hex(got);
    EXPECT_TRUE(absl::StartsWith(got, "a")) << Hex(got);
    // SanitizeUtf8 agrees with the decoder on raw bytes.
    EXPECT_EQ(SanitizeUtf8(c.bytes), got);
  }
  // A truncated tail is one replacement character.
  EXPECT_EQ(tok.Decode(BytesToIds("a\xE2\x82")), absl::StrCat("a", kReplacement));
}

TEST(ByteTokenizerTest, SanitizeKeepsValidText) {
  const std::string valid = "h\xC3\xA9llo \xE2\x9C\x93 \xF0\x9F\x9A\x80";
  EXPECT_EQ(SanitizeUtf8(valid), valid);
  EXPECT_EQ(SanitizeUtf8(""), "");
}

TEST(IncrementalDecoderTest, HoldsBackPartialCharacter) {
  const std::string rocket = "\xF0\x9F\x9A\x80";
  IncrementalDecoder dec;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(dec.Push(static_cast<unsigned char>(rocket[i])), "") << "byte " << i << " emitted early";
  }
  EXPECT_EQ(dec.Push(static_cast<unsigned char>(rocket[3])), rocket);
  EXPECT_EQ(dec.Flush(), "");
}

TEST(IncrementalDecoderTest, AsciiIsImmediateAndSpecialEndsPartial) {
  IncrementalDecoder dec;
  EXPECT_EQ(dec.Push('a'), "a");
  EXPECT_EQ(dec.Push(0xE2), "");
  EXPECT_EQ(dec.Push(0x82), "");
  // An EOS cannot complete the character: the partial sequence becomes U+FFFD.
  EXPECT_EQ(dec.Push(ByteTokenizer::kEos), kReplacement);
  EXPECT_EQ(dec.Push('b'), "b");
  EXPECT_EQ(dec.Push(0xC3), "");
  EXPECT_EQ(dec.Flush(), kReplacement) << "a truncated tail must not vanish";
  EXPECT_EQ(dec.Flush(), "");
}

// Expected decode built from an independent rule where it applies: runs of byte ids split by
// non-byte ids; a run that is valid UTF-8 decodes to itself, otherwise as SanitizeUtf8 says;
// special ids vanish and other non-byte ids are U+FFFD.
std::string ExpectedDecode(const std::vector<int32_t>& ids) {
  std::string out, run;
  auto end_run = [&] {
    out += IsValidUtf8(run) ? run : SanitizeUtf8(run);
    run.clear();
  };
  for (int32_t id : ids) {
    if (id >= 0 && id <= 255) {
      run.push_back(static_cast<char>(id));
      continue;
    }
    end_run();
    if (!ByteTokenizer::IsSpecialId(id)) out += kReplacement;
  }
  end_run();
  return out;
}

// UTF-8 bytes of a random valid code point (1 to 4 bytes).
std::string RandomCodePoint(std::mt19937& gen) {
  std::uniform_int_distribution<uint32_t> pick(0, 3);
  uint32_t cp;
  switch (pick(gen)) {
    case 0: cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(gen); break;
    case 1: cp = std::uniform_int_distribution<uint32_t>(0x80, 0x7FF)(gen); break;
    case 2:
      do {
        cp = std::uniform_int_distribution<uint32_t>(0x800, 0xFFFF)(gen);
      } while (cp >= 0xD800 && cp <= 0xDFFF);
      break;
    default: cp = std::uniform_int_distribution<uint32_t>(0x10000, 0x10FFFF)(gen); break;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

TEST(IncrementalDecoderTest, StreamingMatchesWholeDecodeOnRandomIds) {
  std::mt19937 gen(20240611);
  std::uniform_int_distribution<int> length(0, 40);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int32_t> byte_or_special(0, 258);
  std::uniform_int_distribution<int32_t> high(259, 300);
  ByteTokenizer tok;
  int with_replacement = 0, with_multibyte = 0;
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<int32_t> ids;
    const int n = length(gen);
    while (static_cast<int>(ids.size()) < n) {
      const int k = kind(gen);
      if (k <= 5) {
        ids.push_back(byte_or_special(gen));
      } else if (k <= 7) {
        for (unsigned char c : RandomCodePoint(gen)) ids.push_back(c);
      } else if (k == 8) {
        ids.push_back(high(gen));
      } else {
        ids.push_back(iter % 2 == 0 ? -1 : byte_or_special(gen));
      }
    }
    std::string trace;
    for (int32_t id : ids) absl::StrAppend(&trace, id, " ");
    SCOPED_TRACE(absl::StrCat("iteration ", iter, ", ids: ", trace));

    IncrementalDecoder dec;
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.Push(id);
      EXPECT_TRUE(IsValidUtf8(piece)) << "Push returned invalid UTF-8 " << Hex(piece);
      streamed += piece;
    }
    streamed += dec.Flush();
    const std::string whole = tok.Decode(ids);
    EXPECT_EQ(streamed, whole) << "streamed " << Hex(streamed) << "whole " << Hex(whole);
    EXPECT_TRUE(IsValidUtf8(whole)) << Hex(whole);
    EXPECT_EQ(whole, ExpectedDecode(ids)) << Hex(whole);
    // Every ASCII byte id survives, in order.
    std::string ascii_in;
    for (int32_t id : ids) {
      if (id >= 0 && id < 0x80) ascii_in.push_back(static_cast<char>(id));
    }
    EXPECT_EQ(Ascii(whole), ascii_in);
    if (absl::StrContains(whole, kReplacement)) ++with_replacement;
    for (size_t i = 0; i < whole.size(); ++i) {
      if (static_cast<unsigned char>(whole[i]) >= 0xC0 && whole.compare(i, 3, kReplacement) != 0) {
        ++with_multibyte;  // a multi-byte character other than U+FFFD passed through
        break;
      }
    }
  }
  // The random inputs exercised both the repair and the pass-through paths.
  EXPECT_GT(with_replacement, 20);
  EXPECT_GT(with_multibyte, 5);
}

}  // namespace
}  // namespace moeserve
