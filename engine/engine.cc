// The engine loop.
#include "engine/engine.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/batch_builder.h"
#include "engine/output_processor.h"
#include "engine/step_accounting.h"

namespace moeserve {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       const ModelWeights* weights,
                                                       Backend* backend,
                                                       std::unique_ptr<ParallelExecutor> ranks) {
  RETURN_IF_ERROR(config.Validate());
  if (weights->released()) {
    return absl::FailedPreconditionError("engine: the weights were released (a staging copy already sharded)");
  }
  if (config.parallel.enabled() != (ranks != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("engine: the layout ", config.parallel.Name(),
                                                   ranks != nullptr ? " has one rank, but ranks were given"
                                                                    : " needs its ranks (ParallelExecutor::Create)"));
  }
  ASSIGN_OR_RETURN(const KvLayout full, CacheLayout(config, weights->config()));
  if (ranks != nullptr) {  // the ranks must be this config's layout over this cache
    const ParallelConfig& p = ranks->config();
    const KvLayout& k = ranks->cache_layout();
    if (p.ep != config.parallel.ep || p.pp != config.parallel.pp || p.placement != config.parallel.placement ||
        p.micro_batches != config.parallel.micro_batches || k.num_blocks != full.num_blocks ||
        k.block_size != full.block_size || k.num_layers != full.num_layers || k.dtype != full.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("engine: the ranks given (", p.Name(), ", ", k.num_blocks,
                                                     " KV blocks) are not the layout ", config.parallel.Name(),
                                                     " over the engine's ", full.num_blocks, " KV blocks"));
    }
  }
  KvLayout own = full;
  if (ranks != nullptr) {
    // The ranks keep the KV in their stages' arenas; the engine's own cache is a stub of one layer.
    own.num_layers = 1;
  }
  ASSIGN_OR_RETURN(KvStorage kv, KvStorage::Create(backend, own));
  std::unique_ptr<Engine> engine(new Engine(config, weights, backend, std::move(kv)));
  if (ranks != nullptr) {
    // Where the ranks send the experts' rows as bf16 (their GEMMs round them anyway), price that.
    if (ranks->bf16_dispatch()) engine->costs_.dispatch_act_bytes = 2;
    ASSIGN_OR_RETURN(engine->rebalancer_, ExpertRebalancer::Create(config.parallel, weights->config(), ranks.get()));
    engine->executor_ = std::move(ranks);
  } else {
    engine->executor_ = std::make_unique<SingleDeviceExecutor>(&engine->model_, &engine->kv_, backend);
  }
  engine->DescribeLayout();
  // The batch builder writes each sequence into the part of its pool segment's rank.
  std::vector<int64_t> segments;
  for (int64_t g = 0; g < engine->pool_.num_segments(); ++g) segments.push_back(engine->pool_.segment_begin(g));
  segments.push_back(engine->pool_.num_blocks());
  if (engine->executor_->cut().segment_begin != segments) {
    return absl::InternalError("engine: the executor's step cut is not the block pool's segments");
  }
  RETURN_IF_ERROR(engine->trace_.Open(config.trace_jsonl, config.trace_chrome));
  if (config.kv_tiers.enabled()) {
    if (!config.scheduler.prefix_caching) {
      return absl::InvalidArgumentError("KV tiers hold prefix-cache blocks: they need prefix caching on");
    }
    ASSIGN_OR_RETURN(KvTierDevices devices, engine->executor_->TierDevices());
    ASSIGN_OR_RETURN(engine->tiers_, KvTiers::Create(config.kv_tiers, engine->fingerprint_, &engine->pool_,
                                                     std::move(devices), config.clock));
    engine->scheduler_.SetLowerTiers(engine->tiers_.get(), engine->MakePreemptionPolicy());
  }
  return engine;
}

absl::StatusOr<KvLayout> Engine::CacheLayout(const EngineConfig& config, const ModelConfig& c) {
  int64_t blocks = config.num_kv_blocks;
  if (blocks == 0) {
    blocks = static_cast<int64_t>(config.kv_cache_bytes / KvLayoutFor(c, 1, config.block_size, config.kv_dtype).BlockBytes());
  }
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", config.kv_cache_bytes,
                                                   " bytes holds no block of ", config.block_size, " tokens"));
  }
  return KvLayoutFor(c, blocks, config.block_size, config.kv_dtype);
}

Engine::Engine(const EngineConfig& config, const ModelWeights* weights, Backend* backend, KvStorage kv)
    : config_(config),
      backend_(backend),
      model_(weights, backend),
      costs_(roofline::ModelCosts::From(weights->config(), roofline::WeightDtypeName(weights->config(), weights->dtype()),
                                        config.kv_dtype == DType::kF32 ? "f32" : "bf16")),
      price_per_hour_(config.price_per_hour >= 0 ? config.price_per_hour
                                                 : (config.hardware ? config.hardware->price_per_hour : 0.0)),
      kv_(std::move(kv)),
      pool_(kv_.layout().num_blocks, config.parallel.enabled() ? config.parallel.ep : 1),
      fingerprint_(ModelFingerprint(*weights, *backend, config.kv_dtype, config.block_size)),
      scheduler_(config.scheduler, &pool_, config.block_size, fingerprint_),
      started_(Clock::now()),
      recorder_(config.step_history) {
  lookup_ = [this](uint64_t id) -> LiveRequest& { return *live_.at(id); };
  counters_.kv_blocks_total = counters_.kv_blocks_free = pool_.num_blocks();
  const ModelConfig& c = weights->config();
  expert_load_ = ExpertLoad{c.num_hidden_layers, c.num_local_experts,
                            std::vector<int64_t>(static_cast<size_t>(c.num_hidden_layers * c.num_local_experts), 0)};
  // The hidden states this engine sends between ranks are fp32 on every backend: price those.
  costs_.act_bytes = sizeof(float);
}

Engine::~Engine() { Stop("engine destroyed"); }

std::unique_ptr<PreemptionPolicy> Engine::MakePreemptionPolicy() const {
  std::optional<PreemptionPolicy::Roofline> roofline;
  if (config_.hardware) roofline = PreemptionPolicy::Roofline{&costs_, &*config_.hardware, config_.efficiency};
  const double link = config_.hardware && config_.hardware->host_link_bandwidth > 0
                          ? config_.hardware->host_link_bandwidth
                          : tiers_->measured_link_bytes_per_second();
  // The tiers' layout: a whole block over all its pieces (with ranks, the engine's own cache is
  // a one-layer stub).
  return std::make_unique<PreemptionPolicy>(config_.kv_tiers.preemption, static_cast<double>(tiers_->block_bytes()),
                                            link, roofline);
}

absl::StatusOr<uint64_t> Engine::Submit(GenerateRequest request, EventCallback callback) {
  RETURN_IF_ERROR(ValidateRequest(request, model_.config(), config_.limits));
  const ModelConfig& c = model_.config();
  auto live = std::make_unique<Live>();
  live->seq.prompt_len = static_cast<int64_t>(request.prompt.size());
  live->seq.prompt_logits = request.prompt_logprobs >= 0;
  live->seq.rank = request.rank;
  live->seq.tokens = request.prompt;
  live->seq.cache_root = CacheRoot(request.cache_tenant, request.cache_salt);
  live->seq.priority = request.priority;
  if (request.retain_seconds > 0) live->seq.retain_until = config_.clock() + request.retain_seconds;
  live->seq.max_total_tokens =
      std::min<int64_t>(live->seq.prompt_len + request.max_tokens, c.max_position_embeddings);
  const int64_t need = (live->seq.max_total_tokens + config_.block_size - 1) / config_.block_size;
  const int64_t room = pool_.segment_blocks(0);  // the smallest segment (one per EP rank)
  if (need > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt plus max_tokens is ", live->seq.max_total_tokens, " tokens, more than the KV cache holds (",
        room * config_.block_size, " tokens", pool_.num_segments() > 1 ? " per expert-parallel rank" : "", ")"));
  }
  live->request = std::move(request);
  live->callback = std::move(callback);
  live->submitted = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  if (stop_) return absl::UnavailableError("engine is stopping");
  // new_waiting_ can only be stale high (a step's scheduling only admits), so Scheduler::Add
  // never refuses a request accepted here.
  if (static_cast<int64_t>(incoming_.size()) + new_waiting_ >= config_.scheduler.max_waiting) {
    ++counters_.refused;
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue is full (", config_.scheduler.max_waiting, " requests)"));
  }
  const uint64_t id = next_id_++;
  live->seq.id = id;
  live->sampler =
      std::make_unique<Sampler>(live->request.sampling, 0x9e3779b9ull * id + 0xbf58476d1ce4e5b9ull * config_.seed);
  live->editor = std::make_unique<LogitEditor>(live->request);
  incoming_.push_back(std::move(live));
  ++pending_;
  cv_.notify_all();
  return id;
}

void Engine::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_requests_.insert(id);
  cv_.notify_all();
}

void Engine::Intake() {
  std::deque<std::unique_ptr<Live>> incoming;
  std::unordered_set<uint64_t> cancels;
  std::vector<std::pair<Live*, absl::Status>> refused;
  std::vector<Sequence*> accepted;
  {
    // The waiting gauge is updated under the same lock that Submit checks it under, so the
    // queue bound is exact. (Finish runs callbacks, so it waits until the lock is released.)
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancel_requests_);
    for (auto& l : incoming) {
      Live& live = *l;
      live.seq.arrival = arrivals_++;
      live_[live.seq.id] = std::move(l);
      absl::Status s = scheduler_.Add(&live.seq);
      if (!s.ok()) {
        refused.emplace_back(&live, std::move(s));
      } else {
        accepted.push_back(&live.seq);
      }
    }
    counters_.waiting = scheduler_.num_waiting();
    new_waiting_ = scheduler_.num_new_waiting();
  }
  // Flash reads of the new prefixes start now and overlap the steps before their admission;
  // hashing the prompts happens here, outside the lock that Submit takes.
  if (tiers_ != nullptr && config_.scheduler.prefix_caching) {
    for (Sequence* seq : accepted) {
      ExtendBlockHashes(seq->tokens, config_.block_size, fingerprint_, seq->cache_root, &seq->hashes);
      // The blocks a prefix hit can use: whole ones, leaving a token to compute.
      const size_t usable = std::min(seq->hashes.size(), static_cast<size_t>((seq->num_tokens() - 1) / config_.block_size));
      tiers_->Prefetch(std::span<const BlockHash>(seq->hashes.data(), usable), seq->segment);
    }
  }
  for (auto& [live, s] : refused) Finish(*live, FinishReason::kError, std::string(s.message()));
  for (uint64_t id : cancels) {
    auto it = live_.find(id);
    if (it != live_.end()) Finish(*it->second, FinishReason::kCancelled, "cancelled by the client");
  }
  const auto now = Clock::now();
  std::vector<Live*> expired;
  for (auto& [id, l] : live_) {
    if (l->request.deadline.has_value() && *l->request.deadline <= now) expired.push_back(l.get());
  }
  for (Live* l : expired) Finish(*l, FinishReason::kDeadline, "deadline exceeded");
}

void Engine::Finish(Live& live, FinishReason reason, const std::string& message, absl::StatusCode error_code) {
  scheduler_.Remove(&live.seq);
  RequestEvent ev = FinalEvent(live, reason, message, price_per_hour_, Clock::now());
  ev.error_code = error_code;
  if (live.callback) live.callback(ev);
  {
    std::lock_guard<std::mutex> lock(mu_);
    switch (reason) {
      case FinishReason::kLength: ++counters_.finished_length; break;
      case FinishReason::kStop: ++counters_.finished_stop; break;
      case FinishReason::kCancelled: ++counters_.cancelled; break;
      case FinishReason::kDeadline: ++counters_.deadline_exceeded; break;
      case FinishReason::kError: ++counters_.errors; break;
    }
    counters_.e2e.Observe(ev.timing.e2e_seconds);
    if (live.first_scheduled) counters_.queue.Observe(ev.timing.queue_seconds);
    if (live.first_token) counters_.ttft.Observe(ev.timing.ttft_seconds);
    if (live.first_token && ev.usage.completion_tokens > 1) counters_.tpot.Observe(ev.timing.tpot_seconds);
    counters_.prompt_tokens += ev.usage.prompt_tokens;
    counters_.cached_prompt_tokens += ev.usage.cached_prompt_tokens;
    counters_.generated_tokens += ev.usage.completion_tokens;
    UpdateGaugesLocked();
    --pending_;
    cv_.notify_all();
  }
  live_.erase(live.seq.id);  // destroys `live`
}

// One step in one pass: schedule -> tier transfers -> build the batch -> run the model ->
// process the outputs -> account.
absl::StatusOr<bool> Engine::Step() {
  Intake();
  pool_.AdvanceClock(config_.clock());  // expired retention turns into ordinary LRU
  const auto start = Clock::now();
  auto since = [&start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  SchedulerOutput out = scheduler_.Schedule();
  if (tiers_ != nullptr) {  // the tier copies the schedule implies, before the forward reads them
    scheduler_.OnTransfersDone(tiers_->Execute(out.transfers), &out);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.waiting = scheduler_.num_waiting();
    new_waiting_ = scheduler_.num_new_waiting();
    if (out.empty()) UpdateGaugesLocked();
  }
  // Transfers that ran (or sent a sequence back to waiting) are progress even without a batch.
  if (out.empty()) return !out.transfers.empty();
  absl::StatusOr<StepBatch> batch = BuildBatch(out, executor_->cut(), lookup_, start);
  StepTiming timing;
  timing.start_seconds = std::chrono::duration<double>(start - started_).count();
  timing.schedule_seconds = since();
  RunnerOutput run;
  run.logits = &logits_;
  run.sampled = &sampled_;
  if (absl::Status s = batch.ok() ? executor_->Execute(batch->step, &run) : batch.status(); !s.ok()) {
    if (executor_->lost()) {  // a rank process is gone: nothing can run
      Fail(s);
      FailEverything();
      return true;
    }
    // Fail the requests of this step; the engine and everyone else keep going.
    for (const auto& ch : out.chunks) Finish(*live_.at(ch.seq->id), FinishReason::kError, std::string(s.message()));
    return true;
  }
  scheduler_.OnStepComputed(out);
  timing.forward_seconds = since();
  if (tiers_ != nullptr) {  // the copies ran inside scheduling, before the forward
    timing.transfer_bytes = static_cast<double>(tiers_->TakeTransferBytes());
    timing.transfer_seconds = tiers_->TakeTransferSeconds();
  }
  // Requests that end with this step finish after the step is booked in the stats, so that a
  // client that has its last token also finds the step that made it in GetStats.
  const auto finishing = ProcessOutputs(out, sampled_, logits_, model_.config().vocab_size, Clock::now(), lookup_);
  if (out.num_prefill_tokens > 0 && scheduler_.preemption() != nullptr) {
    scheduler_.preemption()->ObservePrefill(out.num_tokens, timing.forward_seconds);
  }
  timing.duration_seconds = since();
  // The whole step, streaming included, goes on the receipts: they add up to the busy time.
  BookReceipts(out, batch->step.num_seqs, timing.duration_seconds, timing.transfer_seconds,
               static_cast<double>(kv_.layout().BlockBytes()), lookup_);
  roofline::ParallelLayout layout{config_.parallel.ep, config_.parallel.pp, config_.parallel.domain_size, false,
                                  config_.parallel.micro_batches};
  if (parallel() != nullptr) {  // the placement's own traffic (replicated experts keep rows in a domain)
    layout.routed_inside = parallel()->traffic().inside;
    layout.routed_outside = parallel()->traffic().outside;
  }
  const StepPricing pricing{&costs_, config_.hardware ? &*config_.hardware : nullptr, layout, config_.efficiency};
  StepRecord rec = AccountStep(out, *batch, run, timing, pricing);
  {
    std::lock_guard<std::mutex> lock(mu_);
    rec.step = counters_.steps++;
    counters_.busy_seconds += rec.duration_seconds;
    counters_.step.Observe(rec.duration_seconds);
    counters_.batched_seqs += rec.num_seqs;
    counters_.step_prefill_tokens += rec.prefill_tokens;
    counters_.step_decode_tokens += rec.decode_tokens;
    const std::vector<int64_t>& routed = run.stats.layer_expert_rows;
    if (routed.size() == expert_load_.tokens.size()) {
      for (size_t i = 0; i < routed.size(); ++i) expert_load_.tokens[i] += routed[i];
    }
    recorder_.Add(rec);
    UpdateGaugesLocked();
  }
  // File I/O stays outside the lock that Submit takes.
  if (trace_.enabled()) trace_.Write(rec, pool_.num_used());
  for (auto& [live, reason] : finishing) Finish(*live, reason, "");
  // After the step's answers are out: a re-placement takes its time between steps.
  if (rebalancer_ != nullptr) Rebalance(run.stats.layer_expert_rows, rec.step);
  return true;
}

void Engine::UpdateGaugesLocked() {
  counters_.preemptions = scheduler_.total_preemptions();
  counters_.swaps = scheduler_.total_swaps();
  counters_.kv_blocks_retained = pool_.num_retained();
  counters_.waiting = scheduler_.num_waiting();
  new_waiting_ = scheduler_.num_new_waiting();
  counters_.running = scheduler_.num_running();
  counters_.kv_blocks_total = pool_.num_blocks();
  counters_.kv_blocks_used = pool_.num_used();
  counters_.kv_blocks_free = pool_.num_free();
  counters_.kv_blocks_cached = pool_.num_cached();
}

ExpertLoad Engine::RecordedExpertLoad() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expert_load_;
}

std::string Engine::ParallelLayout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parallel_layout_;
}

void Engine::DescribeLayout() {
  std::string d = parallel() != nullptr ? absl::StrCat(parallel()->config().Name(), "\n", parallel()->Describe())
                                        : "1 rank: ep1 pp1, all layers and experts on rank 0";
  std::lock_guard<std::mutex> lock(mu_);
  parallel_layout_ = std::move(d);
}

EngineStats Engine::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = counters_;
  s.recent_steps = recorder_.Recent();
  s.uptime_seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  s.backend = backend_->Name();
  s.kernel_numerics = backend_->KernelNumerics();
  s.has_eplb = rebalancer_ != nullptr;
  if (tiers_ != nullptr) {
    s.has_tiers = true;
    s.tiers = tiers_->stats();
    s.tiers.swap_decisions = scheduler_.preemption()->swap_decisions();
    s.tiers.recompute_decisions = scheduler_.preemption()->recompute_decisions();
  }
  return s;
}

bool Engine::CheckAccounting() const {
  if (!pool_.CheckInvariants()) return false;
  if (Idle() && pool_.num_used() != 0) return false;
  return true;
}

}  // namespace moeserve
