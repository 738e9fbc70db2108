// Python's str operations and the builtins' argument helpers.
#include "text/jinja_helpers.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace moeserve::jinja {
namespace {

// Case mapping per code point (utf8proc), as Python's str methods do it (no multi-character
// mappings such as "ß".upper() == "SS"). Invalid UTF-8 bytes are kept.
template <typename Map>
std::string MapCase(const std::string& s, Map map) {
  std::string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  bool prev_cased = false;
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {
      out += static_cast<char>(*p);
      ++p;
      --left;
      prev_cased = false;
      continue;
    }
    const utf8proc_category_t cat = utf8proc_category(cp);
    const bool cased =
        cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
    utf8proc_uint8_t buf[4];
    out.append(reinterpret_cast<const char*>(buf),
               static_cast<size_t>(utf8proc_encode_char(map(cp, prev_cased), buf)));
    prev_cased = cased;
    p += n;
    left -= n;
  }
  return out;
}
}  // namespace

absl::Status TypeError(absl::string_view what, const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat(what, " does not apply to ", v.TypeName()));
}

const Value* Kwarg(const Kwargs& kwargs, absl::string_view key) {
  for (const auto& [k, v] : kwargs) {
    if (k == key) return &v;
  }
  return nullptr;
}
const Value* Arg(const Args& args, size_t i, const Kwargs& kwargs, absl::string_view key) {
  if (i < args.size()) return &args[i];
  return Kwarg(kwargs, key);
}

absl::StatusOr<std::string> Str(const Value& v, absl::string_view what) {
  if (!v.is_string()) return TypeError(what, v);
  return v.str();
}

std::string Strip(const std::string& s, absl::string_view chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && chars.find(s[b]) != absl::string_view::npos) ++b;
  }
  if (right) {
    while (e > b && chars.find(s[e - 1]) != absl::string_view::npos) --e;
  }
  return s.substr(b, e - b);
}

std::string Upper(const std::string& s) {
  return MapCase(s, [](utf8proc_int32_t c, bool) { return utf8proc_toupper(c); });
}
std::string Lower(const std::string& s) {
  return MapCase(s, [](utf8proc_int32_t c, bool) { return utf8proc_tolower(c); });
}
std::string Title(const std::string& s) {
  return MapCase(s, [](utf8proc_int32_t c, bool prev_cased) {
    return prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
  });
}
std::string Capitalize(const std::string& s) {
  bool first = true;
  return MapCase(s, [&](utf8proc_int32_t c, bool) {
    const utf8proc_int32_t r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
    first = false;
    return r;
  });
}
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0)
      n = 4;
    else if (c >= 0xE0)
      n = 3;
    else if (c >= 0xC0)
      n = 2;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Value Pairs(const Dict& d) {
  List out;
  for (const auto& [k, v] : d.items) out.push_back(Value(List{Value(k), v}));
  return Value(std::move(out));
}

Value GetAttr(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur.is_dict()) return Value::Undef(key);
    const Value* next = cur.dict().Find(key);
    if (next == nullptr) return Value::Undef(key);
    cur = *next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Python's slice indices for a sequence of length n.
std::vector<size_t> SliceIndices(int64_t n, const Value& a, const Value& b, const Value& c) {
  const int64_t step = c.is_int() ? c.as_int() : 1;
  std::vector<size_t> out;
  if (step == 0) return out;
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!v.is_int()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(a, step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(b, step > 0 ? n : -1);
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    out.push_back(static_cast<size_t>(i));
  return out;
}

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, size_t max_string_bytes) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("unsupported operand types for ", op, ": '",
                                                   a.TypeName(), "' and '", b.TypeName(), "'"));
  };
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", a.is_undefined() ? a.undefined_name() : b.undefined_name(), "' is undefined"));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
    if (a.is_list() && b.is_list()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value(std::move(out));
    }
  }
  if (op == "*" && ((a.is_string() && b.is_int()) || (a.is_int() && b.is_string()))) {
    const std::string& s = a.is_string() ? a.str() : b.str();
    std::string out;
    for (int64_t i = 0, n = a.is_int() ? a.as_int() : b.as_int(); i < n && out.size() < max_string_bytes;
         ++i)
      out += s;
    return Value(std::move(out));
  }
  const bool numeric = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  if (!numeric) return bad();
  auto num = [](const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); };
  auto integer = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  const bool ints = !a.is_float() && !b.is_float();
  const double x = num(a), y = num(b);
  if (op == "+") return ints ? Value(integer(a) + integer(b)) : Value(x + y);
  if (op == "-") return ints ? Value(integer(a) - integer(b)) : Value(x - y);
  if (op == "*") return ints ? Value(integer(a) * integer(b)) : Value(x * y);
  if (op == "**")
    return ints && integer(b) >= 0 ? Value(static_cast<int64_t>(std::pow(x, y)))
                                   : Value(std::pow(x, y));
  if (y == 0) return absl::InvalidArgumentError("division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") {
    if (ints) {
      const int64_t p = integer(a), q = integer(b);
      return Value(p / q - ((p % q != 0) && ((p < 0) != (q < 0)) ? 1 : 0));
    }
    return Value(std::floor(x / y));
  }
  if (op == "%") {
    if (ints) {
      const int64_t p = integer(a), q = integer(b);
      const int64_t r = p % q;
      return Value(r != 0 && ((r < 0) != (q < 0)) ? r + q : r);
    }
    return Value(x - y * std::floor(x / y));
  }
  return bad();
}

}  // namespace moeserve::jinja
