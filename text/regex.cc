// PCRE2 patterns for the tokenizers' normalizers and pre-tokenizers (see regex.h).
#include "text/regex.h"

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(absl::string_view pattern) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: regex \"", pattern,
                                                   "\" does not compile at offset ", at, ": ",
                                                   reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  return std::shared_ptr<const Regex>(new Regex(code));
}

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::Find(absl::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                               PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return absl::ResourceExhaustedError(
          absl::StrCat("tokenizer regex failed: ", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    out.emplace_back(ov[0], ov[1]);
    if (ov[1] > ov[0]) {
      pos = ov[1];
    } else {  // an empty match: step over one character, as Oniguruma's iterator does
      pos = ov[1] + 1;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return out;
}

}  // namespace moeserve
