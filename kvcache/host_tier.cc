// Host DDR tier.
#include "kvcache/host_tier.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

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
  if (options.max_pending_writes < 0) return absl::InvalidArgumentError("host KV tier: max_pending_writes < 0");
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(slots, 0)) * options.block_bytes;
  HostBuffer slab;
  if (options.allocate) {
    ASSIGN_OR_RETURN(slab, options.allocate(bytes));
  } else {
    slab = HostBuffer::Plain(bytes);
  }
  if (slab.empty() || slab.bytes() < bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("host KV tier: cannot allocate a slab of ", bytes, " bytes"));
  }
  return std::unique_ptr<HostKvTier>(new HostKvTier(options, flash, std::move(slab), slots));
}

HostKvTier::HostKvTier(const HostTierOptions& options, FlashStore* flash, HostBuffer slab, int64_t slots)
    : options_(options), flash_(flash), slab_(std::move(slab)) {
  for (int64_t s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
  stats_.capacity_blocks = slots;
  if (options_.async && flash_ != nullptr) thread_ = std::thread([this] { TransferLoop(); });
}

HostKvTier::~HostKvTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    prefetch_queue_.clear();  // reads are only hints; writes are finished below
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t HostKvTier::TakeSlotLocked() {
  if (!free_slots_.empty()) {
    const int64_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  // The least recently used block whose retention has passed, else the least recently used.
  const std::optional<BlockHash> victim = blocks_.Victim(options_.clock(), /*may_take_retained=*/true);
  if (!victim) return -1;  // every slot is lent to swap
  const auto e = *blocks_.Take(*victim);
  ToFlashLocked(*victim, Slot(e.value), e.retain_until);
  stats_.blocks = static_cast<int64_t>(blocks_.size());
  return e.value;
}

void HostKvTier::ToFlashLocked(const BlockHash& hash, const void* data, double retain_until) {
  if (flash_ == nullptr) {
    ++stats_.dropped;
    return;
  }
  if (thread_.joinable() && static_cast<int64_t>(pending_.size()) < options_.max_pending_writes) {
    const auto* p = static_cast<const uint8_t*>(data);
    pending_[hash] = Pending{std::make_shared<const std::vector<uint8_t>>(p, p + options_.block_bytes), retain_until};
    write_queue_.push_back(hash);
    stats_.pending_writes = static_cast<int64_t>(pending_.size());
    cv_.notify_all();
    return;
  }
  Stopwatch sw;
  const bool ok = flash_->Put(hash, 0, options_.num_layers, options_.dtype, options_.block_tokens, data,
                              options_.block_bytes, retain_until)
                      .ok();
  stats_.flash_write_seconds += sw.Seconds();
  ++(ok ? stats_.demoted_to_flash : stats_.dropped);
}

bool HostKvTier::StoreLocked(const BlockHash& hash, const void* data, double retain_until) {
  int64_t slot;
  if (const auto* e = blocks_.Find(hash, /*touch=*/false)) {
    slot = e->value;
    retain_until = std::max(retain_until, e->retain_until);
  } else {
    slot = TakeSlotLocked();
    if (slot < 0) return false;
  }
  std::memcpy(Slot(slot), data, options_.block_bytes);
  blocks_.Put(hash, slot, retain_until);
  stats_.blocks = static_cast<int64_t>(blocks_.size());
  return true;
}

absl::Status HostKvTier::Put(const BlockHash& hash, const void* data, double retain_until) {
  std::lock_guard<std::mutex> lock(mu_);
  if (StoreLocked(hash, data, retain_until)) return absl::OkStatus();
  // No DDR slot (no DDR budget, or every slot lent to swap): straight to flash.
  if (flash_ == nullptr) return absl::FailedPreconditionError("host KV tier has no room and no flash tier");
  ToFlashLocked(hash, data, retain_until);
  return absl::OkStatus();
}

absl::StatusOr<KvTier> HostKvTier::Get(const BlockHash& hash, void* out, double* retain_until, bool take) {
  std::unique_lock<std::mutex> lock(mu_);
  if (const auto* e = blocks_.Find(hash, /*touch=*/!take)) {
    std::memcpy(out, Slot(e->value), options_.block_bytes);
    if (retain_until != nullptr) *retain_until = e->retain_until;
    if (take) {
      free_slots_.push_back(e->value);
      blocks_.Erase(hash);
      stats_.blocks = static_cast<int64_t>(blocks_.size());
    }
    ++stats_.host_hits;
    return KvTier::kHost;
  }
  if (auto it = pending_.find(hash); it != pending_.end()) {  // pushed out, not yet on flash
    std::memcpy(out, it->second.data->data(), options_.block_bytes);
    if (retain_until != nullptr) *retain_until = it->second.retain_until;
    ++stats_.host_hits;
    return KvTier::kHost;
  }
  if (flash_ == nullptr) {
    ++stats_.misses;
    return absl::NotFoundError("block in no lower tier");
  }
  // Read flash without holding the lock, so the transfer thread is not held up.
  lock.unlock();
  double until = 0;
  Stopwatch sw;
  const bool hit = flash_->Get(hash, out, options_.block_bytes, &until).ok();
  const double took = sw.Seconds();
  lock.lock();
  stats_.flash_read_seconds += took;
  ++stats_.flash_reads;
  if (!hit) {
    ++stats_.misses;
    return absl::NotFoundError("block in no lower tier");
  }
  ++stats_.flash_hits;
  if (!take) StoreLocked(hash, out, until);  // likely to be read again soon
  if (retain_until != nullptr) *retain_until = until;
  return KvTier::kFlash;
}

std::optional<KvTier> HostKvTier::Find(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (blocks_.Contains(hash) || pending_.count(hash) > 0) return KvTier::kHost;
  if (flash_ != nullptr && flash_->Contains(hash)) return KvTier::kFlash;
  return std::nullopt;
}

void HostKvTier::Prefetch(const std::vector<BlockHash>& hashes) {
  if (!thread_.joinable() || stats_.capacity_blocks == 0) return;  // nowhere to prefetch into
  std::lock_guard<std::mutex> lock(mu_);
  for (const BlockHash& h : hashes) {
    if (blocks_.Contains(h) || pending_.count(h)) continue;
    prefetch_queue_.push_back(h);
    ++stats_.prefetch_requests;
  }
  cv_.notify_all();
}

void HostKvTier::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return write_queue_.empty() && prefetch_queue_.empty() && in_flight_ == 0; });
}

void HostKvTier::TransferLoop() {
  std::vector<uint8_t> buffer(options_.block_bytes);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.notify_all();  // whatever the last pass did, Flush may now be satisfied
    cv_.wait(lock, [&] { return stop_ || !write_queue_.empty() || !prefetch_queue_.empty(); });
    if (!write_queue_.empty()) {  // writes first: they free memory and make blocks durable
      const BlockHash hash = write_queue_.front();
      write_queue_.pop_front();
      auto it = pending_.find(hash);
      if (it == pending_.end()) continue;
      const Pending p = it->second;
      ++in_flight_;
      lock.unlock();
      Stopwatch sw;
      const bool ok = flash_->Put(hash, 0, options_.num_layers, options_.dtype, options_.block_tokens,
                                  p.data->data(), options_.block_bytes, p.retain_until)
                          .ok();
      const double took = sw.Seconds();
      lock.lock();
      stats_.flash_write_seconds += took;
      --in_flight_;
      // A newer copy queued meanwhile keeps its own entry.
      if (auto again = pending_.find(hash); again != pending_.end() && again->second.data == p.data) {
        pending_.erase(again);
      }
      ++(ok ? stats_.demoted_to_flash : stats_.dropped);
      ++stats_.async_writes;
      stats_.pending_writes = static_cast<int64_t>(pending_.size());
      cv_.notify_all();
      continue;
    }
    if (!prefetch_queue_.empty()) {
      const BlockHash hash = prefetch_queue_.front();
      prefetch_queue_.pop_front();
      if (blocks_.Contains(hash) || pending_.count(hash)) continue;
      // Prefetching must not push other blocks into a full write queue (that would write to
      // flash under the lock the engine thread needs).
      if (free_slots_.empty() && static_cast<int64_t>(pending_.size()) >= options_.max_pending_writes) continue;
      ++in_flight_;
      lock.unlock();
      double until = 0;
      Stopwatch sw;
      const bool hit = flash_->Get(hash, buffer.data(), options_.block_bytes, &until).ok();
      const double took = sw.Seconds();
      lock.lock();
      --in_flight_;
      stats_.flash_read_seconds += took;
      ++stats_.flash_reads;
      if (hit && !blocks_.Contains(hash) && StoreLocked(hash, buffer.data(), until)) ++stats_.prefetched;
      cv_.notify_all();
      continue;
    }
    if (stop_) return;
  }
}

absl::StatusOr<std::vector<int64_t>> HostKvTier::ReserveSwap(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t available = static_cast<int64_t>(free_slots_.size() + blocks_.size());
  if (n > available) {
    return absl::ResourceExhaustedError(absl::StrCat("host KV tier: swap needs ", n, " blocks, ", available,
                                                     " of ", stats_.capacity_blocks, " could be freed"));
  }
  std::vector<int64_t> slots(n);
  for (auto& s : slots) s = TakeSlotLocked();
  stats_.swap_blocks += n;
  return slots;
}

void HostKvTier::FreeSwap(const std::vector<int64_t>& slots) {
  std::lock_guard<std::mutex> lock(mu_);
  free_slots_.insert(free_slots_.end(), slots.begin(), slots.end());
  stats_.swap_blocks -= static_cast<int64_t>(slots.size());
}

HostTierStats HostKvTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  HostTierStats s = stats_;
  s.retained = blocks_.Retained(options_.clock());
  return s;
}

}  // namespace moeserve
