// Typed readers of config.json keys, shared by the family parsers: a missing or null key keeps
// the default, a key of the wrong type is refused naming it and what it holds.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace moeserve::config_json {

using Json = nlohmann::json;

absl::Status TypeError(absl::string_view key, absl::string_view want, const Json& got);
absl::Status ReadInt(const Json& j, absl::string_view key, bool required, int64_t* out);
absl::Status ReadDouble(const Json& j, absl::string_view key, double* out);
absl::Status ReadBool(const Json& j, absl::string_view key, bool* out);
// The key's value, or null when it is absent or JSON null.
const Json* Find(const Json& j, absl::string_view key);

}  // namespace moeserve::config_json
