// Scheduler.
#include "engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/shared_prefix.h"

namespace moeserve {
namespace {

// The tokens a sequence has left to compute; a prompt scored for prompt logprobs at most
// kMaxPromptLogitRows per step (each of its positions brings a row of logits to the host).
int64_t TokensToCompute(const Sequence& seq) {
  const int64_t n = seq.num_tokens() - seq.num_computed;
  return seq.prompt_logits ? std::min(n, kMaxPromptLogitRows) : n;
}

bool Before(const Sequence* a, const Sequence* b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  if (a->rank != b->rank) return a->rank < b->rank;
  return a->arrival < b->arrival;
}

}  // namespace

absl::Status SchedulerConfig::Validate() const {
  if (max_num_seqs < 1) return absl::InvalidArgumentError(absl::StrCat("max_num_seqs must be >= 1, got ", max_num_seqs));
  if (max_tokens_per_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens_per_step must be >= 1, got ", max_tokens_per_step));
  }
  if (max_waiting < 1) return absl::InvalidArgumentError(absl::StrCat("max_waiting must be >= 1, got ", max_waiting));
  if (!(ep_balance_ratio == 0 || ep_balance_ratio >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep-balance (ep_balance_ratio) must be 0 (off) or >= 1, got ", ep_balance_ratio));
  }
  if (fast_lane_max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fast_lane_max_batch must be >= 1, got ", fast_lane_max_batch));
  }
  return absl::OkStatus();
}

Scheduler::Scheduler(SchedulerConfig config, BlockPool* pool, int64_t block_size, uint64_t fingerprint)
    : config_(config), pool_(pool), block_size_(block_size), fingerprint_(fingerprint) {}

int64_t Scheduler::PlaceSegment(const Sequence& seq) const {
  const int64_t segments = pool_->num_segments();
  if (segments == 1) return 0;
  // Outstanding tokens (left to compute or generate) of each segment's sequences.
  std::vector<int64_t> load(segments, 0);
  for (const Sequence* s : waiting_) load[s->segment] += s->max_total_tokens - s->num_computed;
  for (const Sequence* s : running_) load[s->segment] += s->max_total_tokens - s->num_computed;
  // The least loaded segment; among equals, the one the sequence id picks (so an idle engine
  // still spreads short prompts).
  int64_t least = static_cast<int64_t>(seq.id % static_cast<uint64_t>(segments));
  for (int64_t g = 0; g < segments; ++g) {
    if (load[g] < load[least]) least = g;
  }
  if (seq.prompt_len < block_size_) return least;  // nothing to share: the least loaded rank
  // Cache-aware: prompts that share their first block meet in one rank's prefix cache ...
  const BlockHash first = seq.hashes.front();  // hashed once, in Add
  const int64_t preferred = static_cast<int64_t>(first.lo % static_cast<uint64_t>(segments));
  if (config_.ep_balance_ratio == 0) return preferred;
  // ... unless that rank is loaded well beyond the least loaded one (SGLang's router does the same).
  const double own = static_cast<double>(seq.max_total_tokens);
  return static_cast<double>(load[preferred]) > config_.ep_balance_ratio * (static_cast<double>(load[least]) + own)
             ? least
             : preferred;
}

absl::Status Scheduler::Add(Sequence* seq) {
  // The first block's hash places the sequence; the chain goes on from it later (each block of
  // a sequence is hashed once, by ExtendBlockHashes).
  if (seq->prompt_len >= block_size_ && seq->hashes.empty()) {
    ExtendBlockHashes(std::span<const int32_t>(seq->tokens.data(), block_size_), block_size_, fingerprint_,
                      seq->cache_root, &seq->hashes);
  }
  // With a segmented pool (expert parallelism) a sequence lives in the segment of its rank.
  seq->segment = PlaceSegment(*seq);
  const int64_t need = BlocksFor(seq->max_total_tokens);
  const int64_t room = pool_->segment_blocks(seq->segment);
  if (need > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt plus max_tokens is ", seq->max_total_tokens, " tokens, needing ", need,
        " KV blocks, but the cache holds ", room, " blocks (", room * block_size_, " tokens)",
        pool_->num_segments() > 1 ? " per expert-parallel rank" : ""));
  }
  if (num_new_waiting() >= config_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue is full (", config_.max_waiting, " requests)"));
  }
  seq->state = Sequence::State::kWaiting;
  InsertWaiting(seq);
  return absl::OkStatus();
}

void Scheduler::InsertWaiting(Sequence* seq) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq, Before);
  waiting_.insert(it, seq);
  seq->counted_new = !seq->admitted_before;
  if (seq->counted_new) ++new_waiting_;
}

void Scheduler::Remove(Sequence* seq) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
    if (seq->counted_new) --new_waiting_;
    seq->counted_new = false;
  }
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (seq->swapped()) {
    // Swapped out in an earlier step (OnTransfersDone gave it its slots): free them.
    MS_CHECK(!seq->swap_slots.empty());
    KvTransfer t;
    t.kind = KvTransfer::Kind::kFreeSwap;
    t.slots = std::move(seq->swap_slots);
    Plan(std::move(t), nullptr);
    swap_held_ -= seq->swapped_blocks;
    seq->swapped_blocks = 0;
    seq->swap_slots.clear();
  }
  pool_->Release(seq->blocks);
  seq->blocks.clear();
  seq->registered_blocks = 0;
  seq->state = Sequence::State::kFinished;
}

bool Scheduler::Grow(Sequence* seq, int64_t tokens) {
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(seq->blocks.size());
  if (need <= 0) return true;
  auto got = Allocate(need, seq->segment);
  if (!got.ok()) return false;
  seq->blocks.insert(seq->blocks.end(), got->begin(), got->end());
  return true;
}

void Scheduler::Preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  const bool swap = PlanSwapOut(seq);
  // Full registered blocks stay in the prefix cache, so a recompute may hit them.
  pool_->Release(seq->blocks);
  seq->blocks.clear();
  seq->registered_blocks = 0;
  if (swap) {
    ++seq->swaps;
    ++total_swaps_;
  } else {
    seq->num_computed = 0;
  }
  ++seq->preemptions;
  ++total_preemptions_;
  seq->state = Sequence::State::kWaiting;
  InsertWaiting(seq);
}

void Scheduler::TakeCachedPrefix(Sequence* seq) {
  ExtendBlockHashes(seq->tokens, block_size_, fingerprint_, seq->cache_root, &seq->hashes);
  // Whole blocks only, leaving a token to compute.
  const int64_t max_blocks = std::min<int64_t>((seq->num_tokens() - 1) / block_size_, seq->hashes.size());
  seq->promoted_ddr_blocks = seq->promoted_flash_blocks = 0;
  // Pin the chain's blocks that are on the device first, so that bringing a missing block back
  // from a lower tier never evicts a later block of the same prefix.
  std::vector<int32_t> resident(max_blocks, -1);
  for (int64_t b = 0; b < max_blocks; ++b) {
    if (auto block = pool_->Lookup(seq->hashes[b], seq->segment); block.has_value()) {
      pool_->Retain(*block);
      resident[b] = *block;
    }
  }
  int64_t b = 0;
  for (; b < max_blocks; ++b) {
    if (resident[b] >= 0) {
      seq->blocks.push_back(resident[b]);
      continue;
    }
    // A device miss: a lower tier may still hold the block. It is planned to come back into a
    // block allocated and registered now (with this sequence's reference).
    if (tiers_ == nullptr || seq->skip_lower_tiers) break;
    const std::optional<KvTier> below = Below(seq->hashes[b]);
    if (!below.has_value()) break;
    KvTransfer t;
    t.kind = KvTransfer::Kind::kPromote;
    t.hash = seq->hashes[b];
    t.planned = *below;
    auto got = Allocate(1, seq->segment, &t.evicted);  // evicts a cached block, never one in use
    if (!got.ok()) break;
    t.blocks = *got;
    pool_->Register(t.blocks[0], t.hash);
    if (*below == KvTier::kHost) planned_below_[t.hash] = std::nullopt;  // taken out of DDR (flash keeps it)
    seq->blocks.push_back(t.blocks[0]);
    ++(*below == KvTier::kFlash ? seq->promoted_flash_blocks : seq->promoted_ddr_blocks);
    Plan(std::move(t), seq);
  }
  for (int64_t r = b; r < max_blocks; ++r) {  // past the first miss: not part of the prefix
    if (resident[r] >= 0) pool_->Release(resident[r]);
  }
  seq->num_computed = static_cast<int64_t>(seq->blocks.size()) * block_size_;
  seq->registered_blocks = static_cast<int64_t>(seq->blocks.size());
  ApplyRetention(*seq, 0, seq->registered_blocks);
}

void Scheduler::ApplyRetention(const Sequence& seq, int64_t from, int64_t to) {
  if (seq.retain_until <= 0) return;
  to = std::min(to, seq.prompt_len / block_size_);  // the prompt's full blocks only
  for (int64_t b = from; b < to; ++b) pool_->SetRetention(seq.blocks[b], seq.retain_until);
}

void Scheduler::ReleaseWhileWaiting(Sequence* seq) {
  pool_->Release(seq->blocks);
  seq->blocks.clear();
  seq->registered_blocks = 0;
  if (!seq->swapped()) seq->num_computed = 0;
}

void Scheduler::AddChunk(Sequence* seq, int64_t n, int64_t* budget, SchedulerOutput* out) {
  ScheduledChunk c{seq, seq->num_computed, n, seq->num_computed + n == seq->num_tokens()};
  const bool decode = n == 1 && c.wants_logits && c.start >= seq->prompt_len;
  (decode ? out->num_decode_tokens : out->num_prefill_tokens) += n;
  out->num_tokens += n;
  *budget -= n;
  out->chunks.push_back(c);
}

bool Scheduler::ScheduleRunning(Sequence* seq, int64_t cap, int64_t* budget, SchedulerOutput* out) {
  if (static_cast<int64_t>(out->chunks.size()) >= cap || *budget <= 0) return false;
  int64_t n = TokensToCompute(*seq);
  if (n > *budget) {
    if (!config_.chunked_prefill) return true;  // wait for a step with room for the whole prompt
    n = *budget;
  }
  while (!Grow(seq, seq->num_computed + n)) {
    // Victim: the lowest-priority, newest running sequence of the same pool segment that has no
    // chunk in this step yet (a fast-lane sequence admitted this step sits at the back of
    // running_ with its chunk).
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it) {
      if ((*it)->segment != seq->segment) continue;
      const bool scheduled = std::any_of(out->chunks.begin(), out->chunks.end(),
                                         [&](const ScheduledChunk& c) { return c.seq == *it; });
      if (!scheduled) victim = *it;
    }
    if (victim == nullptr) return false;  // unreachable: seq itself has no chunk yet
    Preempt(victim);
    out->preempted.push_back(victim);
    if (victim == seq) return false;
  }
  AddChunk(seq, n, budget, out);
  return true;
}

bool Scheduler::AdmitFront(int64_t cap, int64_t* budget, SchedulerOutput* out) {
  if (waiting_.empty() || static_cast<int64_t>(out->chunks.size()) >= cap || *budget <= 0 ||
      num_running() >= config_.max_num_seqs) {
    return false;
  }
  // The first waiting sequence of the front's lane that is not waiting for a twin's prefix
  // (shared_prefix.h).
  auto it = waiting_.begin();
  while (config_.prefix_caching && config_.wait_for_shared_prefix && it != waiting_.end() &&
         (*it)->priority == waiting_.front()->priority && SharedPrefixTwin(**it, running_, block_size_) != nullptr) {
    ++it;
  }
  if (it == waiting_.end() || (*it)->priority != waiting_.front()->priority) return false;
  Sequence* seq = *it;
  if (config_.prefix_caching && seq->blocks.empty() && !seq->swapped() && !seq->prompt_logits) TakeCachedPrefix(seq);
  int64_t n = TokensToCompute(*seq);
  bool ok = true;
  if (n > *budget) {
    if (config_.chunked_prefill) {
      n = *budget;
    } else {
      ok = false;
    }
  }
  ok = ok && Grow(seq, seq->num_computed + n);
  if (!ok) {
    ReleaseWhileWaiting(seq);  // do not hold device blocks while waiting
    return false;
  }
  waiting_.erase(it);
  if (seq->counted_new) --new_waiting_;
  seq->counted_new = false;
  seq->skip_lower_tiers = false;  // (admitted: later lookups may use the tiers again)
  if (seq->swapped()) {  // its KV comes back from the swap slots into its new blocks
    MS_CHECK(!seq->swap_slots.empty());
    KvTransfer t;
    t.kind = KvTransfer::Kind::kSwapIn;
    MS_CHECK(static_cast<int64_t>(seq->blocks.size()) >= seq->swapped_blocks);  // Grow covered num_computed
    t.blocks.assign(seq->blocks.begin(), seq->blocks.begin() + seq->swapped_blocks);
    t.slots = std::move(seq->swap_slots);
    Plan(std::move(t), seq);
    swap_held_ -= seq->swapped_blocks;
    seq->swapped_blocks = 0;
    seq->swap_slots.clear();
  }
  if (!seq->admitted_before) {
    first_admitted_.push_back(seq);
    seq->cached_prompt_tokens = seq->num_computed;
    seq->cached_prompt_tokens_ddr = seq->promoted_ddr_blocks * block_size_;
    seq->cached_prompt_tokens_flash = seq->promoted_flash_blocks * block_size_;
    seq->admitted_before = true;
  }
  seq->state = Sequence::State::kRunning;
  running_.push_back(seq);
  AddChunk(seq, n, budget, out);
  return true;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  planned_below_.clear();
  first_admitted_.clear();
  int64_t budget = config_.max_tokens_per_step;
  std::sort(running_.begin(), running_.end(), Before);
  const bool fast_present =
      (!running_.empty() && running_.front()->priority == Priority::kFast) ||
      (!waiting_.empty() && waiting_.front()->priority == Priority::kFast);
  const int64_t cap = fast_present ? std::min(config_.max_num_seqs, config_.fast_lane_max_batch)
                                   : config_.max_num_seqs;
  // 1. Running fast-lane sequences, 2. waiting fast-lane ones, 3. the other running ones,
  // 4. the other waiting ones (only if nothing was preempted this step).
  const std::vector<Sequence*> order = running_;
  size_t i = 0;
  for (; i < order.size() && order[i]->priority == Priority::kFast; ++i) {
    if (order[i]->state != Sequence::State::kRunning) continue;  // preempted meanwhile
    if (!ScheduleRunning(order[i], cap, &budget, &out)) break;
  }
  while (!waiting_.empty() && waiting_.front()->priority == Priority::kFast && out.preempted.empty()) {
    if (!AdmitFront(cap, &budget, &out)) break;
  }
  for (i = 0; i < order.size(); ++i) {
    Sequence* seq = order[i];
    if (seq->priority == Priority::kFast) continue;
    if (seq->state != Sequence::State::kRunning) continue;  // preempted meanwhile
    if (!ScheduleRunning(seq, cap, &budget, &out)) break;
  }
  while (out.preempted.empty() && AdmitFront(cap, &budget, &out)) {
  }
  out.transfers = std::move(transfers_);
  out.transfer_seqs = std::move(transfer_seqs_);
  transfers_.clear();
  transfer_seqs_.clear();
  return out;
}

void Scheduler::OnStepComputed(const SchedulerOutput& out) {
  for (const auto& c : out.chunks) {
    Sequence* seq = c.seq;
    seq->num_computed = c.start + c.num_tokens;
    if (!config_.prefix_caching) continue;
    ExtendBlockHashes(std::span<const int32_t>(seq->tokens.data(), seq->num_computed), block_size_,
                      fingerprint_, seq->cache_root, &seq->hashes);
    const int64_t full = std::min<int64_t>(seq->num_computed / block_size_, seq->hashes.size());
    for (int64_t b = seq->registered_blocks; b < full; ++b) pool_->Register(seq->blocks[b], seq->hashes[b]);
    ApplyRetention(*seq, seq->registered_blocks, full);
    seq->registered_blocks = std::max(seq->registered_blocks, full);
  }
}

}  // namespace moeserve
