// Python's str operations (on UTF-8, case mapping per code point with utf8proc) and the
// argument helpers that Jinja's filters (jinja_filters.cc) and Python's methods
// (jinja_builtins.cc) share.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja_builtins.h"

namespace moeserve::jinja {

inline constexpr absl::string_view kWhitespace = " \t\n\r\v\f";

absl::Status TypeError(absl::string_view what, const Value& v);
const Value* Kwarg(const Kwargs& kwargs, absl::string_view key);
// Positional argument i, else keyword `key`, else null.
const Value* Arg(const Args& args, size_t i, const Kwargs& kwargs, absl::string_view key);
absl::StatusOr<std::string> Str(const Value& v, absl::string_view what);

std::string Strip(const std::string& s, absl::string_view chars, bool left, bool right);
std::string Upper(const std::string& s);
std::string Lower(const std::string& s);
std::string Title(const std::string& s);
std::string Capitalize(const std::string& s);
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);
// UTF-8 code points (Python's len and iteration over str).
std::vector<std::string> CodePoints(const std::string& s);

// Python's slice a:b:c over a sequence of length n (non-integer parts take their defaults): the
// indices it selects, in order.
std::vector<size_t> SliceIndices(int64_t n, const Value& a, const Value& b, const Value& c);
// A binary arithmetic operator (+ - * / // % **) with Python's semantics; a repeated string
// stops growing at `max_string_bytes`.
absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, size_t max_string_bytes);

// A dict's items as [key, value] lists.
Value Pairs(const Dict& d);
// The attribute (dotted path) of an item, as selectattr and map read it.
Value GetAttr(const Value& v, const std::string& path);

}  // namespace moeserve::jinja
