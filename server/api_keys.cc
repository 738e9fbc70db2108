// API keys file and constant-time key lookup.
#include "server/api_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace moeserve::server {
namespace {

constexpr size_t kMaxTenantChars = 64;

bool ValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > kMaxTenantChars) return false;
  for (char c : t) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
  }
  return true;
}

// Keys are compared as fixed-length digests, byte by byte without an early exit, so the time
// tells neither which key matched nor how long a key is.
using Digest = std::array<uint8_t, 16>;
Digest DigestOf(absl::string_view s) {
  const XXH128_hash_t h = XXH3_128bits(s.data(), s.size());
  Digest d;
  std::memcpy(d.data(), &h, d.size());
  return d;
}
bool ConstantTimeEquals(const Digest& a, const Digest& b) {
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::FromFlags(const std::string& api_key,
                                           const std::string& keys_file) {
  ApiKeys keys;
  if (!api_key.empty() && !keys_file.empty()) {
    return absl::InvalidArgumentError(
        "--api-key and --api-keys-file exclude each other: put the single key in the file with a "
        "tenant name");
  }
  if (!api_key.empty()) {
    if (absl::StrContains(api_key, ' '))
      return absl::InvalidArgumentError("--api-key must not contain spaces");
    keys.keys_.emplace_back(api_key, "");
    keys.digests_.push_back(DigestOf(api_key));
    return keys;
  }
  if (keys_file.empty()) return keys;
  // The owner and mode of the file actually read (fstat of the open file, no symbolic link).
  const int fd = ::open(keys_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-keys-file: cannot open ", keys_file, ": ", std::strerror(errno)));
  }
  struct stat st;
  std::string text;
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (stat_ok && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) {
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;)
      text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-keys-file: ", keys_file, " is not a regular file"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys-file: ", keys_file,
                                                   " is owned by uid ", st.st_uid,
                                                   ", not by this server's uid ", ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--api-keys-file: %s has mode %04o: group or others can reach the keys; chmod 600 it",
        keys_file, st.st_mode & 07777));
  }
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("--api-keys-file ", keys_file, " line ", line_no, ": ");
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected \"TENANT KEY\", got ", parts.size(), " fields"));
    }
    if (!ValidTenant(parts[0])) {
      return absl::InvalidArgumentError(absl::StrCat(where, "tenant \"", parts[0], "\" must be 1-",
                                                     kMaxTenantChars,
                                                     " characters of A-Z a-z 0-9 . _ -"));
    }
    for (const auto& [key, tenant] : keys.keys_) {
      if (key == parts[1]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "this key is already given to tenant \"", tenant, "\""));
      }
    }
    keys.keys_.emplace_back(std::string(parts[1]), std::string(parts[0]));
    keys.digests_.push_back(DigestOf(parts[1]));
  }
  if (keys.keys_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-keys-file: ", keys_file, " holds no \"TENANT KEY\" line"));
  }
  return keys;
}

std::optional<std::string> ApiKeys::Authenticate(const absl::string_view* authorization) const {
  if (keys_.empty()) return std::string();
  // The scheme is case-insensitive (RFC 9110, 11.1), then one or more spaces.
  if (authorization == nullptr || !absl::StartsWithIgnoreCase(*authorization, "bearer ")) return std::nullopt;
  const Digest given = DigestOf(absl::StripLeadingAsciiWhitespace(authorization->substr(7)));
  // Every key is compared, so the time does not tell which one matched.
  const std::string* tenant = nullptr;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (ConstantTimeEquals(given, digests_[i])) tenant = &keys_[i].second;
  }
  if (tenant == nullptr) return std::nullopt;
  return *tenant;
}

}  // namespace moeserve::server
