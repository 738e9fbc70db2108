// API keys and the tenants they name. `--api-key KEY` is one key of the default tenant;
// `--api-keys-file F` holds several, one "TENANT KEY" pair per line, so that each tenant's
// requests share prefix-cache blocks only among themselves. Keys are compared in constant time.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve::server {

class ApiKeys {
 public:
  // No keys: every call is accepted, as the default tenant.
  ApiKeys() = default;
  // From the flags (at most one of them set). The file: '#' comments and blank lines ignored;
  // tenant names of 1-64 characters [A-Za-z0-9._-]; keys without whitespace, each used once;
  // the file may not be readable or writable by group or others. Errors name the flag, the
  // file's line and the limit.
  static absl::StatusOr<ApiKeys> FromFlags(const std::string& api_key,
                                           const std::string& keys_file);

  bool required() const { return !keys_.empty(); }
  size_t num_keys() const { return keys_.size(); }
  // The tenant of a call whose "authorization" metadata is `authorization` ("Bearer KEY"; null
  // when absent): "" for the default tenant; nullopt when a key is required and this one is
  // missing or wrong.
  std::optional<std::string> Authenticate(const absl::string_view* authorization) const;

 private:
  std::vector<std::pair<std::string, std::string>> keys_;  // (key, tenant)
  std::vector<std::array<uint8_t, 16>> digests_;           // XXH3-128 of each key
};

}  // namespace moeserve::server
