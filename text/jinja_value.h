// The values a chat template computes with, with Python's semantics as Jinja (jinja2) gives
// them: undefined, none, booleans, integers, floats, strings, lists and dicts (string keys, in
// insertion order). Lists and dicts are shared by reference, as in Python, which is what
// makes a `namespace()` mutable from inside a loop.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve::jinja {

class Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // made by namespace(): its attributes may be set
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value v);
};

class Value {
 public:
  struct Undefined {
    std::string name;  // what was looked up, for error messages
  };
  Value() : v_(Undefined{}) {}
  static Value Undef(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value None() { return Value(nullptr); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(List l) : v_(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : v_(std::make_shared<Dict>(std::move(d))) {}

  static Value FromJson(const nlohmann::ordered_json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_number() const {
    return is_int() ? static_cast<double>(as_int()) : std::get<double>(v_);
  }
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<std::shared_ptr<List>>(v_); }
  List& list() { return *std::get<std::shared_ptr<List>>(v_); }
  const Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  Dict& dict() { return *std::get<std::shared_ptr<Dict>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python's bool(x); undefined is false.
  bool Truthy() const;
  // Python's str(x) (what {{ x }} prints): None -> "None", True -> "True", lists and dicts
  // as their repr; undefined prints as "".
  std::string ToString() const;
  // Python's repr(x).
  std::string Repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=False), as transformers' tojson.
  absl::StatusOr<std::string> ToJson(int indent = -1) const;
  // Python's ==.
  bool Equals(const Value& other) const;
  // Python's <, for numbers and strings (and lists of those); an error for other types.
  absl::StatusOr<bool> Less(const Value& other) const;
  std::string TypeName() const;

 private:
  template <typename T>
  explicit Value(T v, int) : v_(std::move(v)) {}
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}

  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>>
      v_;
};

}  // namespace moeserve::jinja
