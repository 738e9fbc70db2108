// Request bodies as JSON, safely: nesting depth and value count bounded before the parser
// builds anything (a 200 KB body of 100,000 nested brackets must not exhaust a stack), syntax
// errors reported with their line and column, and integers range-checked before they are
// narrowed (2^32 + 72 is not token 72).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve::server {

struct JsonLimits {
  int max_depth = 64;              // nested arrays and objects
  int64_t max_values = 1 << 20;    // values of any kind in the whole body
};

// The body parsed as a JSON object; INVALID_ARGUMENT naming the limit or the syntax error's
// line and column otherwise.
absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body, const JsonLimits& limits = {});

// `v` as an integer in [lo, hi]; INVALID_ARGUMENT "FIELD: must be an integer in [lo, hi], got V"
// (V as written, however large) otherwise.
absl::StatusOr<int64_t> IntInRange(const nlohmann::json& v, const char* field, int64_t lo, int64_t hi);
// The same for unsigned fields (a seed): [0, 2^64 - 1].
absl::StatusOr<uint64_t> UnsignedInt(const nlohmann::json& v, const char* field);

// INVALID_ARGUMENT "PARAM: WHAT", the form every request error takes (the HTTP API reads the
// parameter's name from it).
inline absl::Status FieldError(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
}

// `j[key]` into `out` when present and not null (else `out` keeps its value), checked for the
// type of T: a bool, an integer in T's range (checked before narrowing), a number or a string.
template <typename T>
absl::Status ReadField(const nlohmann::json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return FieldError(key, "must be true or false");
  } else if constexpr (std::is_integral_v<T>) {
    // Range-checked before narrowing: 2^32 + 1 must not become 1.
    ASSIGN_OR_RETURN(const int64_t v, IntInRange(*it, key, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    *out = static_cast<T>(v);
    return absl::OkStatus();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return FieldError(key, "must be a number");
  } else {
    if (!it->is_string()) return FieldError(key, "must be a string");
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

// Token ids (`array` of integers), each checked before narrowing; errors name `field`.
absl::StatusOr<std::vector<int32_t>> TokenIds(const nlohmann::json& array, const char* field);

}  // namespace moeserve::server
