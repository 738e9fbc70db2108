// jinja::Value: Python semantics for the types chat templates use.
#include "text/jinja_value.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moeserve::jinja {
namespace {

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string StringRepr(const std::string& s) {
  const char quote =
      (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

absl::Status JsonAppend(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 64) return absl::InvalidArgumentError("tojson: nesting deeper than 64");
  const std::string nl =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const char* item_sep = indent >= 0 ? "," : ", ";
  if (v.is_undefined())
    return absl::InvalidArgumentError(
        absl::StrCat("tojson: '", v.undefined_name(), "' is undefined"));
  if (v.is_none()) {
    *out += "null";
  } else if (v.is_bool()) {
    *out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    *out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_number();
    *out += std::isnan(d)   ? "NaN"
            : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                            : FloatRepr(d);
  } else if (v.is_string()) {
    *out += JsonString(v.str());
  } else if (v.is_list()) {
    if (v.list().empty()) {
      *out += "[]";
      return absl::OkStatus();
    }
    *out += "[";
    for (size_t i = 0; i < v.list().size(); ++i) {
      if (i > 0) *out += item_sep;
      *out += nl;
      if (absl::Status s = JsonAppend(v.list()[i], indent, depth + 1, out); !s.ok()) return s;
    }
    *out += close + "]";
  } else {
    if (v.dict().items.empty()) {
      *out += "{}";
      return absl::OkStatus();
    }
    *out += "{";
    bool first = true;
    for (const auto& [k, item] : v.dict().items) {
      if (!first) *out += item_sep;
      first = false;
      *out += nl + JsonString(k) + ": ";
      if (absl::Status s = JsonAppend(item, indent, depth + 1, out); !s.ok()) return s;
    }
    *out += close + "}";
  }
  return absl::OkStatus();
}

}  // namespace

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(FromJson(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, FromJson(e));
      return Value(std::move(d));
    }
    default:
      return None();
  }
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_number() != 0.0;
  if (is_string()) return !str().empty();
  if (is_list()) return !list().empty();
  return !dict().items.empty();
}

std::string Value::ToString() const {
  if (is_undefined()) return "";
  if (is_string()) return str();
  return Repr();
}

std::string Value::Repr() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return FloatRepr(as_number());
  if (is_string()) return StringRepr(str());
  if (is_list()) {
    std::string out = "[";
    for (size_t i = 0; i < list().size(); ++i)
      absl::StrAppend(&out, i ? ", " : "", list()[i].Repr());
    return out + "]";
  }
  if (dict().is_namespace) return "<Namespace>";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : dict().items) {
    absl::StrAppend(&out, first ? "" : ", ", StringRepr(k), ": ", v.Repr());
    first = false;
  }
  return out + "}";
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  if (absl::Status s = JsonAppend(*this, indent, 0, &out); !s.ok()) return s;
  return out;
}

bool Value::Equals(const Value& o) const {
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    const double a = is_bool() ? as_bool() : as_number();
    const double b = o.is_bool() ? o.as_bool() : o.as_number();
    if (is_int() && o.is_int()) return as_int() == o.as_int();
    return a == b;
  }
  if (v_.index() != o.v_.index()) return false;
  if (is_undefined() || is_none()) return true;
  if (is_string()) return str() == o.str();
  if (is_list()) {
    if (list().size() != o.list().size()) return false;
    for (size_t i = 0; i < list().size(); ++i) {
      if (!list()[i].Equals(o.list()[i])) return false;
    }
    return true;
  }
  if (dict().items.size() != o.dict().items.size()) return false;
  for (const auto& [k, v] : dict().items) {
    const Value* w = o.dict().Find(k);
    if (w == nullptr || !v.Equals(*w)) return false;
  }
  return true;
}

absl::StatusOr<bool> Value::Less(const Value& o) const {
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    if (is_int() && o.is_int()) return as_int() < o.as_int();
    const double a = is_bool() ? as_bool() : as_number();
    const double b = o.is_bool() ? o.as_bool() : o.as_number();
    return a < b;
  }
  if (is_string() && o.is_string()) return str() < o.str();
  if (is_list() && o.is_list()) {
    for (size_t i = 0; i < list().size() && i < o.list().size(); ++i) {
      if (list()[i].Equals(o.list()[i])) continue;
      return list()[i].Less(o.list()[i]);
    }
    return list().size() < o.list().size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(), "' and '", o.TypeName(), "'"));
}

std::string Value::TypeName() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  return dict().is_namespace ? "Namespace" : "dict";
}

}  // namespace moeserve::jinja
