// The flash tier's directory, made private and held by one server: created 0700, refused when
// another user owns it, group/others may enter, list or write it, or someone else could replace
// a directory on its path (stored KV values and even
// the record names, which are prefix hashes, reveal prompts), and locked with flock on a LOCK
// file that names the holder's pid, so a second server on the same directory is refused
// instead of treating the first one's records as foreign. The lock ends with the object (or
// the process: the kernel drops it on exit, kill -9 included).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace moeserve {

class FlashDirLock {
 public:
  static constexpr const char* kLockFile = "LOCK";

  // Creates `dir` if missing (parents as the umask says, the directory itself 0700), resolves it
  // (symbolic links, "dir/"), checks its owner and mode and that no one else can replace a
  // component of its path, and takes the lock; the errors name the path and what is wrong.
  static absl::StatusOr<FlashDirLock> Acquire(const std::string& dir);

  // The directory, resolved: every record path is built from it.
  const std::string& path() const { return path_; }

  FlashDirLock() = default;
  FlashDirLock(FlashDirLock&& other) noexcept;
  FlashDirLock& operator=(FlashDirLock&& other) noexcept;
  FlashDirLock(const FlashDirLock&) = delete;
  FlashDirLock& operator=(const FlashDirLock&) = delete;
  ~FlashDirLock();

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace moeserve
