// API keys file and constant-time key lookup.
#include "server/api_keys.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"

namespace moeserve::server {
namespace {

constexpr size_t kMaxTenantChars = 64;

bool ValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > kMaxTenantChars) return false;
  for (char c : t) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

// Equal strings, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::FromFlags(const std::string& api_key, const std::string& keys_file) {
  ApiKeys keys;
  if (!api_key.empty() && !keys_file.empty()) {
    return absl::InvalidArgumentError(
        "--api-key and --api-keys-file exclude each other: put the single key in the file with a tenant name");
  }
  if (!api_key.empty()) {
    if (absl::StrContains(api_key, ' ')) return absl::InvalidArgumentError("--api-key must not contain spaces");
    keys.keys_.emplace_back(api_key, "");
    return keys;
  }
  if (keys_file.empty()) return keys;
  struct stat st;
  if (::stat(keys_file.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys-file: cannot stat ", keys_file, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--api-keys-file: %s has mode %04o: group or others can reach the keys; chmod 600 it", keys_file,
        st.st_mode & 07777));
  }
  auto text = ReadFileToString(keys_file);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--api-keys-file: ", text.status().message()));
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("--api-keys-file ", keys_file, " line ", line_no, ": ");
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected \"TENANT KEY\", got ", parts.size(), " fields"));
    }
    if (!ValidTenant(parts[0])) {
      return absl::InvalidArgumentError(absl::StrCat(where, "tenant \"", parts[0], "\" must be 1-", kMaxTenantChars,
                                                     " characters of A-Z a-z 0-9 . _ -"));
    }
    for (const auto& [key, tenant] : keys.keys_) {
      if (key == parts[1]) {
        return absl::InvalidArgumentError(absl::StrCat(where, "this key is already given to tenant \"", tenant, "\""));
      }
    }
    keys.keys_.emplace_back(std::string(parts[1]), std::string(parts[0]));
  }
  if (keys.keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys-file: ", keys_file, " holds no \"TENANT KEY\" line"));
  }
  return keys;
}

std::optional<std::string> ApiKeys::Authenticate(const absl::string_view* authorization) const {
  if (keys_.empty()) return std::string();
  if (authorization == nullptr || !absl::StartsWith(*authorization, "Bearer ")) return std::nullopt;
  const absl::string_view given = authorization->substr(7);
  // Every key is compared, so the time does not tell which one matched.
  const std::string* tenant = nullptr;
  for (const auto& [key, name] : keys_) {
    if (ConstantTimeEquals(given, key)) tenant = &name;
  }
  if (tenant == nullptr) return std::nullopt;
  return *tenant;
}

}  // namespace moeserve::server
