// The continuous-batching engine: a loop that, every step, asks the scheduler for a batch of
// prefill chunks and decodes, runs the model once, samples, and streams tokens to each
// request's callback. Submission and cancellation are thread-safe; the loop runs on its own
// thread (Start) or on the caller's (RunUntilIdle, for offline use and tests). Every accepted
// request ends exactly once: finished (length or stop), cancelled, deadline exceeded, or
// failed with an error; a refused one gets its Status from Submit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/histogram.h"
#include "engine/expert_rebalancer.h"
#include "engine/live_request.h"
#include "runner/executor.h"
#include "runner/parallel_executor.h"
#include "engine/request.h"
#include "engine/request_validation.h"
#include "engine/scheduler.h"
#include "engine/step_record.h"
#include "engine/trace_writer.h"
#include "kvcache/block_pool.h"
#include "kvcache/kv_storage.h"
#include "kvcache/kv_tiers.h"
#include "models/moe_model.h"
#include "roofline/cost_model.h"

namespace moeserve {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;     // 0: as many as kv_cache_bytes holds
  size_t kv_cache_bytes = 512ull << 20;
  DType kv_dtype = DType::kF32;
  RequestLimits limits;             // what a request may ask (engine/request_validation.h)
  size_t step_history = 256;        // StepRecords kept for stats (benchmarks keep them all)
  // Roofline predictions for every step, when a hardware profile is given.
  std::optional<roofline::HardwareProfile> hardware;
  roofline::Efficiency efficiency;  // of a calibrated model; the default predicts the bound
  double price_per_hour = -1;       // $ per hour for receipts; < 0: the profile's price
  // Seeds the random stream of every request that brings no seed of its own, with its request
  // number (--seed, as vLLM's): the same seed and the same requests in the same order sample the
  // same tokens.
  uint64_t seed = 0;
  std::string trace_jsonl;          // write every StepRecord here, one JSON object per line
  std::string trace_chrome;         // ... and as a Chrome/Perfetto trace
  KvTierConfig kv_tiers;            // host DDR and flash below the device pool (prefix caching)
  WallClock clock = WallSeconds;    // for retention deadlines (tests pass a fake one)
  ParallelConfig parallel;          // --ep / --pp: ranks of their own (see parallel_executor.h)

  absl::Status Validate() const;
};

struct EngineStats {
  std::string backend;          // Backend::Name(): for the CPU, the kernel variant and threads
  std::string kernel_numerics;  // Backend::KernelNumerics()
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t steps = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t swaps = 0;  // preemptions that swapped out
  int64_t kv_blocks_retained = 0;
  // Re-placing the experts while serving (--eplb-interval): re-placements that moved experts,
  // those that stopped on an error (a full device), the experts copied and their bytes, the time they took, and the busiest EP rank's tokens
  // over the mean rank's under the last window's routing after the latest one (0: none yet).
  bool has_eplb = false;
  int64_t eplb_rearrangements = 0, eplb_experts_copied = 0, eplb_failures = 0;
  double eplb_bytes_copied = 0, eplb_seconds = 0, eplb_rank_imbalance = 0;
  // Cumulative over all steps, so clients can difference two snapshots.
  double uptime_seconds = 0.0;   // since the engine was created
  double busy_seconds = 0.0;     // sum of step durations
  int64_t batched_seqs = 0;      // sum of sequences per step (mean batch = batched_seqs / steps)
  int64_t step_prefill_tokens = 0, step_decode_tokens = 0;
  bool has_tiers = false;
  KvTierStats tiers;
  int64_t finished_length = 0, finished_stop = 0, cancelled = 0, deadline_exceeded = 0, errors = 0,
          refused = 0;
  // Latencies of finished requests (ttft and tpot only where there was a first / second token)
  // and durations of steps, cumulative.
  Histogram queue = Histogram::Latency(), ttft = Histogram::Latency(), tpot = Histogram::Latency(),
            e2e = Histogram::Latency(), step = Histogram::Latency();
  std::vector<StepRecord> recent_steps;  // newest last
};

class Engine {
 public:
  // `ranks`: with --ep/--pp (config.parallel), the layout's ranks, made by the caller
  // (ParallelExecutor::Create over CacheLayout's KV); else null, and the engine runs the model
  // on `backend` itself.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        const ModelWeights* weights,
                                                        Backend* backend,
                                                        std::unique_ptr<ParallelExecutor> ranks = nullptr);
  ~Engine();

  const ModelConfig& model_config() const { return model_.config(); }
  // What outputs depend on: the model's config and weights, the dtypes and the kernels'
  // numerics (ModelFingerprint); the OpenAI API's system_fingerprint.
  uint64_t fingerprint() const { return fingerprint_; }
  const EngineConfig& config() const { return config_; }
  // The parallel layout, when --ep/--pp ask for one (null on one rank).
  const ParallelExecutor* parallel() const { return executor_->parallel(); }
  int64_t num_kv_blocks() const { return kv_.layout().num_blocks; }

  // Validates and queues a request; returns its id. INVALID_ARGUMENT names the field and the
  // limit; RESOURCE_EXHAUSTED when the waiting queue is full. After an OK return, `callback`
  // receives the request's events, the last with finished = true.
  absl::StatusOr<uint64_t> Submit(GenerateRequest request, EventCallback callback);
  // Cancels a request at the next step boundary (a no-op once it has finished).
  void Cancel(uint64_t id);

  // Runs the loop on a background thread until Stop.
  void Start();
  // Stops the loop; requests still in flight are cancelled with `reason`.
  void Stop(const std::string& reason = "engine stopped");
  // Offline use: runs steps on this thread until every request has finished.
  absl::Status RunUntilIdle();
  // One iteration: intake, cancellations, deadlines, then a model step if there is work.
  // Returns whether a model step ran.
  absl::StatusOr<bool> Step();

  EngineStats GetStats() const;
  // The parallel layout as it is now (GetModelInfo.parallel_layout): its name, then each rank's
  // stage, layers and experts, as re-placements (--eplb-interval) leave them; one line on one
  // rank. Safe from any thread.
  std::string ParallelLayout() const;
  // The tokens routed to each (layer, expert) over every step so far, every layout (the EP
  // ranks' own experts' rows added up): `bench --expert-load-out`.
  ExpertLoad RecordedExpertLoad() const;
  // True when no request is queued or running (every block is free or cached).
  bool Idle() const;
  // Waits until the KV tiers' transfer thread has finished its queued flash writes and reads.
  void WaitForTransfers() {
    if (tiers_ != nullptr) tiers_->Flush();
  }
  // Exact accounting of the pool, for tests: valid states, and no block in use when idle.
  bool CheckAccounting() const;

  // The engine cannot go on (a rank of its MPI job was lost): from any thread. The loop fails
  // every request in flight with `status` (UNAVAILABLE), Submit refuses new ones with it, and
  // the failure callback runs once on the loop thread. The first failure wins.
  void Fail(const absl::Status& status);
  // OK while the engine works.
  absl::Status failure() const;
  // Called once, on the loop thread, after Fail's requests have ended (serve stops the server).
  void SetFailureCallback(std::function<void(const absl::Status&)> callback);

  // The KV cache the config asks for: its block count from kv_cache_bytes unless given.
  static absl::StatusOr<KvLayout> CacheLayout(const EngineConfig& config, const ModelConfig& model);

 private:
  using Live = LiveRequest;

  Engine(const EngineConfig& config, const ModelWeights* weights, Backend* backend, KvStorage kv);
  void Intake();
  void Finish(Live& live, FinishReason reason, const std::string& message,
              absl::StatusCode error_code = absl::StatusCode::kInternal);
  // After Fail: ends every request in flight with the failure (loop thread).
  void FailEverything();
  void Loop();
  // Sets parallel_layout_ from the executor's layout as it is now (loop thread, or Create).
  void DescribeLayout();
  // Copies scheduler and pool gauges into counters_ (mu_ held, loop thread).
  void UpdateGaugesLocked();
  // After a model step: its routing to the rebalancer, and a re-placement's report (loop thread).
  void Rebalance(const std::vector<int64_t>& routed, int64_t step);
  // Swap-or-recompute costs: the roofline with a hardware profile, else measured rates.
  std::unique_ptr<PreemptionPolicy> MakePreemptionPolicy() const;

  EngineConfig config_;
  Backend* backend_;
  MoeModel model_;
  roofline::ModelCosts costs_;
  double price_per_hour_ = 0;
  TraceWriter trace_;
  KvStorage kv_;
  BlockPool pool_;
  uint64_t fingerprint_;  // of the model, keys the prefix cache in every tier
  Scheduler scheduler_;
  std::unique_ptr<Executor> executor_;  // the engine's own device, or the layout's ranks
  std::unique_ptr<ExpertRebalancer> rebalancer_;  // --eplb-interval: re-places the ranks' experts
  // After the pool and scheduler that point to it, and after the executor whose devices hold
  // the blocks it copies (destroyed first, it waits for its copies while they still exist).
  std::unique_ptr<KvTiers> tiers_;
  Clock::time_point started_;

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Live>> incoming_;
  std::unordered_set<uint64_t> cancel_requests_;
  uint64_t next_id_ = 1;
  int64_t pending_ = 0;  // submitted and not yet finished
  bool stop_ = false;
  absl::Status failure_;  // set by Fail
  std::function<void(const absl::Status&)> on_failure_;
  bool failure_handled_ = false;  // loop thread
  std::thread thread_;

  // Owned by the loop thread.
  std::unordered_map<uint64_t, std::unique_ptr<Live>> live_;
  uint64_t arrivals_ = 0;
  std::vector<float> logits_;    // of the last step, only when some request wanted logprobs
  std::vector<int32_t> sampled_;  // the last step's token per logit row, sampled on the device
  LiveLookup lookup_;             // the live request of a sequence id
  StepRecorder recorder_;
  // Counters and gauges, written by the loop and read by GetStats under mu_.
  EngineStats counters_;
  ExpertLoad expert_load_;  // under mu_
  std::string parallel_layout_;  // ParallelLayout's, under mu_ (the loop thread re-places)
  int64_t new_waiting_ = 0;  // the scheduler's never-admitted waiting sequences (Submit's bound), under mu_
};

// Fingerprint of a model for prefix-cache keys in every tier: its config, every weight byte
// (ModelWeights::content_digest), the weight and KV dtypes, the block size, the KV format and
// the backend's kernel numerics.
uint64_t ModelFingerprint(const ModelWeights& weights, const Backend& backend, DType kv_dtype, int64_t block_size);

}  // namespace moeserve
