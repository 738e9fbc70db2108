// The host DDR tier of the KV cache: whole blocks copied out of the device cache, kept by
// their hash in a preallocated slab within a byte budget, least recently used first out. A
// block pushed out goes down to the flash tier when one is attached, so the two form the
// lower levels of the hierarchy below the device pool: Get finds a block in DDR, else in flash,
// and says which tier served it. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/flash_store.h"

namespace moeserve {

enum class KvTier { kDevice, kHost, kFlash };
const char* KvTierName(KvTier t);

struct HostTierOptions {
  uint64_t budget_bytes = 0;  // whole blocks only: budget / block_bytes slots
  size_t block_bytes = 0;     // KvLayout::BlockBytes() of the device cache
  // Describes the blocks to the flash store.
  uint32_t num_layers = 0;
  DType dtype = DType::kF32;
  uint32_t block_tokens = 0;
};

struct HostTierStats {
  int64_t capacity_blocks = 0;
  int64_t blocks = 0;
  int64_t host_hits = 0, flash_hits = 0, misses = 0;
  int64_t demoted_to_flash = 0;  // pushed out of DDR into flash
  int64_t dropped = 0;           // pushed out with nowhere to go (or flash refused)
};

class HostKvTier {
 public:
  // `flash` may be null (no flash tier); it must outlive this object.
  static absl::StatusOr<std::unique_ptr<HostKvTier>> Create(const HostTierOptions& options, FlashStore* flash);

  // Keeps a copy of one block (block_bytes at `data`) under `hash`, replacing an older copy.
  absl::Status Put(const BlockHash& hash, const void* data);
  // Copies the block into `out` (block_bytes) from DDR or else flash; NOT_FOUND if neither has
  // it (a flash record that fails its checks is not served). A flash hit is also kept in DDR.
  absl::StatusOr<KvTier> Get(const BlockHash& hash, void* out);
  bool Contains(const BlockHash& hash) const;

  HostTierStats stats() const;
  size_t block_bytes() const { return options_.block_bytes; }

 private:
  HostKvTier(const HostTierOptions& options, FlashStore* flash, int64_t slots);
  // Takes a slot for `hash`, demoting the least recently used block if none is free.
  int64_t TakeSlotLocked();
  void StoreLocked(const BlockHash& hash, const void* data);

  struct Entry {
    int64_t slot;
    std::list<BlockHash>::iterator lru;
  };
  HostTierOptions options_;
  FlashStore* flash_;
  mutable std::mutex mu_;
  std::vector<uint8_t> slab_;
  std::vector<int64_t> free_slots_;
  std::unordered_map<BlockHash, Entry, BlockHashHasher> index_;
  std::list<BlockHash> lru_;  // front: most recently used
  HostTierStats stats_;
};

}  // namespace moeserve
