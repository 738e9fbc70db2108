// The flash tier of the KV cache: full blocks as self-describing files in a directory, within a
// byte budget. Each record is written atomically (temporary file, fsync, rename; mode 0600) and
// carries a header (magic, format version, model fingerprint, block hash, layer range, dtype,
// payload length, retention deadline, checksums). The directory is private and locked by one
// store at a time (FlashDirLock). Opening a store scans and indexes the directory, so the cache
// survives a restart; a truncated, corrupted or half-written record is detected, deleted and
// counted, and never served; a foreign record (another model, format version or block shape)
// and anything that is not a record file are skipped and counted, and left in place unless
// the operator asks to purge foreign records. Thread-safe: the engine's transfer thread and
// lookups may share it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "kvcache/block_hash.h"
#include "kvcache/retention_lru.h"
#include "kvcache/flash_dir.h"

namespace moeserve {

// The fixed-size header at the start of every record file (little-endian, packed by hand).
struct FlashRecordHeader {
  static constexpr char kMagic[8] = {'M', 'S', 'K', 'V', 'B', 'L', 'K', '\0'};
  static constexpr uint32_t kVersion = 2;  // 2: adds the retention deadline
  static constexpr size_t kBytes = 8 + 4 + 4 + 8 + 16 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8;  // 88

  uint64_t model_fingerprint = 0;
  BlockHash block_hash;
  uint32_t layer_begin = 0, layer_end = 0;  // layers [begin, end) of the block in the payload
  uint32_t dtype = 0;                        // DType of the KV elements
  uint32_t block_tokens = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload
  double retain_until = 0;        // Unix seconds; 0: an ordinary LRU record

  // Serialises with the header checksum (XXH3-64 of the bytes before it) at the end.
  void Encode(uint8_t out[kBytes]) const;
  // Parses and checks magic, version and the header checksum; the message says what failed.
  static absl::StatusOr<FlashRecordHeader> Decode(const uint8_t in[kBytes]);
};

struct FlashStoreOptions {
  std::string dir;             // created if missing
  uint64_t budget_bytes = 0;   // files (headers included) never exceed this in total
  uint64_t model_fingerprint = 0;
  WallClock clock = WallSeconds;  // for retention deadlines
  // The block shape this store's user writes; records of another shape (KV dtype, tokens per
  // block, layer count) are foreign. 0 / -1: not checked.
  uint32_t expect_layers = 0;
  uint32_t expect_block_tokens = 0;
  int expect_dtype = -1;
  // Delete foreign records found at open instead of leaving them (--flash-kv-purge-foreign).
  bool purge_foreign = false;
  // Whether a decoded header describes a block of the expected shape.
  bool ShapeMatches(const FlashRecordHeader& h) const {
    return (expect_layers == 0 || (h.layer_begin == 0 && h.layer_end == expect_layers)) &&
           (expect_block_tokens == 0 || h.block_tokens == expect_block_tokens) &&
           (expect_dtype < 0 || h.dtype == static_cast<uint32_t>(expect_dtype));
  }
};

struct FlashStoreStats {
  int64_t records = 0;
  uint64_t bytes = 0;
  uint64_t budget_bytes = 0;
  int64_t hits = 0, misses = 0, writes = 0, evictions = 0;
  int64_t retained = 0;          // records whose retention deadline has not passed
  int64_t refused_retained = 0;  // writes refused because retained records fill the budget
  // Records found bad and deleted, by reason (at open or on read).
  int64_t dropped_truncated = 0;   // shorter or longer than the header says
  int64_t dropped_corrupt = 0;     // bad magic, header checksum or payload checksum
  int64_t dropped_foreign = 0;     // another model, version or shape, purged (or met on read)
  int64_t dropped_incomplete = 0;  // temporary files of a writer that did not finish
  // Left in place at open.
  int64_t skipped_foreign = 0;  // records of another model, format version or block shape
  int64_t skipped_other = 0;    // entries that are not record files (directories, links, other names)
};

class FlashStore {
 public:
  static absl::StatusOr<std::unique_ptr<FlashStore>> Open(const FlashStoreOptions& options);

  // Stores a block's KV (replacing an existing record of the same hash). Evicts least recently
  // used records to stay within the budget, records retained until after now only when no
  // other is left and the new record is itself retained (else RESOURCE_EXHAUSTED); refuses a
  // record larger than the whole budget. The file is written outside the store's lock.
  absl::Status Put(const BlockHash& hash, uint32_t layer_begin, uint32_t layer_end, DType dtype,
                   uint32_t block_tokens, const void* payload, size_t bytes, double retain_until = 0);
  // Reads a block into `out` (exactly `bytes`). NOT_FOUND when absent; a record that fails its
  // checks is deleted, counted and reported as NOT_FOUND too, so nothing corrupt is served.
  // `retain_until`, if given, receives the record's retention deadline.
  absl::Status Get(const BlockHash& hash, void* out, size_t bytes, double* retain_until = nullptr);
  bool Contains(const BlockHash& hash) const;
  void Erase(const BlockHash& hash);

  FlashStoreStats stats() const;
  // Path of a record (for tests and tools).
  std::string PathOf(const BlockHash& hash) const;

 private:
  FlashStore(FlashStoreOptions options, FlashDirLock lock) : options_(std::move(options)), lock_(std::move(lock)) {}
  absl::Status Scan();
  // Whether a decoded header is another model's, format's or block shape's.
  bool Foreign(const FlashRecordHeader& h) const;
  void EraseLocked(const BlockHash& hash);
  void UnindexLocked(const BlockHash& hash);  // forgets a record, leaving its file
  // Evicts until `bytes` more fit (reserved_ included); false if only retained records are
  // left and `may_evict_retained` is false.
  bool MakeRoomLocked(uint64_t bytes, bool may_evict_retained);

  FlashStoreOptions options_;
  FlashDirLock lock_;
  mutable std::mutex mu_;
  RetentionLru<BlockHash, uint64_t, BlockHashHasher> records_;  // each record's file bytes
  FlashStoreStats stats_;
  uint64_t reserved_ = 0;  // bytes of records being written outside the lock
};

}  // namespace moeserve
