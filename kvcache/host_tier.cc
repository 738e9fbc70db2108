// Host DDR tier.
#include "kvcache/host_tier.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeserve {

const char* KvTierName(KvTier t) {
  switch (t) {
    case KvTier::kDevice: return "device";
    case KvTier::kHost: return "ddr";
    case KvTier::kFlash: return "flash";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<HostKvTier>> HostKvTier::Create(const HostTierOptions& options, FlashStore* flash) {
  if (options.block_bytes == 0) return absl::InvalidArgumentError("host KV tier: block_bytes is 0");
  const int64_t slots = static_cast<int64_t>(options.budget_bytes / options.block_bytes);
  if (slots < 1 && flash == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("host KV tier: a budget of ", options.budget_bytes,
                                                   " bytes holds no block of ", options.block_bytes, " bytes"));
  }
  return std::unique_ptr<HostKvTier>(new HostKvTier(options, flash, slots));
}

HostKvTier::HostKvTier(const HostTierOptions& options, FlashStore* flash, int64_t slots)
    : options_(options), flash_(flash), slab_(static_cast<size_t>(slots) * options.block_bytes) {
  for (int64_t s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
  stats_.capacity_blocks = slots;
}

int64_t HostKvTier::TakeSlotLocked() {
  if (!free_slots_.empty()) {
    const int64_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  // Demote the least recently used block to flash, or drop it.
  const BlockHash victim = lru_.back();
  const Entry e = index_.at(victim);
  const uint8_t* data = slab_.data() + static_cast<size_t>(e.slot) * options_.block_bytes;
  if (flash_ != nullptr &&
      flash_->Put(victim, 0, options_.num_layers, options_.dtype, options_.block_tokens, data, options_.block_bytes)
          .ok()) {
    ++stats_.demoted_to_flash;
  } else {
    ++stats_.dropped;
  }
  lru_.pop_back();
  index_.erase(victim);
  return e.slot;
}

void HostKvTier::StoreLocked(const BlockHash& hash, const void* data) {
  auto it = index_.find(hash);
  int64_t slot;
  if (it != index_.end()) {
    slot = it->second.slot;
    lru_.erase(it->second.lru);
  } else {
    slot = TakeSlotLocked();
  }
  std::memcpy(slab_.data() + static_cast<size_t>(slot) * options_.block_bytes, data, options_.block_bytes);
  lru_.push_front(hash);
  index_[hash] = Entry{slot, lru_.begin()};
  stats_.blocks = static_cast<int64_t>(index_.size());
}

absl::Status HostKvTier::Put(const BlockHash& hash, const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.capacity_blocks == 0) {  // no DDR: straight to flash
    if (flash_ == nullptr) return absl::FailedPreconditionError("host KV tier has no room and no flash tier");
    return flash_->Put(hash, 0, options_.num_layers, options_.dtype, options_.block_tokens, data, options_.block_bytes);
  }
  StoreLocked(hash, data);
  return absl::OkStatus();
}

absl::StatusOr<KvTier> HostKvTier::Get(const BlockHash& hash, void* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(hash);
  if (it != index_.end()) {
    std::memcpy(out, slab_.data() + static_cast<size_t>(it->second.slot) * options_.block_bytes, options_.block_bytes);
    lru_.erase(it->second.lru);
    lru_.push_front(hash);
    it->second.lru = lru_.begin();
    ++stats_.host_hits;
    return KvTier::kHost;
  }
  if (flash_ != nullptr && flash_->Get(hash, out, options_.block_bytes).ok()) {
    ++stats_.flash_hits;
    if (stats_.capacity_blocks > 0) StoreLocked(hash, out);  // likely to be read again soon
    return KvTier::kFlash;
  }
  ++stats_.misses;
  return absl::NotFoundError("block in no lower tier");
}

bool HostKvTier::Contains(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(hash) > 0 || (flash_ != nullptr && flash_->Contains(hash));
}

HostTierStats HostKvTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace moeserve
