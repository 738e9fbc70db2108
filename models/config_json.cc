// Typed readers of config.json keys.
#include "models/config_json.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace moeserve::config_json {

absl::Status TypeError(absl::string_view key, absl::string_view want, const Json& got) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: key \"", key, "\" must be ", want,
                                                 ", got ", got.type_name(), " ", got.dump()));
}

absl::Status ReadInt(const Json& j, absl::string_view key, bool required, int64_t* out) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) {
    if (required) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: missing required key \"", key, "\""));
    }
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) return TypeError(key, "an integer", *it);
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const Json& j, absl::string_view key, double* out) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return TypeError(key, "a number", *it);
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, absl::string_view key, bool* out) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return TypeError(key, "true or false", *it);
  *out = it->get<bool>();
  return absl::OkStatus();
}

const Json* Find(const Json& j, absl::string_view key) {
  auto it = j.find(std::string(key));
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace moeserve::config_json
