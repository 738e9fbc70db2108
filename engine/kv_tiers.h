// The engine's KV tiers below the device pool: host DDR over an optional flash directory.
// Cached prefix blocks that the device pool evicts are copied down (demoted); a prefix lookup
// that misses the device but finds the block below brings it back (promotes) before the step
// that needs it. Copies run on the engine thread, synchronously, between steps (an
// asynchronous transfer thread is not built yet).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "kvcache/block_pool.h"
#include "kvcache/flash_store.h"
#include "kvcache/host_tier.h"
#include "kvcache/kv_storage.h"

namespace moeserve {

struct KvTierConfig {
  uint64_t host_bytes = 0;     // DDR budget; 0 with a flash dir: blocks go straight to flash
  std::string flash_dir;       // empty: no flash tier
  uint64_t flash_bytes = 1ull << 30;
  bool enabled() const { return host_bytes > 0 || !flash_dir.empty(); }
};

struct KvTierStats {
  HostTierStats host;
  FlashStoreStats flash;
  bool has_flash = false;
  int64_t demoted = 0, demote_failures = 0;
  int64_t promoted_ddr = 0, promoted_flash = 0;
  // Measured copies, for bandwidth: seconds and bytes per direction and tier.
  double demote_seconds = 0, promote_ddr_seconds = 0, promote_flash_seconds = 0;
  int64_t block_bytes = 0;
};

class KvTiers final : public PrefixSource {
 public:
  // Opens the flash store (scanning what an earlier run left) and sizes the DDR slab.
  static absl::StatusOr<std::unique_ptr<KvTiers>> Create(const KvTierConfig& config, uint64_t fingerprint,
                                                         BlockPool* pool, KvStorage* kv, Backend* backend);

  // Installs the demotion hook on the pool (call once; the tiers must outlive the pool's use).
  void Attach();
  std::optional<std::pair<int32_t, KvTier>> Promote(const BlockHash& hash) override;
  KvTierStats stats() const;

 private:
  KvTiers(BlockPool* pool, KvStorage* kv, Backend* backend) : pool_(pool), kv_(kv), backend_(backend) {}
  void Demote(int32_t block, const BlockHash& hash);
  uint8_t* BlockData(int32_t block) const;

  BlockPool* pool_;
  KvStorage* kv_;
  Backend* backend_;
  std::unique_ptr<FlashStore> flash_;
  std::unique_ptr<HostKvTier> host_;
  std::vector<uint8_t> staging_;  // one block, host side (pinned memory under CUDA, later)
  // Written by the engine thread, read by GetStats.
  std::atomic<int64_t> demoted_{0}, demote_failures_{0}, promoted_ddr_{0}, promoted_flash_{0};
  std::atomic<int64_t> demote_ns_{0}, promote_ddr_ns_{0}, promote_flash_ns_{0};
};

}  // namespace moeserve
