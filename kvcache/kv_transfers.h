// The copies between the device KV pool and the tiers below it (host DDR, flash) that one step
// needs, as plain data: the scheduler plans them while it allocates (it never copies), and
// KvTiers::Execute runs them before the step's forward, in list order. The order matters: a
// cached block that an allocation evicts must be copied down before the block's new contents
// (a promotion, a swap-in) are copied into it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"
#include "kvcache/host_tier.h"

namespace moeserve {

struct KvTransfer {
  enum class Kind {
    kDemote,    // blocks[0], evicted from the prefix cache under `hash`, goes down to DDR
    kPromote,   // `hash` comes back from DDR or flash into blocks[0] (allocated, registered)
    kSwapOut,   // a preempted sequence's blocks go to `blocks.size()` new DDR swap slots
    kSwapIn,    // swap `slots` come back into `blocks` and are freed
    kFreeSwap,  // swap `slots` of a sequence that ended while swapped out are freed
  };
  Kind kind = Kind::kDemote;
  std::vector<int32_t> blocks;
  BlockHash hash;                  // kDemote, kPromote
  double retain_until = 0;         // kDemote: the block's retention deadline, kept below
  KvTier planned = KvTier::kHost;  // kPromote: the tier the block was found in when planned
  // kPromote: the evictions its own allocation caused. They run after the block is read out of
  // its tier and before it is copied in, so that one leaving DDR makes room for them rather
  // than being pushed out by them.
  std::vector<BlockEviction> evicted;
  std::vector<int64_t> slots;  // kSwapIn, kFreeSwap

  static KvTransfer Demote(const BlockEviction& e) {
    KvTransfer t;
    t.kind = Kind::kDemote;
    t.blocks = {e.block};
    t.hash = e.hash;
    t.retain_until = e.retain_until;
    return t;
  }
};

// What became of each transfer of a list (same index).
struct KvTransferOutcome {
  bool ok = true;
  KvTier tier = KvTier::kHost;  // kPromote: the tier that served it
  double retain_until = 0;      // kPromote: the deadline it had below
  std::vector<int64_t> slots;   // kSwapOut: the swap slots now holding the KV
};

// The tiers as the scheduler may ask about them while planning: questions, no copies.
class KvTierView {
 public:
  virtual ~KvTierView() = default;
  // The lower tier that holds `hash`, if any.
  virtual std::optional<KvTier> Find(const BlockHash& hash) const = 0;
  // DDR slots that swapped-out sequences may hold at once.
  virtual int64_t swap_capacity() const = 0;
};

}  // namespace moeserve
