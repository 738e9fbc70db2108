// The scheduler: pure bookkeeping over sequences and the block pool; it never copies a byte.
//
// Every step it builds a batch under a maximum number of sequences and a token budget:
// running sequences first (decodes and continuing prefill chunks, by priority (lane, then vLLM's
// integer rank) then arrival, so
// arrivals never starve them), then waiting sequences in the same order, admitted with their
// prefix-cache hit and a prefill chunk. When the KV pool cannot hold a running sequence's next
// tokens, the lowest-priority, newest running sequence is preempted: its KV is either swapped
// out to host DDR and copied back when it is readmitted, or dropped and recomputed later
// (whichever the lower tiers judge cheaper); its blocks are released (full ones stay in the
// prefix cache), and its output is unchanged either way.
//
// With KV tiers below the device pool, the copies those decisions imply (an evicted cached block
// goes down to DDR, a prefix block comes back up, a victim's KV is swapped out and later in) are
// planned into the schedule's transfer list, which KvTiers::Execute runs before the forward;
// OnTransfersDone then books what the copies did.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/preemption_policy.h"
#include "engine/sequence.h"
#include "kvcache/block_pool.h"
#include "kvcache/host_tier.h"
#include "kvcache/kv_transfers.h"

namespace moeserve {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;          // sequences per step
  int64_t max_tokens_per_step = 512;  // token budget per step
  bool chunked_prefill = true;        // split long prompts across steps
  bool prefix_caching = true;
  int64_t max_waiting = 1024;         // admission bound: new requests are refused while this many
                                      // never-admitted ones wait (preempted ones wait beyond it)
  int64_t fast_lane_max_batch = 4;    // batch cap while a fast-lane sequence is in it
  // Expert-parallel placement: a prompt goes to the rank its first block hashes to (so shared
  // prefixes meet in one rank's cache) unless that rank's outstanding tokens exceed this many
  // times the least loaded rank's (plus the prompt's own); then to the least loaded. 0: never
  // balance (pure cache affinity).
  double ep_balance_ratio = 2.0;
  // A prompt that is mostly one a running sequence is still prefilling waits for those blocks
  // to reach the prefix cache instead of computing them again (engine/shared_prefix.h).
  bool wait_for_shared_prefix = true;

  absl::Status Validate() const;
};

// Most prompt positions of one sequence scored in a step for prompt logprobs: each brings a row
// of vocab-size logits to the host (256 x a 152k vocabulary x 4 bytes = 156 MB).
inline constexpr int64_t kMaxPromptLogitRows = 256;

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;       // first token position computed in this step
  int64_t num_tokens = 0;
  bool wants_logits = false;  // the chunk reaches the last token: sample after the step
  // One generated token fed back (not part of the prompt, nor a recomputation of it).
  bool is_decode() const { return num_tokens == 1 && wants_logits && start >= seq->prompt_len; }
  // Logit rows for prompt logprobs, before the sampling row: positions start, start + 1, ...
  // whose next token is a prompt token (none unless the sequence wants them).
  int64_t prompt_logit_rows() const {
    if (!seq->prompt_logits) return 0;
    return std::max<int64_t>(0, std::min(start + num_tokens, seq->prompt_len - 1) - start);
  }
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // preempted during this step's scheduling
  // The tier copies to run before the forward, in order, and the sequence each serves (null for
  // a demotion or a freed swap).
  std::vector<KvTransfer> transfers;
  std::vector<Sequence*> transfer_seqs;
  int64_t num_tokens = 0;
  int64_t num_prefill_tokens = 0;
  int64_t num_decode_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockPool* pool, int64_t block_size, uint64_t fingerprint);

  const SchedulerConfig& config() const { return config_; }
  // Lower tiers for prefix-cache misses, evictions and swap (none by default; `tiers` must
  // outlive the scheduler), and the policy that decides whether a preempted sequence swaps.
  void SetLowerTiers(KvTierView* tiers, std::unique_ptr<PreemptionPolicy> preemption) {
    tiers_ = tiers;
    preemption_ = std::move(preemption);
  }
  // The preemption policy (null without lower tiers).
  PreemptionPolicy* preemption() { return preemption_.get(); }
  const PreemptionPolicy* preemption() const { return preemption_.get(); }

  // Queues a sequence; RESOURCE_EXHAUSTED when max_waiting never-admitted sequences wait,
  // INVALID_ARGUMENT when it could never fit the KV pool even alone. Engine::Submit checks both
  // first (the count it reads can only be stale high), so a request it accepted is never refused.
  absl::Status Add(Sequence* seq);
  // Removes a sequence wherever it is and releases its blocks.
  void Remove(Sequence* seq);

  SchedulerOutput Schedule();
  // Books the outcome of the schedule's transfers (one per transfer), before the forward: swap
  // slots, promoted blocks' retention and tier. A sequence whose KV could not be brought back
  // (a failed promotion or swap-in) keeps the KV before the gap and sits this step out (its
  // chunk leaves `out`); the next steps compute the rest. One whose swap-out failed will be
  // recomputed.
  void OnTransfersDone(const std::vector<KvTransferOutcome>& outcomes, SchedulerOutput* out);
  // Records that the scheduled chunks were computed: advances num_computed and indexes the
  // newly full blocks in the prefix cache.
  void OnStepComputed(const SchedulerOutput& out);

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Waiting sequences counted against max_waiting (those Add queued and that were never
  // admitted since): a step's scheduling only lowers it (admissions); only Add raises it.
  int64_t num_new_waiting() const { return new_waiting_; }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t total_preemptions() const { return total_preemptions_; }
  int64_t total_swaps() const { return total_swaps_; }  // preemptions that swapped out

 private:
  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Allocates from the pool; the cached blocks it evicts are planned as demotions, into `nested`
  // (a promotion's own) or else the transfer list.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n, int64_t segment,
                                                std::vector<BlockEviction>* nested = nullptr);
  void Plan(KvTransfer t, Sequence* seq);
  // The lower tier that will hold `hash` once the transfers planned so far have run.
  std::optional<KvTier> Below(const BlockHash& hash) const;
  // Plans the swap-out of a victim's computed KV; false when the tiers judge recomputing
  // cheaper or swap space is short.
  bool PlanSwapOut(Sequence* seq);
  // Cuts a running sequence back to its first `keep` blocks (the KV after them did not arrive):
  // its chunk leaves `out`, and the next steps compute the rest (with none kept, it waits for
  // readmission and a fresh prefix lookup).
  void Truncate(Sequence* seq, int64_t keep, SchedulerOutput* out);
  // Ensures seq has blocks for its first `tokens` tokens; false when the pool is short.
  bool Grow(Sequence* seq, int64_t tokens);
  void Preempt(Sequence* seq);
  // Takes the longest cached prefix (whole blocks, leaving at least one token to compute).
  void TakeCachedPrefix(Sequence* seq);
  // Gives a waiting sequence's device blocks back (a swapped one keeps its KV in DDR).
  void ReleaseWhileWaiting(Sequence* seq);
  // Keeps the prompt's blocks among [from, to) cached until seq->retain_until, if it asks.
  void ApplyRetention(const Sequence& seq, int64_t from, int64_t to);
  void InsertWaiting(Sequence* seq);
  // The pool segment (EP rank) for a new sequence, see SchedulerConfig::ep_balance_ratio.
  int64_t PlaceSegment(const Sequence& seq) const;
  // Schedules a running sequence's next chunk, preempting from the back of running_ when the
  // pool is short. False when nothing more can be scheduled this step.
  bool ScheduleRunning(Sequence* seq, int64_t cap, int64_t* budget, SchedulerOutput* out);
  // Admits the front waiting sequence with its first chunk. False when it cannot be admitted.
  bool AdmitFront(int64_t cap, int64_t* budget, SchedulerOutput* out);
  void AddChunk(Sequence* seq, int64_t n, int64_t* budget, SchedulerOutput* out);

  SchedulerConfig config_;
  BlockPool* pool_;
  int64_t block_size_;
  uint64_t fingerprint_;
  std::deque<Sequence*> waiting_;  // sorted by (priority, arrival)
  std::vector<Sequence*> running_;
  int64_t total_preemptions_ = 0, total_swaps_ = 0;
  int64_t new_waiting_ = 0;
  KvTierView* tiers_ = nullptr;
  std::unique_ptr<PreemptionPolicy> preemption_;
  // Transfers planned since the last schedule, with their sequences.
  std::vector<KvTransfer> transfers_;
  std::vector<Sequence*> transfer_seqs_;
  // Blocks whose place below changes with the planned transfers (demoted: DDR; promoted: gone).
  std::unordered_map<BlockHash, std::optional<KvTier>, BlockHashHasher> planned_below_;
  int64_t swap_held_ = 0;  // DDR swap slots held by swapped-out sequences
  std::vector<Sequence*> first_admitted_;  // this step's first admissions
};

}  // namespace moeserve
