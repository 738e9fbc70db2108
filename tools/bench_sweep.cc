// Decode sweep against the roofline.
#include "tools/bench_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/summary.h"
#include "engine/sampling.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"
#include "roofline/analysis.h"
#include "roofline/cost_model.h"

namespace moeserve::tools {

namespace {

// b sequences, each `ctx` tokens already cached, each decoding one token at position ctx,
// greedy on the device as the engine samples (only the tokens come back).
ForwardInput DecodeBatch(int64_t b, int64_t ctx, int64_t block_size, int64_t vocab, std::mt19937& gen) {
  const int64_t blocks_per_seq = (ctx + 1 + block_size - 1) / block_size;
  ForwardInput in;
  in.num_seqs = b;
  in.max_blocks_per_seq = blocks_per_seq;
  in.block_tables.resize(static_cast<size_t>(b * blocks_per_seq));
  for (int64_t j = 0; j < b; ++j) {
    for (int64_t k = 0; k < blocks_per_seq; ++k) in.block_tables[j * blocks_per_seq + k] = static_cast<int32_t>(j * blocks_per_seq + k);
    in.token_ids.push_back(static_cast<int32_t>(gen() % vocab));
    in.positions.push_back(static_cast<int32_t>(ctx));
    in.token_seq.push_back(static_cast<int32_t>(j));
    in.slots.push_back((j * blocks_per_seq + ctx / block_size) * block_size + ctx % block_size);
    in.logit_rows.push_back(static_cast<int32_t>(j));
  }
  in.sample.assign(static_cast<size_t>(b), SampleSpec{});
  in.logits_to_host = false;
  return in;
}

// Writes finite values into every byte of the KV pool. A pool never written is, on the CPU,
// untouched anonymous memory, which reads as the kernel's one shared zero page, from cache: the
// sweep's long contexts then attended at ~75 GB/s on a machine that reads 68 GB/s from DRAM
// (a Zen 5 VM), and their step times were not what serving those contexts costs.
absl::Status FillKv(Backend* backend, const KvStorage& kv) {
  const KvLayout& layout = kv.layout();
  const size_t total = layout.BlockBytes() * static_cast<size_t>(layout.num_blocks);
  const size_t elem = DTypeSize(layout.dtype);
  std::mt19937 gen(7);  // its own: the sweep's tokens (and so its routing) stay those of gen(42)
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(std::max<size_t>(1, std::min<size_t>(total, size_t{16} << 20) / elem));
  for (float& v : values) v = u(gen);
  std::vector<char> chunk(values.size() * elem);  // the pool's dtype (KvStorage admits f32 and bf16)
  ConvertFromF32(values.data(), values.size(), layout.dtype, chunk.data());
  for (size_t off = 0; off < total; off += chunk.size()) {
    RETURN_IF_ERROR(backend->CopyToDevice(static_cast<char*>(kv.data()) + off, chunk.data(),
                                          std::min(chunk.size(), total - off)));
  }
  return backend->Synchronize();
}

// Times decode steps of `in` (each feeding its tokens back): the median step and its phases.
absl::StatusOr<SweepPoint> MeasurePoint(MoeModel& model, const KvStorage& kv, ForwardInput in, const SweepOptions& o) {
  std::vector<float> logits;
  std::vector<int32_t> sampled;
  std::vector<double> times;
  std::vector<ForwardStats> stats;
  const int64_t b = in.num_seqs;
  // Unrecorded warm-up steps: at least 10 and 0.2 s (the first point of a sweep measured a
  // quarter slower over its first tens of steps with one).
  int warmup = 0;
  for (Stopwatch w; warmup < 10 || w.Seconds() < 0.2; ++warmup) {
    RETURN_IF_ERROR(model.Forward(in, kv.layout(), kv.data(), &logits, nullptr, &sampled));
    for (int64_t j = 0; j < b; ++j) in.token_ids[j] = sampled[j];
  }
  Stopwatch total;
  for (int step = 0; step < 1 + o.min_steps || total.Seconds() < o.min_seconds; ++step) {
    ForwardStats fs;
    Stopwatch sw;
    RETURN_IF_ERROR(model.Forward(in, kv.layout(), kv.data(), &logits, &fs, &sampled));
    const double t = sw.Seconds();  // the forward, which is what the cost model predicts
    for (int64_t j = 0; j < b; ++j) in.token_ids[j] = sampled[j];
    if (step == 0) {
      total.Reset();
      continue;
    }
    times.push_back(t);
    stats.push_back(fs);
    if (step >= 50) break;
  }
  SweepPoint p;
  p.steps = static_cast<int>(times.size());
  std::vector<size_t> order(times.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return times[x] < times[y]; });
  const size_t mid = order[order.size() / 2];
  p.observed_seconds = times[mid];
  p.min_seconds = times[order.front()];
  p.attention_seconds = stats[mid].attention_seconds;
  p.moe_seconds = stats[mid].moe_seconds;
  p.head_seconds = stats[mid].head_seconds;
  double hit = 0;
  for (const auto& s : stats) hit += static_cast<double>(s.experts_hit);
  p.experts_hit = hit / static_cast<double>(stats.size());
  return p;
}

// The efficiencies fitted to every point (and, as a hold-out check, to every other one), and
// each context's measured knee beside the predicted one.
void FitAndKnees(const ModelConfig& c, const roofline::ModelCosts& costs, const roofline::HardwareProfile& hw,
                 const SweepOptions& o, SweepReport* report) {
  std::vector<roofline::Observation> all, even, odd;
  for (size_t i = 0; i < report->points.size(); ++i) {
    const roofline::Observation ob{report->points[i].peak, report->points[i].observed_seconds};
    all.push_back(ob);
    (i % 2 == 0 ? even : odd).push_back(ob);
    if (ob.observed_seconds < 0.95 * ob.cost.bound_seconds) ++report->beats_bound;
  }
  report->fit = roofline::FitEfficiency(all);
  if (!even.empty() && !odd.empty()) report->holdout = roofline::Evaluate(odd, roofline::FitEfficiency(even).efficiency);
  for (SweepPoint& p : report->points) p.calibrated_seconds = roofline::PredictWithEfficiency(p.peak, report->fit.efficiency);
  report->num_experts = c.num_local_experts;
  for (int64_t ctx : o.contexts) {
    std::vector<double> bs, ts, bound, calibrated;
    for (const SweepPoint& p : report->points) {
      if (p.context != ctx) continue;
      bs.push_back(static_cast<double>(p.batch));
      ts.push_back(p.observed_seconds);
      bound.push_back(p.peak.bound_seconds);
      calibrated.push_back(p.calibrated_seconds);
    }
    if (bs.size() < 2) continue;
    SweepReport::Knee k;
    k.context = ctx;
    k.measured = roofline::MeasuredKnee(bs, ts);
    k.predicted_knee = roofline::MeasuredKnee(bs, bound);
    k.calibrated_knee = roofline::MeasuredKnee(bs, calibrated);
    k.predicted_critical = static_cast<double>(roofline::SmallestComputeBoundBatch(costs, hw, ctx + 1));
    if (k.predicted_critical == 0) k.no_critical_reason = roofline::NoCriticalBatchReason(costs, hw, ctx + 1);
    k.ratio = k.predicted_knee > 0 ? k.measured / k.predicted_knee : 0;
    k.experts_hit_batch1 = roofline::ExpectedExpertsHit(c.num_local_experts, c.num_experts_per_tok, 1);
    k.experts_hit_at_critical =
        roofline::ExpectedExpertsHit(c.num_local_experts, c.num_experts_per_tok, k.predicted_critical);
    report->knees.push_back(k);
  }
}

}  // namespace

absl::StatusOr<SweepReport> RunDecodeSweep(const ModelWeights& weights, Backend* backend,
                                           const roofline::HardwareProfile& hw, const SweepOptions& o) {
  const ModelConfig& c = weights.config();
  const roofline::ModelCosts costs = roofline::ModelCosts::From(
      c, roofline::WeightDtypeName(c, weights.dtype()), o.kv_dtype == DType::kF32 ? "f32" : "bf16");
  const int64_t max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  if (max_ctx + 1 > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--context: ", max_ctx, " + 1 exceeds the model's context of ",
                                                   c.max_position_embeddings));
  }
  // One KV pool for the largest point that fits the byte limit.
  auto blocks_per_seq = [&](int64_t ctx) { return (ctx + 1 + o.block_size - 1) / o.block_size; };
  int64_t pool_tokens = 0;
  for (int64_t b : o.batches) {
    for (int64_t ctx : o.contexts) {
      const int64_t tokens = b * blocks_per_seq(ctx) * o.block_size;
      if (tokens * costs.kv_bytes_per_token <= o.max_kv_bytes) pool_tokens = std::max(pool_tokens, tokens);
    }
  }
  if (pool_tokens == 0) return absl::InvalidArgumentError("no sweep point fits --sweep-max-kv-gb");
  ASSIGN_OR_RETURN(KvStorage kv, KvStorage::Create(backend, KvLayoutFor(c, pool_tokens / o.block_size, o.block_size,
                                                                        o.kv_dtype)));
  RETURN_IF_ERROR(FillKv(backend, kv));
  MoeModel model(&weights, backend);
  std::mt19937 gen(42);
  SweepReport report;
  report.weight_dtype = costs.weight_dtype;
  Progress progress("sweep", static_cast<int64_t>(o.batches.size() * o.contexts.size()), o.progress);
  int64_t done = 0;
  for (int64_t ctx : o.contexts) {
    for (int64_t b : o.batches) {
      if (b * blocks_per_seq(ctx) * o.block_size > pool_tokens) {
        report.skipped.push_back(absl::StrCat(b, "x", ctx));
        progress.Update(++done);
        continue;
      }
      ASSIGN_OR_RETURN(SweepPoint p, MeasurePoint(model, kv, DecodeBatch(b, ctx, o.block_size, c.vocab_size, gen), o));
      p.batch = b;
      p.context = ctx;
      roofline::StepShape shape = roofline::StepShape::Decode(b, ctx + 1);
      shape.experts_hit = p.experts_hit;
      p.peak = roofline::PredictStep(costs, shape, hw);
      report.points.push_back(p);
      progress.Update(++done, absl::StrCat("batch ", b, " context ", ctx, ": ", p.observed_seconds * 1e3, " ms"));
    }
  }
  progress.Finish(done);
  FitAndKnees(c, costs, hw, o, &report);
  return report;
}

// A calibration whose samples spread wider than this cannot judge a fraction of bound.
constexpr double kWideSpread = 0.2;

namespace {

// One context's knee, measured beside the predicted and calibrated ones.
nlohmann::json KneeJson(const SweepReport::Knee& k) {
  const bool has_critical = k.predicted_critical > 0;
  // Without a compute-bound batch the ratios to it do not exist: null, with the reason.
  auto over_critical = [&](double v) { return has_critical ? nlohmann::json(v / k.predicted_critical) : nlohmann::json(); };
  nlohmann::json knee = {{"context", k.context},
                         {"measured", k.measured},
                         {"predicted_knee", k.predicted_knee},
                         {"calibrated_knee", k.calibrated_knee},
                         {"predicted_critical_batch", has_critical ? nlohmann::json(k.predicted_critical) : nlohmann::json()},
                         {"measured_over_predicted_knee", k.ratio},
                         {"measured_over_critical_batch", over_critical(k.measured)},
                         {"predicted_knee_over_critical_batch", over_critical(k.predicted_knee)},
                         {"experts_hit_batch1", k.experts_hit_batch1}};
  if (has_critical) {
    knee["experts_hit_at_critical_batch"] = k.experts_hit_at_critical;
  } else {
    knee["no_critical_batch_reason"] = k.no_critical_reason;
  }
  return knee;
}

// One point: its times, the roofline's terms, and the fractions of the peaks it reached.
nlohmann::json PointJson(const SweepPoint& p, const roofline::HardwareProfile& hw, double peak) {
  const double t = p.observed_seconds;
  return {{"batch", p.batch},
          {"context", p.context},
          {"steps", p.steps},
          {"observed_s", t},
          {"min_s", p.min_seconds},
          {"bound_s", p.peak.bound_seconds},
          {"calibrated_s", p.calibrated_seconds},
          {"observed_over_bound", t / p.peak.bound_seconds},
          {"calibrated_error", p.calibrated_seconds / t - 1},
          {"compute_s", p.peak.compute_seconds},
          {"memory_s", p.peak.memory_seconds},
          {"weight_s", p.peak.weight_seconds},
          {"kv_s", p.peak.kv_seconds},
          {"flops", p.peak.flops},
          {"bytes", p.peak.weight_bytes + p.peak.kv_read_bytes + p.peak.kv_write_bytes},
          {"experts_hit", p.experts_hit},
          {"achieved_flops_fraction", p.peak.flops / t / peak},
          {"achieved_bandwidth_fraction",
           (p.peak.weight_bytes + p.peak.kv_read_bytes + p.peak.kv_write_bytes) / t /
               (p.peak.llc_resident ? hw.llc_bandwidth : hw.mem_bandwidth)},
          {"llc_resident", p.peak.llc_resident},
          {"attention_s", p.attention_seconds},
          {"moe_s", p.moe_seconds},
          {"head_s", p.head_seconds},
          {"tokens_per_s", static_cast<double>(p.batch) / t},
          {"usd_per_million_tokens",
           hw.price_per_hour / 3600.0 * t / static_cast<double>(p.batch) * 1e6}};
}

}  // namespace

nlohmann::json SweepToJson(const SweepReport& r, const roofline::HardwareProfile& hw) {
  nlohmann::json j;
  j["weight_dtype"] = r.weight_dtype;
  const double peak = hw.PeakFlops(r.weight_dtype);
  j["hardware"] = nlohmann::json::parse(hw.ToJson());
  // A fit pushed to a limit explains nothing: its coefficients are not reported (null), the
  // reasons and the points it could not explain are.
  j["fit_at_limit"] = r.fit.at_limit;
  j["fit_unidentified"] = r.fit.unidentified;
  if (r.fit.Degenerate()) {
    j["efficiency"] = nullptr;
  } else {
    j["efficiency"] = {{"compute", r.fit.efficiency.compute},
                       {"attention", r.fit.efficiency.attention},
                       {"memory", r.fit.efficiency.memory},
                       {"overlap", r.fit.efficiency.overlap},
                       {"overhead_seconds", r.fit.efficiency.overhead_seconds}};
  }
  j["unexplained_points"] = nlohmann::json::array();
  for (size_t i : r.fit.unexplained) {
    const SweepPoint& p = r.points[i];
    j["unexplained_points"].push_back({{"batch", p.batch}, {"context", p.context}, {"observed_s", p.observed_seconds},
                                       {"calibrated_s", p.calibrated_seconds}});
  }
  j["profile_measurement_spread"] = hw.measurement_spread;
  j["calibrated_median_abs_error"] = r.fit.median_abs_rel_error;
  j["calibrated_max_abs_error"] = r.fit.max_abs_rel_error;
  j["holdout_median_abs_error"] = r.holdout.median_abs_rel_error;
  j["points_beating_bound"] = r.beats_bound;
  j["skipped"] = r.skipped;
  for (const auto& k : r.knees) j["knees"].push_back(KneeJson(k));
  for (const SweepPoint& p : r.points) j["points"].push_back(PointJson(p, hw, peak));
  return j;
}

void PrintSweep(const SweepReport& r, const roofline::HardwareProfile& hw) {
  const double peak = hw.PeakFlops(r.weight_dtype);
  std::printf("%6s %8s %11s %11s %11s %9s %9s %8s %8s %9s\n", "batch", "context", "observed ms", "bound ms",
              "calib. ms", "obs/bound", "error", "flops %", "bw %", "tokens/s");
  for (const SweepPoint& p : r.points) {
    const double t = p.observed_seconds;
    const double bytes = p.peak.weight_bytes + p.peak.kv_read_bytes + p.peak.kv_write_bytes;
    std::printf("%6lld %8lld %11.3f %11.3f %11.3f %9.2f %8.1f%% %7.1f%% %7.1f%% %9.1f\n",
                static_cast<long long>(p.batch), static_cast<long long>(p.context), t * 1e3,
                p.peak.bound_seconds * 1e3, p.calibrated_seconds * 1e3, t / p.peak.bound_seconds,
                100 * (p.calibrated_seconds / t - 1), 100 * p.peak.flops / t / peak,
                100 * bytes / t / (p.peak.llc_resident ? hw.llc_bandwidth : hw.mem_bandwidth), static_cast<double>(p.batch) / t);
  }
  const auto& e = r.fit.efficiency;
  if (r.fit.Degenerate()) {
    std::printf("calibrated model: not reported, the fit is degenerate: %s\n", absl::StrJoin(r.fit.at_limit, "; ").c_str());
  } else {
    std::printf(
        "calibrated model: efficiency GEMM %.3f, attention %.3f, memory %.3f; overlap %.2f; overhead %.3f ms\n",
        e.compute, e.attention, e.memory, e.overlap, e.overhead_seconds * 1e3);
  }
  if (!r.fit.unidentified.empty()) {
    std::printf("  not pinned down by these points: %s\n", absl::StrJoin(r.fit.unidentified, "; ").c_str());
  }
  for (size_t i : r.fit.unexplained) {
    std::printf("  not explained: batch %lld context %lld, observed %.3f ms, calibrated %.3f ms\n",
                static_cast<long long>(r.points[i].batch), static_cast<long long>(r.points[i].context),
                r.points[i].observed_seconds * 1e3, r.points[i].calibrated_seconds * 1e3);
  }
  if (hw.measurement_spread > kWideSpread) {
    std::printf("  warning: the profile's samples spread %.0f%% (> %.0f%%): every fraction of bound above is uncertain "
                "by that much; calibrate again on a quieter machine\n",
                100 * hw.measurement_spread, 100 * kWideSpread);
  }
  std::printf("  median |error| %.1f%% (max %.1f%%); fitted on even points, odd points: median %.1f%%\n",
              100 * r.fit.median_abs_rel_error, 100 * r.fit.max_abs_rel_error, 100 * r.holdout.median_abs_rel_error);
  std::printf("  points faster than the peak bound by more than 5%%: %lld\n", static_cast<long long>(r.beats_bound));
  for (const auto& k : r.knees) {
    std::printf("  context %lld: knee measured %.1f, roofline %.1f (ratio %.2f), calibrated %.1f; ",
                static_cast<long long>(k.context), k.measured, k.predicted_knee, k.ratio, k.calibrated_knee);
    if (k.predicted_critical == 0) {
      std::printf("%s\n", k.no_critical_reason.c_str());
      continue;
    }
    std::printf("critical batch (compute = memory at the peaks) %.1f (ratio %.2f)\n", k.predicted_critical,
                k.measured / k.predicted_critical);
    // A knee at the critical batch presumes a memory term flat below it; say when the model's
    // own bound already bends well below it, i.e. where even an ideal implementation would.
    if (k.predicted_critical > 1 && k.predicted_knee < k.predicted_critical / 1.5) {
      const std::string why =
          k.experts_hit_at_critical > k.experts_hit_batch1 + 0.5
              ? absl::StrFormat("the weights read grow with the experts hit (%.1f of %d per layer at batch 1, "
                                "%.1f at the critical batch)",
                                k.experts_hit_batch1, r.num_experts, k.experts_hit_at_critical)
              : std::string("the KV read grows with the batch at this context");
      std::printf("    not a knee here: the roofline bound itself bends at %.2fx the critical batch, since %s\n",
                  k.predicted_knee / k.predicted_critical, why.c_str());
    }
  }
  if (!r.skipped.empty()) {
    std::printf("  skipped (KV over the limit): %s\n", absl::StrJoin(r.skipped, " ").c_str());
  }
}

}  // namespace moeserve::tools
