// File helpers: read-only memory maps, whole-file reads and atomic writes (temp + rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace moeserve {

// A read-only mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Streams a file into `path.tmp.PID` and renames it over `path` on Commit, so readers see
// either the old file or the whole new one. An uncommitted writer removes its temp file.
// The temp file is created with `mode` (less the umask), so a private file is never readable
// by others, not even while it is written.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path, int mode = 0644);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t size);
  absl::Status Commit();

 private:
  AtomicFileWriter() = default;
  int fd_ = -1;
  std::string path_;
  std::string tmp_;
};

// Writes `contents` to `path` atomically.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace moeserve
