// UTF-8 characters on utf8proc (see utf8_chars.h).
#include "text/utf8_chars.h"

#include <utf8proc.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::StatusOr<std::string> UnicodeNormalize(const std::string& s, int options) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("text: ", utf8proc_errmsg(n)));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

CharInfo CharAt(absl::string_view s, size_t i) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  CharInfo info{n > 0 ? static_cast<size_t>(n) : 1, false, false};
  if (n <= 0) return info;
  const auto cat = utf8proc_category(cp);
  info.space = cp == '\t' || cp == '\n' || cp == 0x0B || cp == '\f' || cp == '\r' || cp == 0x85 ||
               cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
               cat == UTF8PROC_CATEGORY_ZP;
  info.alnum = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
               (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
  return info;
}

size_t PrevCharStart(absl::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

const std::vector<std::string>& ByteLevelAlphabet() {
  static const std::vector<std::string>* const kAlphabet = [] {
    auto* out = new std::vector<std::string>(256);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const utf8proc_int32_t cp = printable ? b : 256 + extra++;
      utf8proc_uint8_t buf[4];
      const auto n = utf8proc_encode_char(cp, buf);
      (*out)[static_cast<size_t>(b)].assign(reinterpret_cast<const char*>(buf),
                                            static_cast<size_t>(n));
    }
    return out;
  }();
  return *kAlphabet;
}

}  // namespace moeserve
