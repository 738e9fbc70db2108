// Jinja's tests, Python's string and dict methods, the global functions transformers gives
// chat templates, and the lists of names the parser accepts (filters: jinja_filters.cc).
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/jinja_helpers.h"

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

template <size_t N>
bool In(const std::string& name, const char* const (&list)[N]) {
  return std::find_if(std::begin(list), std::end(list), [&](const char* s) { return name == s; }) !=
         std::end(list);
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

namespace {

// Python's str.split: on runs of whitespace without `sep` (no empty strings), else on `sep`; at
// most `maxsplit` splits.
absl::StatusOr<Value> Split(const std::string& s, const Value* sep, const Value* maxsplit) {
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

}  // namespace

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
  if (name == "split") return Split(s, Arg(args, 0, kwargs, "sep"), Arg(args, 1, kwargs, "maxsplit"));
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
