// Jinja's filters, as jinja2 3.1 implements them for the values of jinja_value.h.
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/jinja_builtins.h"
#include "text/jinja_helpers.h"

namespace moeserve::jinja {
namespace {

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

// Filters on strings: the value as a string or JSON, trimmed, case-mapped, replaced, indented.
std::optional<absl::StatusOr<Value>> TextFilter(const std::string& name, const Value& x, const Args& args, const Kwargs& kwargs) {
  if (name == "string") return Value(x.ToString());
  if (name == "tojson") {
    const Value* indent = Arg(args, 0, kwargs, "indent");
    ASSIGN_OR_RETURN(
        std::string json,
        x.ToJson(indent && indent->is_int() ? static_cast<int>(indent->as_int()) : -1));
    return Value(std::move(json));
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
  return std::nullopt;
}

// Filters on sequences as a whole: length, join, first and last, list, reverse, unique, items.
std::optional<absl::StatusOr<Value>> SequenceFilter(const std::string& name, const Value& x, const Args& args, const Kwargs& kwargs) {
  if (name == "length" || name == "count") {
    if (x.is_string()) return Value(static_cast<int64_t>(CodePoints(x.str()).size()));
    if (x.is_list()) return Value(static_cast<int64_t>(x.list().size()));
    if (x.is_dict()) return Value(static_cast<int64_t>(x.dict().items.size()));
    if (x.is_undefined()) return Value(0);
    return TypeError(absl::StrCat("filter ", name), x);
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
  return std::nullopt;
}

// Filters that pick, transform or order a sequence's items: select and reject, map, sort, min, max.
std::optional<absl::StatusOr<Value>> ItemsFilter(const std::string& name, const Value& x, const Args& args,
                                                 const Kwargs& kwargs) {
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
  return std::nullopt;
}

// Filters on numbers: int, float, abs, round.
std::optional<absl::StatusOr<Value>> NumberFilter(const std::string& name, const Value& x, const Args& args, const Kwargs& kwargs) {
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
  return std::nullopt;
}

}  // namespace

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
  for (auto* filter : {TextFilter, SequenceFilter, ItemsFilter, NumberFilter}) {
    if (std::optional<absl::StatusOr<Value>> out = filter(name, x, args, kwargs)) return *std::move(out);
  }
  return absl::InvalidArgumentError(absl::StrCat("filter '", name, "' is not supported"));
}

}  // namespace moeserve::jinja
