// The host DDR tier of the KV cache: whole blocks copied out of the device cache, kept by
// their hash in a preallocated slab within a byte budget, least recently used first out. A
// block pushed out goes down to the flash tier when one is attached, so the two form the
// lower levels of the hierarchy below the device pool: Get finds a block in DDR, else in flash,
// and says which tier served it.
//
// Three refinements over a plain LRU:
//   - retention: a block kept "until T" is pushed out only when every other block is retained
//     too, and carries its deadline down to flash;
//   - swap space: slots of the same slab lent to preempted sequences (their whole KV, not only
//     full prefix blocks), pinned until returned;
//   - a transfer thread: flash writes of pushed-out blocks and prefetch reads of blocks that a
//     queued request will need run off the engine thread; a block waiting to be written is
//     still served from memory.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/host_buffer.h"
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
  // Flash writes and prefetch reads on a transfer thread (only with a flash tier). Beyond
  // max_pending_writes queued blocks, a push-out writes synchronously (back-pressure).
  bool async = true;
  int64_t max_pending_writes = 64;
  WallClock clock = WallSeconds;  // for retention deadlines
  // Allocates the slab: Backend::AllocateHost (pinned under CUDA, so that the device's copy
  // engine reads and writes swap slots directly); null: ordinary memory.
  std::function<absl::StatusOr<HostBuffer>(size_t)> allocate;
};

struct HostTierStats {
  int64_t capacity_blocks = 0;
  int64_t blocks = 0;            // cached blocks in DDR (swap slots not included)
  int64_t retained = 0;          // ... of which retained until after now
  int64_t swap_blocks = 0;       // slots lent to swapped-out sequences
  int64_t host_hits = 0, flash_hits = 0, misses = 0;
  int64_t demoted_to_flash = 0;  // pushed out of DDR into flash
  int64_t dropped = 0;           // pushed out with nowhere to go (or flash refused)
  int64_t pending_writes = 0;    // queued for the transfer thread
  int64_t async_writes = 0;      // flash writes done by the transfer thread
  int64_t prefetch_requests = 0, prefetched = 0;  // flash blocks read into DDR ahead of need
  // Time spent in flash writes and reads (whole records, checks included), for bandwidth.
  double flash_write_seconds = 0, flash_read_seconds = 0;
  int64_t flash_reads = 0;
};

class HostKvTier {
 public:
  // `flash` may be null (no flash tier); it must outlive this object.
  static absl::StatusOr<std::unique_ptr<HostKvTier>> Create(const HostTierOptions& options, FlashStore* flash);
  // Finishes queued flash writes (so a restart finds them), then stops the transfer thread.
  ~HostKvTier();

  // Keeps a copy of one block (block_bytes at `data`) under `hash`, replacing an older copy.
  absl::Status Put(const BlockHash& hash, const void* data, double retain_until = 0);
  // Copies the block into `out` (block_bytes) from DDR or else flash; NOT_FOUND if neither has
  // it (a flash record that fails its checks is not served). A flash hit is also kept in DDR.
  // With `take`, the block is leaving for the device: its DDR slot is freed at once (DDR is
  // exclusive of the device, so promoting a long prefix never pushes its own later blocks out)
  // and a flash hit is not copied into DDR.
  absl::StatusOr<KvTier> Get(const BlockHash& hash, void* out, double* retain_until = nullptr, bool take = false);
  bool Contains(const BlockHash& hash) const { return Find(hash).has_value(); }
  // The tier Get would serve `hash` from now (DDR, a block awaiting its flash write included).
  std::optional<KvTier> Find(const BlockHash& hash) const;

  // Asks the transfer thread to read these blocks from flash into DDR (those in DDR already, or
  // in no tier, are skipped). Without a transfer thread or a DDR budget this does nothing.
  void Prefetch(const std::vector<BlockHash>& hashes);
  // Waits until queued writes and prefetches are done.
  void Flush();

  // Swap space: `n` slots pinned for a preempted sequence (pushing cached blocks down to make
  // room), or RESOURCE_EXHAUSTED when fewer could be freed. The holder copies whole blocks in
  // and out of SwapData(slot) (pinned memory under CUDA: the DMA target) until it frees them.
  absl::StatusOr<std::vector<int64_t>> ReserveSwap(int64_t n);
  uint8_t* SwapData(int64_t slot) { return Slot(slot); }
  void FreeSwap(const std::vector<int64_t>& slots);

  HostTierStats stats() const;
  size_t block_bytes() const { return options_.block_bytes; }

 private:
  struct Pending {
    std::shared_ptr<const std::vector<uint8_t>> data;
    double retain_until = 0;
  };

  HostKvTier(const HostTierOptions& options, FlashStore* flash, HostBuffer slab, int64_t slots);
  uint8_t* Slot(int64_t slot) { return slab_.data() + static_cast<size_t>(slot) * options_.block_bytes; }
  const uint8_t* Slot(int64_t slot) const { return slab_.data() + static_cast<size_t>(slot) * options_.block_bytes; }
  // Takes a slot, pushing the least recently used unretained block (else the least recently
  // used one) down to flash; -1 when every slot is lent to swap.
  int64_t TakeSlotLocked();
  // Stores a block in DDR; false when no slot could be had.
  bool StoreLocked(const BlockHash& hash, const void* data, double retain_until);
  // Sends a block to flash: queued for the transfer thread, or written now.
  void ToFlashLocked(const BlockHash& hash, const void* data, double retain_until);
  void TransferLoop();

  HostTierOptions options_;
  FlashStore* flash_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  HostBuffer slab_;
  std::vector<int64_t> free_slots_;
  RetentionLru<BlockHash, int64_t, BlockHashHasher> blocks_;  // each block's slot
  // Transfer thread state.
  std::unordered_map<BlockHash, Pending, BlockHashHasher> pending_;  // awaiting a flash write
  std::deque<BlockHash> write_queue_, prefetch_queue_;
  int64_t in_flight_ = 0;
  bool stop_ = false;
  HostTierStats stats_;
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace moeserve
