// The scheduler's side of the KV tiers: planning the copies its allocations, prefix lookups and
// preemptions imply, and booking what they did once KvTiers::Execute ran them.
#include <algorithm>

#include "core/status.h"
#include "engine/scheduler.h"

namespace moeserve {

absl::StatusOr<std::vector<int32_t>> Scheduler::Allocate(int64_t n, int64_t segment,
                                                         std::vector<BlockEviction>* nested) {
  std::vector<BlockEviction> evicted;
  auto got = pool_->Allocate(n, segment, tiers_ != nullptr ? &evicted : nullptr);
  for (const BlockEviction& e : evicted) {
    planned_below_[e.hash] = KvTier::kHost;  // a later lookup in this step finds it in DDR
    if (nested != nullptr) {
      nested->push_back(e);
    } else {
      Plan(KvTransfer::Demote(e), nullptr);
    }
  }
  return got;
}

void Scheduler::Plan(KvTransfer t, Sequence* seq) {
  transfers_.push_back(std::move(t));
  transfer_seqs_.push_back(seq);
}

std::optional<KvTier> Scheduler::Below(const BlockHash& hash) const {
  if (auto it = planned_below_.find(hash); it != planned_below_.end()) return it->second;
  return tiers_->Find(hash);
}

bool Scheduler::PlanSwapOut(Sequence* seq) {
  if (tiers_ == nullptr || seq->num_computed == 0) return false;
  // Every block holding computed KV, the partial last one included.
  const int64_t n =
      std::min<int64_t>(BlocksFor(seq->num_computed), static_cast<int64_t>(seq->blocks.size()));
  if (swap_held_ + n > tiers_->swap_capacity() || preemption_ == nullptr || !preemption_->ShouldSwap(n, seq->num_computed)) {
    return false;  // (a decision is counted only where swap space would allow it)
  }
  KvTransfer t;
  t.kind = KvTransfer::Kind::kSwapOut;
  t.blocks.assign(seq->blocks.begin(), seq->blocks.begin() + n);
  Plan(std::move(t), seq);
  swap_held_ += n;
  seq->swapped_blocks = n;
  return true;
}

void Scheduler::Truncate(Sequence* seq, int64_t keep, SchedulerOutput* out) {
  for (size_t i = 0; i < out->chunks.size(); ++i) {
    const ScheduledChunk& c = out->chunks[i];
    if (c.seq != seq) continue;
    (c.is_decode() ? out->num_decode_tokens : out->num_prefill_tokens) -= c.num_tokens;
    out->num_tokens -= c.num_tokens;
    out->chunks.erase(out->chunks.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  for (size_t b = static_cast<size_t>(keep); b < seq->blocks.size(); ++b)
    pool_->Release(seq->blocks[b]);
  seq->blocks.resize(static_cast<size_t>(keep));
  seq->registered_blocks = std::min(seq->registered_blocks, keep);
  seq->num_computed = keep * block_size_;
  if (keep == 0) {  // nothing kept: back to waiting, where its next admission looks up the prefix cache
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    seq->state = Sequence::State::kWaiting;
    InsertWaiting(seq);  // (as an admitted one: it does not count against max_waiting again)
    // Its next lookup uses the device's cache only, so that a tier that keeps failing (a copy
    // error puts a DDR block back) cannot send it round this loop forever.
    seq->skip_lower_tiers = true;
    if (std::find(first_admitted_.begin(), first_admitted_.end(), seq) != first_admitted_.end()) {
      seq->admitted_before = false;  // its prefix hit is counted at the admission that sticks
    }
  }
}

void Scheduler::OnTransfersDone(const std::vector<KvTransferOutcome>& outcomes,
                                SchedulerOutput* out) {
  MS_CHECK(outcomes.size() == out->transfers.size());
  std::unordered_map<Sequence*, int64_t> keep;         // sequences to cut back, to how many blocks
  std::vector<std::pair<int32_t, BlockHash>> spoiled;  // promoted blocks that did not arrive
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const KvTransfer& t = out->transfers[i];
    const KvTransferOutcome& o = outcomes[i];
    Sequence* seq = out->transfer_seqs[i];
    switch (t.kind) {
      case KvTransfer::Kind::kPromote:
        if (!o.ok) {
          spoiled.emplace_back(t.blocks[0], t.hash);
        } else if (pool_->hash_of(t.blocks[0]) ==
                   t.hash) {  // (it may have been evicted again since)
          pool_->SetRetention(t.blocks[0], o.retain_until);
        }
        break;
      case KvTransfer::Kind::kSwapOut:
        if (o.ok) {
          seq->swap_slots = o.slots;
        } else {  // nothing was kept: recompute it
          swap_held_ -= seq->swapped_blocks;
          seq->swapped_blocks = 0;
          seq->num_computed = 0;
          --seq->swaps;
          --total_swaps_;
        }
        break;
      case KvTransfer::Kind::kSwapIn:
        if (!o.ok) keep[seq] = 0;
        break;
      case KvTransfer::Kind::kDemote:
      case KvTransfer::Kind::kFreeSwap:
        break;
    }
  }
  // Whoever took a spoiled block into its prefix (its planner, or a sequence admitted after it
  // that found it registered) keeps only the blocks before it; nobody finds the block again.
  for (const auto& [block, hash] : spoiled) {
    for (Sequence* s : running_) {
      for (size_t b = 0; b < s->blocks.size() && b < s->hashes.size(); ++b) {
        if (s->blocks[b] != block || s->hashes[b] != hash) continue;
        auto [it, fresh] = keep.emplace(s, static_cast<int64_t>(b));
        if (!fresh) it->second = std::min<int64_t>(it->second, static_cast<int64_t>(b));
      }
    }
    pool_->Forget(block, hash);
  }
  // A first admission's prefix hit counts the blocks it kept, by the tier that served them.
  for (Sequence* s : first_admitted_) {
    const auto cut = keep.find(s);
    const int64_t kept = cut == keep.end() ? static_cast<int64_t>(s->blocks.size()) : cut->second;
    int64_t ddr = 0, flash = 0;
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const KvTransfer& t = out->transfers[i];
      if (t.kind != KvTransfer::Kind::kPromote || out->transfer_seqs[i] != s || !outcomes[i].ok)
        continue;
      const auto at = std::find(s->blocks.begin(), s->blocks.end(), t.blocks[0]);
      if (at - s->blocks.begin() >= kept) continue;
      ++(outcomes[i].tier == KvTier::kFlash ? flash : ddr);
    }
    if (cut != keep.end())
      s->cached_prompt_tokens = std::min(s->cached_prompt_tokens, kept * block_size_);
    s->cached_prompt_tokens_ddr = ddr * block_size_;
    s->cached_prompt_tokens_flash = flash * block_size_;
  }
  for (const auto& [s, blocks] : keep) Truncate(s, blocks, out);
}

}  // namespace moeserve
