// Engine KV tiers.
#include "engine/kv_tiers.h"

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {

absl::StatusOr<std::unique_ptr<KvTiers>> KvTiers::Create(const KvTierConfig& config, uint64_t fingerprint,
                                                         BlockPool* pool, KvStorage* kv, Backend* backend) {
  std::unique_ptr<KvTiers> t(new KvTiers(pool, kv, backend));
  const KvLayout& layout = kv->layout();
  if (!config.flash_dir.empty()) {
    auto flash = FlashStore::Open({config.flash_dir, config.flash_bytes, fingerprint});
    if (!flash.ok()) return absl::InvalidArgumentError(absl::StrCat("--flash-kv-dir: ", flash.status().message()));
    t->flash_ = std::move(*flash);
  }
  HostTierOptions ho;
  ho.budget_bytes = config.host_bytes;
  ho.block_bytes = layout.BlockBytes();
  ho.num_layers = static_cast<uint32_t>(layout.num_layers);
  ho.dtype = layout.dtype;
  ho.block_tokens = static_cast<uint32_t>(layout.block_size);
  auto host = HostKvTier::Create(ho, t->flash_.get());
  if (!host.ok()) return absl::InvalidArgumentError(absl::StrCat("--host-kv-mb: ", host.status().message()));
  t->host_ = std::move(*host);
  t->staging_.resize(layout.BlockBytes());
  return t;
}

void KvTiers::Attach() {
  pool_->SetEvictionObserver([this](int32_t block, const BlockHash& hash) { Demote(block, hash); });
}

uint8_t* KvTiers::BlockData(int32_t block) const {
  return static_cast<uint8_t*>(kv_->data()) + static_cast<size_t>(block) * kv_->layout().BlockBytes();
}

void KvTiers::Demote(int32_t block, const BlockHash& hash) {
  Stopwatch sw;
  if (!backend_->CopyToHost(staging_.data(), BlockData(block), staging_.size()).ok() ||
      !host_->Put(hash, staging_.data()).ok()) {
    ++demote_failures_;  // the block is simply lost to the cache, as without tiers
    return;
  }
  ++demoted_;
  demote_ns_ += static_cast<int64_t>(sw.Seconds() * 1e9);
}

std::optional<std::pair<int32_t, KvTier>> KvTiers::Promote(const BlockHash& hash) {
  if (!host_->Contains(hash)) return std::nullopt;
  auto got = pool_->Allocate(1);  // may demote another cached block, never one in use
  if (!got.ok()) return std::nullopt;
  const int32_t block = (*got)[0];
  Stopwatch sw;
  auto tier = host_->Get(hash, staging_.data());
  if (!tier.ok() || !backend_->CopyToDevice(BlockData(block), staging_.data(), staging_.size()).ok()) {
    pool_->Release(block);  // unhashed: back to free
    return std::nullopt;
  }
  pool_->Register(block, hash);
  (*tier == KvTier::kFlash ? promoted_flash_ : promoted_ddr_).fetch_add(1);
  (*tier == KvTier::kFlash ? promote_flash_ns_ : promote_ddr_ns_).fetch_add(static_cast<int64_t>(sw.Seconds() * 1e9));
  return std::make_pair(block, *tier);
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
  s.demote_seconds = demote_ns_.load() * 1e-9;
  s.promote_ddr_seconds = promote_ddr_ns_.load() * 1e-9;
  s.promote_flash_seconds = promote_flash_ns_.load() * 1e-9;
  s.block_bytes = static_cast<int64_t>(staging_.size());
  return s;
}

}  // namespace moeserve
