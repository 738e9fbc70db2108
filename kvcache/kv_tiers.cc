// Engine KV tiers.
#include "kvcache/kv_tiers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {
namespace {

int64_t Nanos(const Stopwatch& sw) { return static_cast<int64_t>(sw.Seconds() * 1e9); }

// Tickets keep, per backend, the latest copy: waiting for it waits for the earlier ones too.
void Note(Backend* b, uint64_t ticket, std::vector<std::pair<Backend*, uint64_t>>* tickets) {
  for (auto& [backend, t] : *tickets) {
    if (backend == b) {
      t = std::max(t, ticket);
      return;
    }
  }
  tickets->emplace_back(b, ticket);
}

// The blocks a transfer list copies out of the device: demotions, swap-outs, and the evictions
// of promotions.
std::vector<int32_t> BlocksRead(const std::vector<KvTransfer>& transfers) {
  std::vector<int32_t> read;
  for (const KvTransfer& t : transfers) {
    if (t.kind == KvTransfer::Kind::kDemote || t.kind == KvTransfer::Kind::kSwapOut) {
      read.insert(read.end(), t.blocks.begin(), t.blocks.end());
    }
    for (const BlockEviction& e : t.evicted) read.push_back(e.block);
  }
  return read;
}

}  // namespace

const char* PreemptionModeName(PreemptionMode m) {
  switch (m) {
    case PreemptionMode::kAuto: return "auto";
    case PreemptionMode::kSwap: return "swap";
    case PreemptionMode::kRecompute: return "recompute";
  }
  return "?";
}

absl::StatusOr<PreemptionMode> ParsePreemptionMode(const std::string& name) {
  for (PreemptionMode m : {PreemptionMode::kAuto, PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    if (name == PreemptionModeName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("--preemption must be auto, swap or recompute, got '", name, "'"));
}

KvTierDevices KvTierDevices::Single(KvStorage* kv, Backend* backend) {
  KvTierDevices d;
  d.layout = kv->layout();
  const size_t bytes = kv->layout().BlockBytes();
  uint8_t* base = static_cast<uint8_t*>(kv->data());
  d.parts = [backend, base, bytes](int32_t block, std::vector<KvBlockPart>* parts) {
    parts->assign(1, KvBlockPart{backend, base + static_cast<size_t>(block) * bytes, bytes});
  };
  d.backends = {backend};
  return d;
}

absl::StatusOr<std::unique_ptr<KvTiers>> KvTiers::Create(const KvTierConfig& config, uint64_t fingerprint,
                                                         const BlockPool* pool, KvTierDevices devices,
                                                         WallClock clock) {
  if (devices.backends.empty() || !devices.parts) return absl::InvalidArgumentError("KV tiers: no device");
  std::unique_ptr<KvTiers> t(new KvTiers(config, pool, std::move(devices)));
  const KvLayout& layout = t->devices_.layout;
  if (!config.flash_dir.empty()) {
    FlashStoreOptions fo{config.flash_dir, config.flash_bytes, fingerprint, clock};
    fo.expect_layers = static_cast<uint32_t>(layout.num_layers);
    fo.expect_block_tokens = static_cast<uint32_t>(layout.block_size);
    fo.expect_dtype = static_cast<int>(layout.dtype);
    fo.purge_foreign = config.purge_foreign_flash;
    auto flash = FlashStore::Open(fo);
    if (!flash.ok()) return absl::InvalidArgumentError(absl::StrCat("--flash-kv-dir: ", flash.status().message()));
    t->flash_ = std::move(*flash);
  }
  Backend* host_backend = t->devices_.backends.front();
  auto allocate = [host_backend](size_t bytes) { return host_backend->AllocateHost(bytes); };
  HostTierOptions ho;
  ho.budget_bytes = config.host_bytes;
  ho.block_bytes = layout.BlockBytes();
  ho.num_layers = static_cast<uint32_t>(layout.num_layers);
  ho.dtype = layout.dtype;
  ho.block_tokens = static_cast<uint32_t>(layout.block_size);
  ho.async = config.async_flash;
  ho.clock = clock;
  ho.allocate = allocate;
  auto host = HostKvTier::Create(ho, t->flash_.get());
  if (!host.ok()) return absl::InvalidArgumentError(absl::StrCat("--host-kv-mb: ", host.status().message()));
  t->host_ = std::move(*host);
  const size_t block_bytes = layout.BlockBytes();
  ASSIGN_OR_RETURN(t->staging_, allocate(block_bytes));
  for (HostBuffer& b : t->promote_staging_) {
    ASSIGN_OR_RETURN(b, allocate(block_bytes));
  }
  // The host link as the devices see it: a few copies of block 0 (its contents do not matter).
  Stopwatch sw;
  Tickets tickets;
  for (int i = 0; i < 8; ++i) {
    absl::Status s = t->FetchRemote({0});
    if (s.ok() && !t->CopyBlock(0, t->staging_.data(), /*to_host=*/true, &tickets)) s = absl::InternalError("a copy failed");
    if (s.ok()) s = t->CommitRemote();
    if (!s.ok()) {
      (void)t->Wait(tickets);  // earlier copies into the staging block must land before it is freed
      return absl::InternalError(absl::StrCat("KV tiers: a test copy failed: ", s.message()));
    }
  }
  if (!t->Wait(tickets)) return absl::InternalError("KV tiers: a test copy failed");
  t->measured_link_ = 8.0 * static_cast<double>(block_bytes) / std::max(sw.Seconds(), 1e-9);
  return t;
}

KvTiers::~KvTiers() {
  (void)Wait(swap_tickets_);
  for (const Tickets& t : promote_tickets_) (void)Wait(t);
}

bool KvTiers::CopyBlock(int32_t block, uint8_t* host, bool to_host, Tickets* tickets) {
  devices_.parts(block, &parts_);
  size_t offset = 0;
  for (const KvBlockPart& p : parts_) {
    if (p.remote()) {  // held by another process: its copy fetched for this list
      if (to_host && !devices_.remote->Read(p, host + offset)) return false;
      if (!to_host) devices_.remote->Write(p, host + offset);
      offset += p.bytes;
      continue;
    }
    auto t = to_host ? p.backend->CopyAsync(host + offset, p.data, p.bytes)
                     : p.backend->CopyAsync(p.data, host + offset, p.bytes);
    if (!t.ok()) return false;
    Note(p.backend, *t, tickets);
    offset += p.bytes;
  }
  return true;
}

void KvTiers::BookTransfer(int64_t bytes, int64_t ns, std::atomic<int64_t>* kind_ns) {
  transfer_bytes_ += bytes;
  transfer_ns_ += ns;
  *kind_ns += ns;
}

absl::Status KvTiers::FetchRemote(const std::vector<int32_t>& blocks) {
  if (devices_.remote == nullptr || blocks.empty()) return absl::OkStatus();
  std::vector<KvBlockPart> pieces;
  for (int32_t b : blocks) {
    devices_.parts(b, &parts_);
    for (const KvBlockPart& p : parts_) {
      if (p.remote()) pieces.push_back(p);
    }
  }
  return pieces.empty() ? absl::OkStatus() : devices_.remote->Fetch(pieces);
}

absl::Status KvTiers::CommitRemote() {
  return devices_.remote == nullptr ? absl::OkStatus() : devices_.remote->Commit();
}

bool KvTiers::Wait(const Tickets& tickets) {
  bool ok = true;
  for (const auto& [backend, t] : tickets) ok = backend->WaitCopy(t).ok() && ok;
  return ok;
}

void KvTiers::OrderCompute() {
  for (Backend* b : devices_.backends) b->OrderComputeAfterCopies();
}

std::vector<KvTransferOutcome> KvTiers::Execute(const std::vector<KvTransfer>& transfers) {
  std::vector<KvTransferOutcome> outcomes(transfers.size());
  Spoiled spoiled;
  // Remote pieces that the list reads are fetched before any of its writes; a failed fetch
  // fails the copies out of them (the job is lost: its steps fail too).
  if (devices_.remote != nullptr) (void)FetchRemote(BlocksRead(transfers));
  for (size_t i = 0; i < transfers.size(); ++i) {
    const KvTransfer& t = transfers[i];
    switch (t.kind) {
      case KvTransfer::Kind::kDemote:
        Demote(BlockEviction{t.blocks[0], t.hash, t.retain_until}, spoiled);
        break;
      case KvTransfer::Kind::kPromote:
        outcomes[i] = Promote(t, &spoiled);
        break;
      case KvTransfer::Kind::kSwapOut:
        outcomes[i] = SwapOut(t.blocks);
        break;
      case KvTransfer::Kind::kSwapIn:
        outcomes[i].ok = SwapIn(t.blocks, t.slots, &spoiled);
        break;
      case KvTransfer::Kind::kFreeSwap:
        FreeSwap(t.slots);
        break;
    }
  }
  if (!CommitRemote().ok()) {  // the promoted and swapped-in pieces did not all arrive
    for (size_t i = 0; i < transfers.size(); ++i) {
      const KvTransfer::Kind k = transfers[i].kind;
      if (k == KvTransfer::Kind::kPromote || k == KvTransfer::Kind::kSwapIn) outcomes[i].ok = false;
    }
  }
  // The step reads the promoted and swapped-in blocks and may overwrite the demoted and
  // swapped-out ones: its compute runs after every copy above.
  if (!transfers.empty()) OrderCompute();
  return outcomes;
}

void KvTiers::Demote(const BlockEviction& e, const Spoiled& spoiled) {
  if (spoiled.count(e.block) > 0) return;  // not the block the hash names: keep nothing
  Stopwatch sw;
  // The block's new owner may overwrite it in the next step: the copy must be done first, and
  // the host reads the staging block at once, so this one waits.
  Tickets tickets;
  const bool copied = CopyBlock(e.block, staging_.data(), /*to_host=*/true, &tickets);
  if (!Wait(tickets) || !copied || !host_->Put(e.hash, staging_.data(), e.retain_until).ok()) {
    ++demote_failures_;  // the block is simply lost to the cache, as without tiers
    return;
  }
  ++demoted_;
  BookTransfer(static_cast<int64_t>(staging_.bytes()), Nanos(sw), &demote_ns_);
}

KvTransferOutcome KvTiers::Promote(const KvTransfer& t, Spoiled* spoiled) {
  KvTransferOutcome o;
  const int32_t block = t.blocks[0];
  // Take the block out of DDR first, so that the demotions its allocation caused land in the
  // slot it frees instead of pushing another block (maybe the prefix's next) out.
  Stopwatch read;
  const int i = promote_next_;
  promote_next_ = (promote_next_ + 1) % kPromoteRing;
  HostBuffer& buf = promote_staging_[i];
  const bool reusable = Wait(promote_tickets_[i]);  // its last copies read it
  promote_tickets_[i].clear();
  absl::StatusOr<KvTier> tier = absl::UnavailableError("a copy out of the staging buffer failed");
  if (reusable) tier = host_->Get(t.hash, buf.data(), &o.retain_until, /*take=*/true);
  const double read_seconds = read.Seconds();
  for (const BlockEviction& e : t.evicted) Demote(e, *spoiled);  // untimed, as part of the allocation
  Stopwatch copy;
  if (!tier.ok() || !CopyBlock(block, buf.data(), /*to_host=*/false, &promote_tickets_[i])) {
    if (tier.ok()) {
      (void)Wait(promote_tickets_[i]);  // a piece may have been enqueued before the failure
      (void)host_->Put(t.hash, buf.data(), o.retain_until);  // put it back where it was
    }
    spoiled->insert(block);
    ++promote_failures_;
    o.ok = false;
    return o;
  }
  spoiled->erase(block);
  o.tier = *tier;
  (o.tier == KvTier::kFlash ? promoted_flash_ : promoted_ddr_).fetch_add(1);
  BookTransfer(static_cast<int64_t>(buf.bytes()), static_cast<int64_t>((read_seconds + copy.Seconds()) * 1e9),
               o.tier == KvTier::kFlash ? &promote_flash_ns_ : &promote_ddr_ns_);
  return o;
}

void KvTiers::Prefetch(std::span<const BlockHash> hashes, int64_t segment) {
  std::vector<BlockHash> wanted;
  for (const BlockHash& h : hashes) {
    if (!pool_->Lookup(h, segment).has_value()) wanted.push_back(h);
  }
  if (wanted.empty()) return;
  prefetch_requests_ += static_cast<int64_t>(wanted.size());
  host_->Prefetch(wanted);
}

KvTransferOutcome KvTiers::SwapOut(const std::vector<int32_t>& blocks) {
  KvTransferOutcome o;
  const int64_t n = static_cast<int64_t>(blocks.size());
  auto slots = host_->ReserveSwap(n);
  if (!slots.ok()) {
    ++swap_failures_;
    o.ok = false;
    return o;
  }
  Stopwatch sw;
  const size_t bytes = devices_.layout.BlockBytes();
  // DMA straight into the (pinned) slots; the blocks go back to the pool at once, so compute
  // that may reuse them is ordered after these copies. Nobody reads the slots until SwapIn.
  for (int64_t i = 0; i < n; ++i) {
    if (!CopyBlock(blocks[i], host_->SwapData((*slots)[i]), /*to_host=*/true, &swap_tickets_)) {
      FreeSwap(*slots);  // after the copies already issued into these slots
      ++swap_failures_;
      o.ok = false;
      return o;
    }
  }
  o.slots = std::move(*slots);
  ++swapped_out_;
  swap_out_blocks_ += n;
  BookTransfer(static_cast<int64_t>(n * bytes), Nanos(sw), &swap_out_ns_);
  return o;
}

bool KvTiers::SwapIn(const std::vector<int32_t>& blocks, const std::vector<int64_t>& slots, Spoiled* spoiled) {
  Stopwatch sw;
  const size_t bytes = devices_.layout.BlockBytes();
  const int64_t n = static_cast<int64_t>(slots.size());
  bool ok = n <= static_cast<int64_t>(blocks.size());
  for (int64_t i = 0; ok && i < n; ++i) {
    ok = CopyBlock(blocks[i], host_->SwapData(slots[i]), /*to_host=*/false, &swap_tickets_);
  }
  FreeSwap(slots);  // waits for the copies out of the slots before the DDR tier reuses them
  if (!ok) {
    for (int32_t b : blocks) spoiled->insert(b);
    ++swap_failures_;
    return false;
  }
  ++swapped_in_;
  swap_in_blocks_ += n;
  BookTransfer(static_cast<int64_t>(n * bytes), Nanos(sw), &swap_in_ns_);
  return true;
}

void KvTiers::FreeSwap(const std::vector<int64_t>& slots) {
  if (slots.empty()) return;
  // A failed wait means a device fault; the slots are returned anyway (the step will fail).
  (void)Wait(swap_tickets_);
  swap_tickets_.clear();
  host_->FreeSwap(slots);
}

KvTierStats KvTiers::stats() const {
  KvTierStats s;
  s.host = host_->stats();
  if (flash_ != nullptr) {
    s.flash = flash_->stats();
    s.has_flash = true;
  }
  s.demoted = demoted_;
  s.demote_failures = demote_failures_;
  s.promoted_ddr = promoted_ddr_;
  s.promoted_flash = promoted_flash_;
  s.promote_failures = promote_failures_;
  s.prefetch_requests = prefetch_requests_;
  s.swapped_out = swapped_out_;
  s.swapped_in = swapped_in_;
  s.swap_failures = swap_failures_;
  s.swap_out_blocks = swap_out_blocks_;
  s.swap_in_blocks = swap_in_blocks_;
  s.demote_seconds = demote_ns_.load() * 1e-9;
  s.promote_ddr_seconds = promote_ddr_ns_.load() * 1e-9;
  s.promote_flash_seconds = promote_flash_ns_.load() * 1e-9;
  s.swap_out_seconds = swap_out_ns_.load() * 1e-9;
  s.swap_in_seconds = swap_in_ns_.load() * 1e-9;
  s.block_bytes = static_cast<int64_t>(devices_.layout.BlockBytes());
  return s;
}

}  // namespace moeserve
