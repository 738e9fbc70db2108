// Jinja's filters and tests, Python's string and dict methods, and the global functions
// transformers gives chat templates.
#include "models/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve::jinja {
namespace {

constexpr const char* kFilters[] = {
    "trim",       "length",     "count",   "tojson", "string",  "upper", "lower",
    "title",      "capitalize", "replace", "join",   "first",   "last",  "default",
    "d",          "list",       "int",     "float",  "abs",     "items", "selectattr",
    "rejectattr", "select",     "reject",  "map",    "reverse", "safe",  "unique",
    "indent",     "round",      "sort",    "min",    "max"};
constexpr const char* kTests[] = {
    "defined", "undefined", "none",     "string", "number", "integer", "float", "boolean",
    "mapping", "sequence",  "iterable", "true",   "false",  "odd",     "even",  "divisibleby",
    "equalto", "eq",        "ne",       "sameas", "in",     "lower",   "upper", "callable"};
constexpr const char* kMethods[] = {"strip", "lstrip", "rstrip",  "split", "startswith", "endswith",
                                    "upper", "lower",  "replace", "title", "capitalize", "find",
                                    "get",   "items",  "keys",    "values"};
constexpr const char* kGlobals[] = {"raise_exception", "namespace", "range", "strftime_now"};
constexpr int64_t kMaxRange = 100000;
constexpr absl::string_view kWhitespace = " \t\n\r\v\f";

template <size_t N>
bool In(const std::string& name, const char* const (&list)[N]) {
  return std::find_if(std::begin(list), std::end(list), [&](const char* s) { return name == s; }) !=
         std::end(list);
}

absl::Status TypeError(absl::string_view what, const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat(what, " does not apply to ", v.TypeName()));
}

const Value* Kwarg(const Kwargs& kwargs, absl::string_view key) {
  for (const auto& [k, v] : kwargs) {
    if (k == key) return &v;
  }
  return nullptr;
}
// Positional argument i, else keyword `key`, else null.
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

// UTF-8 code points (Python's len and iteration over str).
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

// The attribute (dotted path) of an item, as selectattr and map read it.
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

absl::StatusOr<Value> Select(const Value& x, const Args& args, bool by_attr, bool keep) {
  ASSIGN_OR_RETURN(List items, Iterate(x));
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty() || !args[0].is_string())
      return absl::InvalidArgumentError("selectattr: an attribute name is needed");
    attr = args[0].str();
    i = 1;
  }
  List out;
  for (const Value& item : items) {
    const Value subject = by_attr ? GetAttr(item, attr) : item;
    bool pass = subject.Truthy();
    if (i < args.size()) {
      if (!args[i].is_string())
        return absl::InvalidArgumentError("select: the test must be named by a string");
      const std::string test = args[i].str();
      if (!IsKnownTest(test))
        return absl::InvalidArgumentError(absl::StrCat("test '", test, "' is not supported"));
      ASSIGN_OR_RETURN(
          pass,
          ApplyTest(test, subject, Args(args.begin() + static_cast<ptrdiff_t>(i) + 1, args.end())));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

}  // namespace

bool IsKnownFilter(const std::string& name) { return In(name, kFilters); }
bool IsKnownTest(const std::string& name) { return In(name, kTests); }
bool IsKnownMethod(const std::string& name) { return In(name, kMethods); }
bool IsKnownGlobal(const std::string& name) { return In(name, kGlobals); }

absl::StatusOr<List> Iterate(const Value& v) {
  if (v.is_undefined()) return List{};
  if (v.is_list()) return v.list();
  if (v.is_dict() && !v.dict().is_namespace) {
    List keys;
    for (const auto& [k, item] : v.dict().items) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) {
    List out;
    for (std::string& c : CodePoints(v.str())) out.push_back(Value(std::move(c)));
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& x) {
  if (container.is_string()) {
    if (!x.is_string())
      return absl::InvalidArgumentError("'in <string>' requires a string on the left");
    return container.str().find(x.str()) != std::string::npos;
  }
  if (container.is_dict()) {
    return x.is_string() && container.dict().Find(x.str()) != nullptr;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (v.Equals(x)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  return absl::InvalidArgumentError(
      absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& x, const Args& args) {
  auto arg = [&]() -> absl::StatusOr<Value> {
    if (args.empty())
      return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an argument"));
    return args[0];
  };
  if (name == "defined") return !x.is_undefined();
  if (name == "undefined") return x.is_undefined();
  if (name == "none") return x.is_none();
  if (name == "string") return x.is_string();
  if (name == "number") return x.is_number() || x.is_bool();
  if (name == "integer") return x.is_int();
  if (name == "float") return x.is_float();
  if (name == "boolean") return x.is_bool();
  if (name == "mapping") return x.is_dict() && !x.dict().is_namespace;
  if (name == "sequence" || name == "iterable")
    return x.is_list() || x.is_string() || (x.is_dict() && !x.dict().is_namespace);
  if (name == "true") return x.is_bool() && x.as_bool();
  if (name == "false") return x.is_bool() && !x.as_bool();
  if (name == "callable") return false;
  if (name == "lower") return x.is_string() && Lower(x.str()) == x.str();
  if (name == "upper") return x.is_string() && Upper(x.str()) == x.str();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!x.is_int()) return TypeError(absl::StrCat("test '", name, "'"), x);
    if (name == "divisibleby") {
      ASSIGN_OR_RETURN(Value n, arg());
      if (!n.is_int() || n.as_int() == 0)
        return absl::InvalidArgumentError("divisibleby needs a non-zero integer");
      return x.as_int() % n.as_int() == 0;
    }
    return (x.as_int() % 2 != 0) == (name == "odd");
  }
  ASSIGN_OR_RETURN(Value other, arg());
  if (name == "equalto" || name == "eq") return x.Equals(other);
  if (name == "ne") return !x.Equals(other);
  if (name == "in") return Contains(other, x);
  // sameas: Python's `is`, meaningful here for none, true and false.
  if (x.is_none() || other.is_none()) return x.is_none() && other.is_none();
  if (x.is_bool() || other.is_bool())
    return x.is_bool() && other.is_bool() && x.as_bool() == other.as_bool();
  return x.Equals(other);
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& x, const Args& args,
                                  const Kwargs& kwargs) {
  if (name == "default" || name == "d") {
    const Value* fallback = Arg(args, 0, kwargs, "default_value");
    const Value* boolean = Arg(args, 1, kwargs, "boolean");
    const bool use = x.is_undefined() || (boolean != nullptr && boolean->Truthy() && !x.Truthy());
    return use ? (fallback ? *fallback : Value("")) : x;
  }
  if (x.is_undefined() && name != "string" && name != "list" && name != "length" &&
      name != "count") {
    return absl::InvalidArgumentError(
        absl::StrCat("'", x.undefined_name(), "' is undefined (filter ", name, ")"));
  }
  if (name == "safe") return x;
  if (name == "string") return Value(x.ToString());
  if (name == "tojson") {
    const Value* indent = Arg(args, 0, kwargs, "indent");
    ASSIGN_OR_RETURN(
        std::string json,
        x.ToJson(indent && indent->is_int() ? static_cast<int>(indent->as_int()) : -1));
    return Value(std::move(json));
  }
  if (name == "length" || name == "count") {
    if (x.is_string()) return Value(static_cast<int64_t>(CodePoints(x.str()).size()));
    if (x.is_list()) return Value(static_cast<int64_t>(x.list().size()));
    if (x.is_dict()) return Value(static_cast<int64_t>(x.dict().items.size()));
    if (x.is_undefined()) return Value(0);
    return TypeError(absl::StrCat("filter ", name), x);
  }
  if (name == "trim") {
    ASSIGN_OR_RETURN(std::string s, Str(x, "filter trim"));
    const Value* chars = Arg(args, 0, kwargs, "chars");
    return Value(Strip(s, chars && chars->is_string() ? chars->str() : std::string(kWhitespace),
                       true, true));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    ASSIGN_OR_RETURN(std::string s, Str(x, absl::StrCat("filter ", name)));
    return Value(name == "upper"   ? Upper(s)
                 : name == "lower" ? Lower(s)
                 : name == "title" ? Title(s)
                                   : Capitalize(s));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string s, Str(x, "filter replace"));
    if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
      return absl::InvalidArgumentError("filter replace needs two strings");
    }
    const Value* count = Arg(args, 2, kwargs, "count");
    return Value(
        Replace(s, args[0].str(), args[1].str(), count && count->is_int() ? count->as_int() : -1));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    const Value* sep = Arg(args, 0, kwargs, "d");
    const Value* attr = Arg(args, 1, kwargs, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && sep) out += sep->ToString();
      out += (attr && attr->is_string() ? GetAttr(items[i], attr->str()) : items[i]).ToString();
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    if (items.empty()) return Value::Undef(absl::StrCat(name, " of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    return Value(std::move(items));
  }
  if (name == "reverse") {
    if (x.is_string()) {
      std::vector<std::string> cps = CodePoints(x.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    ASSIGN_OR_RETURN(List items, Iterate(x));
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    List out;
    for (const Value& v : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.Equals(v); }))
        out.push_back(v);
    }
    return Value(std::move(out));
  }
  if (name == "items") {
    if (!x.is_dict()) return TypeError("filter items", x);
    return Pairs(x.dict());
  }
  if (name == "int") {
    if (x.is_int()) return x;
    if (x.is_bool()) return Value(static_cast<int64_t>(x.as_bool()));
    if (x.is_float()) return Value(static_cast<int64_t>(x.as_number()));
    int64_t v = 0;
    if (x.is_string() && absl::SimpleAtoi(Strip(x.str(), kWhitespace, true, true), &v))
      return Value(v);
    const Value* fallback = Arg(args, 0, kwargs, "default");
    return fallback ? *fallback : Value(0);
  }
  if (name == "float") {
    if (x.is_number() || x.is_bool())
      return Value(x.is_bool() ? (x.as_bool() ? 1.0 : 0.0) : x.as_number());
    double v = 0;
    if (x.is_string() && absl::SimpleAtod(x.str(), &v)) return Value(v);
    const Value* fallback = Arg(args, 0, kwargs, "default");
    return fallback ? *fallback : Value(0.0);
  }
  if (name == "abs") {
    if (x.is_int()) return Value(x.as_int() < 0 ? -x.as_int() : x.as_int());
    if (x.is_float()) return Value(std::fabs(x.as_number()));
    return TypeError("filter abs", x);
  }
  if (name == "round") {
    if (!x.is_number()) return TypeError("filter round", x);
    const Value* precision = Arg(args, 0, kwargs, "precision");
    const double scale = std::pow(
        10.0, precision && precision->is_int() ? static_cast<double>(precision->as_int()) : 0.0);
    return Value(std::round(x.as_number() * scale) / scale);
  }
  if (name == "selectattr" || name == "rejectattr")
    return Select(x, args, true, name == "selectattr");
  if (name == "select" || name == "reject") return Select(x, args, false, name == "select");
  if (name == "map") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    List out;
    if (const Value* attr = Kwarg(kwargs, "attribute")) {
      if (!attr->is_string()) return absl::InvalidArgumentError("map: attribute must be a string");
      const Value* fallback = Kwarg(kwargs, "default");
      for (const Value& v : items) {
        Value a = GetAttr(v, attr->str());
        out.push_back(a.is_undefined() && fallback ? *fallback : a);
      }
      return Value(std::move(out));
    }
    if (args.empty() || !args[0].is_string())
      return absl::InvalidArgumentError("map needs a filter name or attribute=");
    const std::string filter = args[0].str();
    if (!IsKnownFilter(filter))
      return absl::InvalidArgumentError(absl::StrCat("filter '", filter, "' is not supported"));
    const Args rest(args.begin() + 1, args.end());
    for (const Value& v : items) {
      ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, v, rest, {}));
      out.push_back(std::move(mapped));
    }
    return Value(std::move(out));
  }
  if (name == "sort" || name == "min" || name == "max") {
    ASSIGN_OR_RETURN(List items, Iterate(x));
    const Value* attr = Kwarg(kwargs, "attribute");
    auto key = [&](const Value& v) {
      return attr && attr->is_string() ? GetAttr(v, attr->str()) : v;
    };
    absl::Status error;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      auto less = key(a).Less(key(b));
      if (!less.ok()) error = less.status();
      return less.ok() && *less;
    });
    RETURN_IF_ERROR(error);
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::Undef(absl::StrCat(name, " of an empty sequence"));
      return name == "min" ? items.front() : items.back();
    }
    const Value* reverse = Arg(args, 0, kwargs, "reverse");
    if (reverse && reverse->Truthy()) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "indent") {
    ASSIGN_OR_RETURN(std::string s, Str(x, "filter indent"));
    const Value* width = Arg(args, 0, kwargs, "width");
    const Value* first = Arg(args, 1, kwargs, "first");
    const Value* blank = Arg(args, 2, kwargs, "blank");
    const std::string pad =
        width && width->is_string()
            ? width->str()
            : std::string(static_cast<size_t>(width && width->is_int() ? width->as_int() : 4), ' ');
    std::string out;
    size_t start = 0;
    for (int line = 0; start <= s.size(); ++line) {
      const size_t nl = s.find('\n', start);
      const std::string text =
          s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool indent =
          (line > 0 || (first && first->Truthy())) && (!text.empty() || (blank && blank->Truthy()));
      out += (indent ? pad : "") + text;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
    }
    return Value(std::move(out));
  }
  return absl::InvalidArgumentError(absl::StrCat("filter '", name, "' is not supported"));
}

absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args,
                                 const Kwargs& kwargs) {
  if (self.is_dict() && !self.dict().is_namespace) {
    if (name == "get") {
      if (args.empty() || !args[0].is_string()) return Value::None();
      const Value* v = self.dict().Find(args[0].str());
      const Value* fallback = Arg(args, 1, kwargs, "default");
      return v ? *v : (fallback ? *fallback : Value::None());
    }
    if (name == "items") return Pairs(self.dict());
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : self.dict().items) out.push_back(name == "keys" ? Value(k) : v);
      return Value(std::move(out));
    }
  }
  if (self.is_undefined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", self.undefined_name(), "' is undefined (calling .", name, "())"));
  }
  if (!self.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", self.TypeName(), "' object has no method '", name, "'"));
  }
  const std::string& s = self.str();
  const Value* a0 = Arg(args, 0, kwargs, "");
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const std::string chars = a0 && a0->is_string() ? a0->str() : std::string(kWhitespace);
    return Value(Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "upper") return Value(Upper(s));
  if (name == "lower") return Value(Lower(s));
  if (name == "title") return Value(Title(s));
  if (name == "capitalize") return Value(Capitalize(s));
  if (name == "startswith" || name == "endswith") {
    if (!a0) return absl::InvalidArgumentError(absl::StrCat(name, "() needs an argument"));
    List candidates = a0->is_list() ? a0->list() : List{*a0};
    for (const Value& c : candidates) {
      if (!c.is_string()) return absl::InvalidArgumentError(absl::StrCat(name, "() takes strings"));
      const std::string& p = c.str();
      if (p.size() <= s.size() &&
          (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
        return Value(true);
      }
    }
    return Value(false);
  }
  if (name == "find") {
    if (!a0 || !a0->is_string()) return absl::InvalidArgumentError("find() takes a string");
    const size_t at = s.find(a0->str());
    return Value(at == std::string::npos
                     ? int64_t{-1}
                     : static_cast<int64_t>(CodePoints(s.substr(0, at)).size()));
  }
  if (name == "replace") {
    if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
      return absl::InvalidArgumentError("replace() needs two strings");
    }
    return Value(Replace(s, args[0].str(), args[1].str(),
                         args.size() > 2 && args[2].is_int() ? args[2].as_int() : -1));
  }
  if (name == "split") {
    const Value* sep = Arg(args, 0, kwargs, "sep");
    const Value* maxsplit = Arg(args, 1, kwargs, "maxsplit");
    int64_t left = maxsplit && maxsplit->is_int() ? maxsplit->as_int() : -1;
    List out;
    if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty strings
      size_t i = 0;
      while (true) {
        while (i < s.size() && kWhitespace.find(s[i]) != absl::string_view::npos) ++i;
        if (i >= s.size()) break;
        if (left == 0) {
          out.push_back(Value(Strip(s.substr(i), kWhitespace, false, true)));
          break;
        }
        size_t j = i;
        while (j < s.size() && kWhitespace.find(s[j]) == absl::string_view::npos) ++j;
        out.push_back(Value(s.substr(i, j - i)));
        --left;
        i = j;
      }
      return Value(std::move(out));
    }
    if (!sep->is_string() || sep->str().empty())
      return absl::InvalidArgumentError("split() needs a non-empty separator");
    size_t start = 0;
    while (true) {
      const size_t hit = left == 0 ? std::string::npos : s.find(sep->str(), start);
      if (hit == std::string::npos) {
        out.push_back(Value(s.substr(start)));
        break;
      }
      out.push_back(Value(s.substr(start, hit - start)));
      start = hit + sep->str().size();
      --left;
    }
    return Value(std::move(out));
  }
  return absl::InvalidArgumentError(absl::StrCat("'str' object has no method '", name, "'"));
}

absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args, const Kwargs& kwargs) {
  if (name == "raise_exception") {
    return absl::InvalidArgumentError(args.empty() ? "the chat template raised an error"
                                                   : args[0].ToString());
  }
  if (name == "namespace") {
    Dict d;
    d.is_namespace = true;
    if (!args.empty() && args[0].is_dict()) d.items = args[0].dict().items;
    for (const auto& [k, v] : kwargs) d.Set(k, v);
    return Value(std::move(d));
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& a : args) {
      if (!a.is_int()) return absl::InvalidArgumentError("range() takes integers");
    }
    if (args.size() == 1) {
      stop = args[0].as_int();
    } else if (args.size() >= 2) {
      start = args[0].as_int();
      stop = args[1].as_int();
      if (args.size() > 2) step = args[2].as_int();
    }
    if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) {
        return absl::InvalidArgumentError(absl::StrCat("range() longer than ", kMaxRange));
      }
      out.push_back(Value(i));
    }
    return Value(std::move(out));
  }
  if (name == "strftime_now") {
    if (args.empty() || !args[0].is_string())
      return absl::InvalidArgumentError("strftime_now() takes a format");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), args[0].str().c_str(), &tm);
    return Value(std::string(buf, n));
  }
  return absl::InvalidArgumentError(absl::StrCat("function ", name, "() is not supported"));
}

}  // namespace moeserve::jinja
