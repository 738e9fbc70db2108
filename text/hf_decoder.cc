// tokenizer.json decoders with the semantics of the tokenizers library (version 0.22).
#include "text/hf_decoder.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/status.h"
#include "text/hf_text.h"
#include "text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace moeserve {
namespace {

using Json = nlohmann::json;
constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

std::string StrField(const Json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// The UTF-8 characters of `s`, one string each.
std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

absl::Status AddStep(const Json& j, std::vector<DecoderStep>* out) {
  const std::string type = StrField(j, "type", "");
  using K = DecoderStep::Kind;
  if (type == "Sequence") {
    for (const Json& d : j.value("decoders", Json::array())) RETURN_IF_ERROR(AddStep(d, out));
    return absl::OkStatus();
  }
  DecoderStep step{};
  if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
  } else if (type == "Replace") {
    step.kind = K::kReplace;
    const Json pattern = j.value("pattern", Json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        pattern["String"].get<std::string>().empty()) {
      return absl::UnimplementedError(
          "tokenizer.json: decoder Replace supports a non-empty {\"String\": ...} pattern only");
    }
    step.pattern = pattern["String"].get<std::string>();
    step.content = StrField(j, "content", "");
  } else if (type == "ByteFallback") {
    step.kind = K::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = K::kFuse;
  } else if (type == "Strip") {
    step.kind = K::kStrip;
    step.content = StrField(j, "content", " ");
    if (Chars(step.content).size() != 1) {
      return absl::InvalidArgumentError(
          "tokenizer.json: decoder Strip content must be one character");
    }
    step.start = j.value("start", 0);
    step.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.replacement = StrField(j, "replacement", "\xE2\x96\x81");
    const std::string scheme = StrField(j, "prepend_scheme", "");
    step.strip_first = scheme.empty() ? j.value("add_prefix_space", true) : scheme != "never";
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: decoder \"", type,
        "\" is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
        "Metaspace)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

std::vector<std::string> ByteLevelDecode(const std::vector<std::string>& tokens) {
  // The alphabet's characters back to their bytes: a constant table, built once.
  static const std::map<std::string, char>* const kByteOf = [] {
    auto* m = new std::map<std::string, char>;
    const auto& alphabet = ByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) (*m)[alphabet[static_cast<size_t>(b)]] = static_cast<char>(b);
    return m;
  }();
  const auto& byte_of = *kByteOf;
  std::string bytes;
  for (const std::string& t : tokens) {
    std::string mapped;
    bool all = true;
    for (const std::string& c : Chars(t)) {
      auto it = byte_of.find(c);
      if (it == byte_of.end()) {
        all = false;
        break;
      }
      mapped += it->second;
    }
    bytes += all ? mapped : t;  // a token outside the alphabet (an added token) stays as it is
  }
  return {Utf8Lossy(bytes)};
}

// "<0xNN>" -> the byte; -1 for any other token.
int FallbackByte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[static_cast<size_t>(k)];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::vector<std::string> ByteFallbackDecode(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;  // consecutive byte tokens
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (!FirstInvalidUtf8(run).has_value()) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run_tokens; ++k) out.push_back(kReplacementChar);  // one per byte
    }
    run.clear();
    run_tokens = 0;
  };
  for (const std::string& t : tokens) {
    const int b = FallbackByte(t);
    if (b >= 0) {
      run += static_cast<char>(b);
      ++run_tokens;
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

std::string Strip(const std::string& token, const DecoderStep& s) {
  const std::vector<std::string> chars = Chars(token);
  size_t begin = 0, end = chars.size();
  for (int k = 0; k < s.start && begin < end && chars[begin] == s.content; ++k) ++begin;
  for (int k = 0; k < s.stop && end > begin && chars[end - 1] == s.content; ++k) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += chars[i];
  return out;
}

}  // namespace

absl::StatusOr<TokenDecoder> TokenDecoder::Create(const Json& decoder) {
  TokenDecoder d;
  if (decoder.is_null()) return d;
  d.none_ = false;
  RETURN_IF_ERROR(AddStep(decoder, &d.steps_));
  return d;
}

std::string TokenDecoder::Decode(std::vector<std::string> tokens) const {
  if (none_) return absl::StrJoin(tokens, " ");
  using K = DecoderStep::Kind;
  for (const DecoderStep& s : steps_) {
    switch (s.kind) {
      case K::kByteLevel:
        tokens = ByteLevelDecode(tokens);
        break;
      case K::kReplace:
        for (std::string& t : tokens) t = absl::StrReplaceAll(t, {{s.pattern, s.content}});
        break;
      case K::kByteFallback:
        tokens = ByteFallbackDecode(tokens);
        break;
      case K::kFuse:
        tokens = {absl::StrJoin(tokens, "")};
        break;
      case K::kStrip:
        for (std::string& t : tokens) t = Strip(t, s);
        break;
      case K::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // Every replacement character of the first token is dropped (its prepended space).
          tokens[i] =
              absl::StrReplaceAll(tokens[i], {{s.replacement, i == 0 && s.strip_first ? "" : " "}});
        }
        break;
    }
  }
  return absl::StrJoin(tokens, "");
}

}  // namespace moeserve
