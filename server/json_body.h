// Request bodies as JSON, safely: nesting depth and value count bounded before the parser
// builds anything (a 200 KB body of 100,000 nested brackets must not exhaust a stack), syntax
// errors reported with their line and column, and integers range-checked before they are
// narrowed (2^32 + 72 is not token 72).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

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
// `j[key]` as a number; nullopt when absent or null; INVALID_ARGUMENT "KEY: must be a number".
absl::StatusOr<std::optional<double>> OptionalNumber(const nlohmann::json& j, const char* key);
// The same for unsigned fields (a seed): [0, 2^64 - 1].
absl::StatusOr<uint64_t> UnsignedInt(const nlohmann::json& v, const char* field);

}  // namespace moeserve::server
