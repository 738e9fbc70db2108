// The filters, tests, methods and global functions chat templates may use, with jinja2's and
// Python's semantics. A name outside these lists is refused when the template is parsed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja_value.h"

namespace moeserve::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);
bool IsKnownMethod(const std::string& name);
bool IsKnownGlobal(const std::string& name);

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& x, const Args& args,
                                  const Kwargs& kwargs);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& x, const Args& args);
absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args,
                                 const Kwargs& kwargs);
// raise_exception(msg) fails with the template's message; strftime_now formats the local time.
absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args, const Kwargs& kwargs);

// Iterating a value as Jinja does: a list's items, a dict's keys, a string's characters.
absl::StatusOr<List> Iterate(const Value& v);
// Python's `x in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& x);

}  // namespace moeserve::jinja
