// Measured step times for the price sheet.
#include "tools/price_measure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/progress.h"
#include "core/status.h"
#include "engine/engine.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"
#include "tools/bench_sweep.h"
#include "tools/bench_tiers.h"

namespace moeserve::tools {
namespace {

double Lookup(const std::map<std::pair<int64_t, int64_t>, double>& table, int64_t a, int64_t b) {
  // The sheet asks only for points MeasurePriceTimes measured; were it to ask for another, the
  // NaN shows in every figure computed from it (null in the JSON) rather than a wrong price.
  auto it = table.find({a, b});
  return it == table.end() ? std::nan("") : it->second;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `prompts` sequences of `prompt` random tokens from position 0, `step_tokens` tokens per
// forward (whole prompts side by side, or one prompt in chunks), logits for each prompt's last
// token only. Returns the seconds until every prompt has its first token.
absl::StatusOr<double> TimePrefillOnce(MoeModel& model, KvStorage& kv, const ModelConfig& c, int64_t block_size,
                                       int64_t prompt, int64_t step_tokens, std::mt19937& gen) {
  const int64_t prompts = roofline::PromptsPerStep(prompt, step_tokens);
  const int64_t blocks_per_seq = (prompt + block_size - 1) / block_size;
  std::vector<float> logits;
  std::vector<int32_t> sampled;
  Stopwatch sw;
  for (int64_t done = 0; done < prompt;) {
    const int64_t n = prompts > 1 ? prompt : std::min(step_tokens, prompt - done);
    ForwardInput in;
    in.num_seqs = prompts;
    in.max_blocks_per_seq = blocks_per_seq;
    in.block_tables.resize(static_cast<size_t>(prompts * blocks_per_seq));
    for (int64_t j = 0; j < prompts; ++j) {
      for (int64_t k = 0; k < blocks_per_seq; ++k) {
        in.block_tables[j * blocks_per_seq + k] = static_cast<int32_t>(j * blocks_per_seq + k);
      }
      for (int64_t p = done; p < done + n; ++p) {
        in.token_ids.push_back(static_cast<int32_t>(gen() % c.vocab_size));
        in.positions.push_back(static_cast<int32_t>(p));
        in.token_seq.push_back(static_cast<int32_t>(j));
        in.slots.push_back((j * blocks_per_seq + p / block_size) * block_size + p % block_size);
      }
      if (done + n == prompt) in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
    }
    in.sample.assign(in.logit_rows.size(), SampleSpec{});
    in.logits_to_host = false;
    RETURN_IF_ERROR(model.Forward(in, kv.layout(), kv.data(), &logits, nullptr, &sampled));
    done += n;
  }
  return sw.Seconds();
}

absl::Status MeasurePrefill(const ModelWeights& weights, Backend* backend, const roofline::PriceInputs& in,
                            const PriceMeasureOptions& o, MeasuredStepTimes* out) {
  const ModelConfig& c = weights.config();
  const int64_t prompt = in.mix.prompt_tokens;
  if (prompt + 1 > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-tokens: ", prompt, " exceeds the model's context of ", c.max_position_embeddings));
  }
  int64_t max_prompts = 1;
  for (int64_t s : in.grid.chunks) max_prompts = std::max(max_prompts, roofline::PromptsPerStep(prompt, s));
  const int64_t blocks = max_prompts * ((prompt + o.block_size - 1) / o.block_size);
  ASSIGN_OR_RETURN(KvStorage kv, KvStorage::Create(backend, KvLayoutFor(c, blocks, o.block_size, o.kv_dtype)));
  MoeModel model(&weights, backend);
  std::mt19937 gen(7);
  Progress progress("prefill", static_cast<int64_t>(in.grid.chunks.size()), o.progress);
  int64_t done = 0;
  for (int64_t s : in.grid.chunks) {
    ASSIGN_OR_RETURN(double warm, TimePrefillOnce(model, kv, c, o.block_size, prompt, s, gen));
    (void)warm;
    std::vector<double> times;
    for (int r = 0; r < o.repeats; ++r) {
      ASSIGN_OR_RETURN(double t, TimePrefillOnce(model, kv, c, o.block_size, prompt, s, gen));
      times.push_back(t);
    }
    const double median = Median(times);
    out->prefill[{prompt, s}] = median;
    progress.Update(++done, absl::StrCat(s, " tokens per step: ", median * 1e3, " ms"));
  }
  progress.Finish(done);
  return absl::OkStatus();
}

struct LaneResult {
  double tpot = 0;             // seconds per token while decoding
  double usd_per_million = 0;  // decode price per token
};

// `bulk` normal requests run until every one has its first token (the scheduler prefills them
// a step budget at a time, so they are given enough tokens to all still be decoding then).
// Alone: `steps` decode steps of all of them are timed and priced at the machine's rate. With a
// fast-lane request: it arrives then, runs to its end (the batch capped while it runs), and its
// receipt prices its decode. The bulk is cancelled afterwards. Returns {bulk, fast}.
absl::StatusOr<std::pair<LaneResult, LaneResult>> RunLanes(const ModelWeights& weights, Backend* backend,
                                                           int64_t bulk, int64_t prompt, int64_t output,
                                                           double usd_per_hour, bool with_fast,
                                                           const PriceMeasureOptions& o) {
  const ModelConfig& c = weights.config();
  EngineConfig ec;
  ec.block_size = o.block_size;
  ec.kv_dtype = o.kv_dtype;
  ec.price_per_hour = usd_per_hour;
  ec.scheduler.max_num_seqs = bulk;
  const int64_t prefill_steps = (bulk * prompt + ec.scheduler.max_tokens_per_step - 1) / ec.scheduler.max_tokens_per_step;
  const int64_t bulk_tokens = std::min<int64_t>(prefill_steps + output + 2, c.max_position_embeddings - prompt - 1);
  const KvLayout one = KvLayoutFor(c, 1, o.block_size, o.kv_dtype);
  const int64_t blocks = (bulk + 1) * ((prompt + bulk_tokens + o.block_size) / o.block_size + 1);
  ec.kv_cache_bytes = std::max(ec.kv_cache_bytes, static_cast<size_t>(blocks) * one.BlockBytes());
  // Declared before the engine: its destructor finishes what is left, calling back into these.
  std::pair<LaneResult, LaneResult> out;
  int64_t started = 0;          // bulk requests with their first token
  bool fast_done = false;
  std::vector<uint64_t> bulk_ids;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ec, &weights, backend));
  std::mt19937 gen(11);
  auto submit = [&](bool fast) -> absl::StatusOr<uint64_t> {
    GenerateRequest g;
    for (int64_t t = 0; t < prompt; ++t) g.prompt.push_back(static_cast<int32_t>(gen() % c.vocab_size));
    g.max_tokens = static_cast<int32_t>(fast ? output : bulk_tokens);
    if (fast) g.priority = Priority::kFast;
    return engine->Submit(g, [&, fast, first = true](const RequestEvent& ev) mutable {
      if (!fast && first && !ev.tokens.empty()) ++started;
      first = first && ev.tokens.empty();
      if (!fast || !ev.finished) return;
      fast_done = true;
      out.second.tpot = ev.timing.tpot_seconds;
      const int64_t decoded = ev.usage.completion_tokens - 1;
      out.second.usd_per_million =
          decoded > 0 ? usd_per_hour / 3600.0 * ev.receipt.decode_device_seconds / static_cast<double>(decoded) * 1e6
                      : 0.0;
    });
  };
  for (int64_t i = 0; i < bulk; ++i) {
    ASSIGN_OR_RETURN(uint64_t id, submit(false));
    bulk_ids.push_back(id);
  }
  auto step = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(bool ran, engine->Step());
    if (!ran && engine->Idle()) return absl::InternalError("fast lane: the bulk requests ended early");
    return absl::OkStatus();
  };
  while (started < bulk) RETURN_IF_ERROR(step());
  if (engine->GetStats().running != bulk) {
    return absl::InternalError(absl::StrCat("fast lane: ", engine->GetStats().running, " of ", bulk,
                                            " bulk requests running when all had started"));
  }
  if (with_fast) {
    RETURN_IF_ERROR(submit(true).status());
    while (!fast_done) RETURN_IF_ERROR(step());
  } else {  // every bulk request decodes one token per step
    const int64_t steps = std::max<int64_t>(1, std::min<int64_t>(output, 16));
    Stopwatch sw;
    for (int64_t k = 0; k < steps; ++k) RETURN_IF_ERROR(step());
    out.first.tpot = sw.Seconds() / static_cast<double>(steps);
    out.first.usd_per_million = usd_per_hour / 3600.0 * out.first.tpot / static_cast<double>(bulk) * 1e6;
  }
  for (uint64_t id : bulk_ids) engine->Cancel(id);
  RETURN_IF_ERROR(engine->RunUntilIdle());
  return out;
}

}  // namespace

roofline::StepTime MeasuredStepTimes::Decode(int64_t batch, int64_t context) const {
  return {Lookup(decode, batch, context), bounds_->Decode(batch, context).compute_bound};
}

roofline::StepTime MeasuredStepTimes::Prefill(int64_t prompt, int64_t step_tokens) const {
  return {Lookup(prefill, prompt, step_tokens), bounds_->Prefill(prompt, step_tokens).compute_bound};
}

absl::StatusOr<PriceMeasurement> MeasurePriceTimes(const ModelWeights& weights, Backend* backend,
                                                   const roofline::HardwareProfile& hw,
                                                   const roofline::PriceInputs& in,
                                                   const roofline::PredictedStepTimes* bounds,
                                                   const PriceMeasureOptions& o) {
  PriceMeasurement m{MeasuredStepTimes(bounds), 0, 0, nlohmann::json()};
  const int64_t max_context = weights.config().max_position_embeddings;
  // Decode: one sweep per context over the batches that fit there. A sweep point at context
  // ctx decodes at position ctx, attending ctx + 1 tokens: the sheet's context c is ctx = c - 1.
  for (int64_t c : in.grid.contexts) {
    if (c > max_context) {
      return absl::InvalidArgumentError(
          absl::StrCat("--contexts: ", c, " exceeds the model's context of ", max_context));
    }
    const int64_t fit = roofline::LargestFittingBatch(in, c);
    SweepOptions so;
    for (int64_t b : in.grid.batches) {
      if (b <= std::max<int64_t>(fit, 1)) so.batches.push_back(b);
    }
    so.contexts = {c - 1};
    so.block_size = o.block_size;
    so.kv_dtype = o.kv_dtype;
    so.min_steps = o.repeats;
    so.min_seconds = 0.25;  // a quarter second of steps per point: the VM is noisy
    so.max_kv_bytes = 1e18;  // what fits was decided above, against the machine's memory
    so.progress = o.progress;
    ASSIGN_OR_RETURN(SweepReport r, RunDecodeSweep(weights, backend, hw, so));
    for (const SweepPoint& p : r.points) m.times.decode[{p.batch, c}] = p.observed_seconds;
  }
  RETURN_IF_ERROR(MeasurePrefill(weights, backend, in, o, &m.times));
  if (o.tier_prompt_tokens > 0) {
    EngineConfig base;
    base.block_size = o.block_size;
    base.kv_dtype = o.kv_dtype;
    TierScenarioOptions to;
    to.prompt_tokens = o.tier_prompt_tokens;
    to.progress = o.progress;
    ASSIGN_OR_RETURN(m.tier_scenario, RunTierScenario(base, &weights, backend, to, hw));
    const auto& meas = m.tier_scenario["measured"];
    m.host_link_bytes_per_s = meas["promote_from_ddr_bytes_per_s"].get<double>();
    m.flash_read_bytes_per_s = meas["promote_from_flash_bytes_per_s"].get<double>();
  }
  return m;
}

absl::StatusOr<nlohmann::json> MeasureFastLane(const ModelWeights& weights, Backend* backend, int64_t bulk,
                                               int64_t prompt_tokens, int64_t output_tokens, double usd_per_hour,
                                               const PriceMeasureOptions& o) {
  if (output_tokens < 2) return absl::InvalidArgumentError("the fast-lane run needs at least 2 output tokens");
  if (o.progress) std::fprintf(stderr, "fast lane: %lld bulk requests alone ...\n", static_cast<long long>(bulk));
  ASSIGN_OR_RETURN(auto alone, RunLanes(weights, backend, bulk, prompt_tokens, output_tokens, usd_per_hour, false, o));
  if (o.progress) std::fprintf(stderr, "fast lane: ... and with one fast-lane request\n");
  ASSIGN_OR_RETURN(auto mixed, RunLanes(weights, backend, bulk, prompt_tokens, output_tokens, usd_per_hour, true, o));
  const LaneResult& bulk_alone = alone.first;
  const LaneResult& fast = mixed.second;
  nlohmann::json j;
  j["bulk_requests"] = bulk;
  j["fast_lane_max_batch"] = SchedulerConfig().fast_lane_max_batch;
  j["prompt_tokens"] = prompt_tokens;
  j["output_tokens"] = output_tokens;
  j["bulk_alone"] = {{"tpot_s", bulk_alone.tpot}, {"decode_usd_per_million", bulk_alone.usd_per_million}};
  j["fast"] = {{"tpot_s", fast.tpot}, {"decode_usd_per_million", fast.usd_per_million}};
  j["speed_multiple"] = fast.tpot > 0 ? bulk_alone.tpot / fast.tpot : 0.0;
  j["price_multiple"] = bulk_alone.usd_per_million > 0 ? fast.usd_per_million / bulk_alone.usd_per_million : 0.0;
  return j;
}

}  // namespace moeserve::tools
