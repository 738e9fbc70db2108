// The KV tiers below the device pool: host DDR over an optional flash directory, and the
// transfer executor that runs the copies the scheduler plans (kvcache/kv_transfers.h).
//
// - Demotion: cached prefix blocks that the device pool evicts are copied down to DDR (and
//   from there, by the DDR tier's transfer thread, to flash), with their retention deadline.
// - Promotion: a prefix lookup that misses the device but finds the block below brings it back
//   before the step that needs it; a queued request's prefix is prefetched from flash into DDR
//   by the transfer thread while earlier steps compute (Prefetch).
// - Swap: a preempted sequence's whole KV (partial last block included) can be parked in DDR
//   slots and copied back when it is readmitted (the scheduler's PreemptionPolicy decides,
//   engine/preemption_policy.h).
// Device copies go through the backend's copy stream (Backend::CopyAsync) to and from pinned
// host memory (the DDR slab and the staging buffers come from Backend::AllocateHost): on a GPU
// they are DMA beside the compute stream, ordered against it by events; on the CPU, memcpy.
// Promotions and swap-ins are ordered before the next step's compute without blocking the
// host; the host waits only where it must touch the host side (demotion's staging block, a
// reused promotion buffer, swap slots being returned). Flash I/O runs on the transfer thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "kvcache/block_pool.h"
#include "kvcache/flash_store.h"
#include "kvcache/host_tier.h"
#include "kvcache/kv_storage.h"
#include "kvcache/kv_transfers.h"

namespace moeserve {

enum class PreemptionMode { kAuto, kSwap, kRecompute };
const char* PreemptionModeName(PreemptionMode m);
absl::StatusOr<PreemptionMode> ParsePreemptionMode(const std::string& name);

struct KvTierConfig {
  uint64_t host_bytes = 0;     // DDR budget; 0 with a flash dir: blocks go straight to flash
  std::string flash_dir;       // empty: no flash tier
  uint64_t flash_bytes = 1ull << 30;
  bool async_flash = true;     // flash writes and prefetch reads on a transfer thread
  bool purge_foreign_flash = false;  // delete other models' records found in flash_dir
  PreemptionMode preemption = PreemptionMode::kAuto;
  bool enabled() const { return host_bytes > 0 || !flash_dir.empty(); }
};

// Where the device pool's blocks live: the single-device layout of a whole block (every layer),
// the pieces of each block on the devices, and every device of this process that holds blocks
// (host memory for the tiers comes from the first). Under mpirun, the pieces other processes
// hold travel through `remote`: the tiers (DDR, flash) are rank 0's and hold whole blocks, the
// same records as with in-process ranks.
struct KvTierDevices {
  KvLayout layout;
  KvBlockParts parts;
  std::vector<Backend*> backends;
  KvRemotePieces* remote = nullptr;  // null: every piece is in this process
  // One device: the engine's own cache.
  static KvTierDevices Single(KvStorage* kv, Backend* backend);
};

struct KvTierStats {
  HostTierStats host;
  FlashStoreStats flash;
  bool has_flash = false;
  int64_t demoted = 0, demote_failures = 0;
  int64_t promoted_ddr = 0, promoted_flash = 0, promote_failures = 0;
  int64_t prefetch_requests = 0;
  // Preemption decisions (the scheduler's policy's, filled in by the engine) and swaps.
  int64_t swap_decisions = 0, recompute_decisions = 0;
  int64_t swapped_out = 0, swapped_in = 0, swap_failures = 0;  // sequences
  int64_t swap_out_blocks = 0, swap_in_blocks = 0;
  // Measured copies, for bandwidth: seconds per direction and tier.
  double demote_seconds = 0, promote_ddr_seconds = 0, promote_flash_seconds = 0;
  double swap_out_seconds = 0, swap_in_seconds = 0;
  int64_t block_bytes = 0;
};

class KvTiers final : public KvTierView {
 public:
  // Opens the flash store (scanning what an earlier run left) and sizes the DDR slab. `pool`
  // is only read (which blocks the device holds, for Prefetch).
  static absl::StatusOr<std::unique_ptr<KvTiers>> Create(const KvTierConfig& config, uint64_t fingerprint,
                                                         const BlockPool* pool, KvTierDevices devices,
                                                         WallClock clock = WallSeconds);
  // Waits for copies still in flight (they may target host buffers freed with this object).
  ~KvTiers() override;


  // KvTierView.
  std::optional<KvTier> Find(const BlockHash& hash) const override { return host_->Find(hash); }
  int64_t swap_capacity() const override { return host_->stats().capacity_blocks; }

  // Runs one step's transfers in list order and orders the devices' compute after their
  // copies; one outcome per transfer. A failed promotion or swap-in leaves its blocks'
  // contents undefined (the scheduler recomputes them); a failed demotion only loses a cache
  // entry. A block whose promotion failed is never demoted afterwards.
  std::vector<KvTransferOutcome> Execute(const std::vector<KvTransfer>& transfers);

  // Starts reading from flash the blocks among `hashes` (a prompt's leading full blocks) that
  // the device pool's `segment` lacks.
  void Prefetch(std::span<const BlockHash> hashes, int64_t segment);
  // Waits for the transfer thread's queued work (tests and benchmarks).
  void Flush() { host_->Flush(); }
  // Device -> host copy bandwidth measured at creation (one block, a few times), the swap
  // cost model's fallback when the hardware profile gives no host link.
  double measured_link_bytes_per_second() const { return measured_link_; }
  // Bytes of one whole block over every device that holds a piece of it (what a swap copies).
  size_t block_bytes() const { return devices_.layout.BlockBytes(); }
  // Bytes copied between the device and the tiers since the last call (the step's transfers).
  int64_t TakeTransferBytes() { return transfer_bytes_.exchange(0); }
  // Host seconds spent in those copies (the waits they needed included), since the last call.
  double TakeTransferSeconds() { return static_cast<double>(transfer_ns_.exchange(0)) * 1e-9; }
  KvTierStats stats() const;

 private:
  // Copies in flight, per device: the last ticket of each backend that a buffer depends on.
  using Tickets = std::vector<std::pair<Backend*, uint64_t>>;
  // Device blocks whose contents are undefined after a failed copy into them, this Execute.
  using Spoiled = std::unordered_set<int32_t>;

  KvTiers(const KvTierConfig& config, const BlockPool* pool, KvTierDevices devices)
      : config_(config), pool_(pool), devices_(std::move(devices)) {}
  void Demote(const BlockEviction& e, const Spoiled& spoiled);
  KvTransferOutcome Promote(const KvTransfer& t, Spoiled* spoiled);
  KvTransferOutcome SwapOut(const std::vector<int32_t>& blocks);
  bool SwapIn(const std::vector<int32_t>& blocks, const std::vector<int64_t>& slots, Spoiled* spoiled);
  // Returns swap slots to the DDR tier once the copies out of them are done.
  void FreeSwap(const std::vector<int64_t>& slots);
  // Enqueues the copies of every piece of `block` to (to_host) or from a whole host block and
  // notes their tickets; false if a copy could not be enqueued.
  bool CopyBlock(int32_t block, uint8_t* host, bool to_host, Tickets* tickets);
  // Remote pieces: fetches those of `blocks` before a list reads them; after the list, writes
  // back those it wrote (an error: they did not arrive, and the job is lost).
  absl::Status FetchRemote(const std::vector<int32_t>& blocks);
  absl::Status CommitRemote();
  // Books a finished tier copy: its bytes and time for the step, its time for its kind.
  void BookTransfer(int64_t bytes, int64_t ns, std::atomic<int64_t>* kind_ns);
  bool Wait(const Tickets& tickets);
  // Compute on every device waits for the copies issued so far.
  void OrderCompute();

  KvTierConfig config_;
  const BlockPool* pool_;
  KvTierDevices devices_;
  std::vector<KvBlockPart> parts_;  // scratch for one block
  std::unique_ptr<FlashStore> flash_;
  std::unique_ptr<HostKvTier> host_;
  // Host-side blocks (pinned under CUDA). Demotion's: one. Promotion's: a ring, so that reading
  // the next block from DDR or flash overlaps the copy of the previous one to the device (each
  // waits for its previous copy before reuse); apart from demotion's, as a promotion's own
  // allocation may demote.
  static constexpr int kPromoteRing = 4;
  HostBuffer staging_;
  HostBuffer promote_staging_[kPromoteRing];
  Tickets promote_tickets_[kPromoteRing];
  int promote_next_ = 0;
  // The copies into and out of swap slots: slots go back to the DDR tier only after them.
  Tickets swap_tickets_;
  double measured_link_ = 0;
  std::atomic<int64_t> transfer_bytes_{0}, transfer_ns_{0};
  // Written by the engine thread, read by GetStats.
  std::atomic<int64_t> demoted_{0}, demote_failures_{0}, promoted_ddr_{0}, promoted_flash_{0};
  std::atomic<int64_t> promote_failures_{0};
  std::atomic<int64_t> prefetch_requests_{0};
  std::atomic<int64_t> swapped_out_{0}, swapped_in_{0}, swap_failures_{0}, swap_out_blocks_{0}, swap_in_blocks_{0};
  std::atomic<int64_t> demote_ns_{0}, promote_ddr_ns_{0}, promote_flash_ns_{0}, swap_out_ns_{0}, swap_in_ns_{0};
};

}  // namespace moeserve
