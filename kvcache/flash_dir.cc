// Private, locked flash directory.
#include "kvcache/flash_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace moeserve {
namespace {

std::string Mode(mode_t m) { return absl::StrFormat("%04o", m & 07777); }


// No one else may swap a component of `dir`'s path (each ancestor belongs to root or to us, and
// is writable by others only with the sticky bit, as /tmp), and the directory is ours alone.
absl::Status CheckPrivate(const std::string& dir) {
  namespace fs = std::filesystem;
  struct stat st;
  for (fs::path a = fs::path(dir).parent_path();; a = a.parent_path()) {
    if (::stat(a.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot stat ", a.string(), ": ", std::strerror(errno)));
    }
    if ((st.st_uid != 0 && st.st_uid != ::geteuid()) ||
        ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0)) {
      return absl::PermissionDeniedError(absl::StrCat(
          dir, " lies under ", a.string(), " (owner uid ", st.st_uid, ", mode ", Mode(st.st_mode),
          "), which someone else could use to replace it: use a directory whose ancestors only "
          "root or this "
          "server's user can write (or that have the sticky bit, as /tmp)"));
    }
    if (a == a.parent_path()) break;
  }
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stat ", dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(dir, " is owned by uid ", st.st_uid,
                                                    ", not by this server's uid ", ::geteuid(),
                                                    ": its owner could read or plant KV records"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, " has mode ", Mode(st.st_mode), ": group or others may ",
        (st.st_mode & 022) != 0 ? "write it (plant or delete records)"
                                : "list it (record names are prefix hashes)",
        ", and stored KV values reveal prompts; make it private with chmod 700 ", dir));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FlashDirLock> FlashDirLock::Acquire(const std::string& requested) {
  namespace fs = std::filesystem;
  fs::path normal = fs::path(requested).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "dir/" is "dir"
  std::error_code ec;
  const fs::path parent = normal.parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  if (::mkdir(normal.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", normal.string(), ": ", std::strerror(errno)));
  }
  // Every later path names the directory itself (symbolic links resolved once, here).
  char resolved[PATH_MAX];
  if (::realpath(normal.c_str(), resolved) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", normal.string(), ": ", std::strerror(errno)));
  }
  const std::string dir = resolved;
  RETURN_IF_ERROR(CheckPrivate(dir));
  const std::string lock_path = absl::StrCat(dir, "/", kLockFile);
  FlashDirLock lock;
  lock.path_ = dir;
  lock.fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock.fd_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot lock ", lock_path, ": ", std::strerror(err)));
    }
    char buf[32] = {};
    const ssize_t n = ::pread(lock.fd_, buf, sizeof(buf) - 1, 0);
    const std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is in use by another moeserve server (pid ",
                     holder.empty() ? "unknown" : absl::StripAsciiWhitespace(holder),
                     "); each server needs a flash directory of its own"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(lock.fd_, 0) != 0 ||
      ::pwrite(lock.fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", lock_path, ": ", std::strerror(errno)));
  }
  return lock;
}

FlashDirLock::FlashDirLock(FlashDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FlashDirLock& FlashDirLock::operator=(FlashDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

FlashDirLock::~FlashDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace moeserve
