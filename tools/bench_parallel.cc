// Parallel layout report.
#include "tools/bench_parallel.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "roofline/analysis.h"

namespace moeserve::tools {

namespace {

// Each rank's place and bytes, and the largest and total weights and the largest KV per token.
void AddRanks(const Engine& engine, DType weight_dtype, nlohmann::json* j, double* kv_token_max) {
  const EngineConfig& ec = engine.config();
  const ModelConfig& c = engine.model_config();
  double weight_max = 0, weight_total = 0;
  *kv_token_max = 0;
  nlohmann::json ranks = nlohmann::json::array();
  if (const ParallelExecutor* x = engine.parallel(); x != nullptr) {
    // The devices of the ranks this process holds: all of them, or under mpirun rank 0's alone
    // (the others' are in their processes; null here).
    const auto devices = x->device_bytes();
    const bool processes = x->processes() != nullptr;
    for (const RankLayout& l : x->layout()) {
      const bool held = processes ? l.rank == 0 : static_cast<size_t>(l.rank) < devices.size();
      const size_t d = processes ? 0 : static_cast<size_t>(l.rank);
      ranks.push_back({{"rank", l.rank},
                       {"device_bytes_used", held ? nlohmann::json(devices[d].first) : nlohmann::json()},
                       {"device_bytes_capacity", held ? nlohmann::json(devices[d].second) : nlohmann::json()},
                       {"stage", l.stage},
                       {"ep_rank", l.ep_rank},
                       {"layers", {l.layer_begin, l.layer_end}},
                       {"experts", l.experts},
                       {"weight_bytes", l.weight_bytes},
                       {"kv_bytes_per_token", l.kv_bytes_per_token}});
      weight_max = std::max(weight_max, l.weight_bytes);
      weight_total += l.weight_bytes;
      *kv_token_max = std::max(*kv_token_max, l.kv_bytes_per_token);
    }
  } else {  // one rank holds everything
    weight_max = weight_total = static_cast<double>(c.TotalParams()) * DTypeSize(weight_dtype);
    *kv_token_max = static_cast<double>(c.KvElemsPerToken() * c.num_hidden_layers) * DTypeSize(ec.kv_dtype);
  }
  (*j)["ranks"] = ranks;
  (*j)["weight_bytes_per_device_max"] = weight_max;
  (*j)["weight_bytes_all_devices"] = weight_total;
  (*j)["kv_bytes_per_token_per_device"] = *kv_token_max;
}

// With a hardware profile: the batch one device needs before compute catches up with its weight
// reads, with this layout.
void AddCriticalBatch(const Engine& engine, DType weight_dtype, double mean_seq_tokens,
                      const roofline::HardwareProfile& hw, nlohmann::json* j) {
  const EngineConfig& ec = engine.config();
  const ModelConfig& c = engine.model_config();
  roofline::RooflineInputs in;
  in.model = roofline::ModelCosts::From(c, roofline::WeightDtypeName(c, weight_dtype), ec.kv_dtype == DType::kF32 ? "f32" : "bf16");
  in.hw = hw;
  in.layout = {ec.parallel.ep, ec.parallel.pp, ec.parallel.domain_size};
  in.context = static_cast<int64_t>(mean_seq_tokens);
  const roofline::RooflineReport r = roofline::AnalyzeRoofline(in);
  (*j)["critical_batch"] = r.critical_batch;
  (*j)["critical_batch_routed_experts"] = r.critical_batch_routed_experts;
  (*j)["critical_batch_moe_aware"] = r.critical_batch_moe_aware;
  (*j)["sparsity"] = static_cast<double>(c.num_local_experts) / static_cast<double>(c.num_experts_per_tok);
}

}  // namespace

nlohmann::json ParallelReport(const Engine& engine, DType weight_dtype, const std::vector<StepRecord>& steps,
                              double mean_seq_tokens, double elapsed_seconds,
                              const std::optional<roofline::HardwareProfile>& hw) {
  const EngineConfig& ec = engine.config();
  nlohmann::json j;
  j["layout"] = ec.parallel.Name();
  j["ep"] = ec.parallel.ep;
  j["pp"] = ec.parallel.pp;
  double kv_token_max = 0;
  AddRanks(engine, weight_dtype, &j, &kv_token_max);
  // A sequence lives on one EP rank and, with pp stages, on one device per stage.
  j["kv_bytes_per_sequence_per_device"] = kv_token_max * mean_seq_tokens;
  int64_t tokens = 0, comm = 0, seqs = 0, scale_out = 0;
  double comm_s = 0, busy = 0, expert_imb = 0, rank_imb = 0, attn_imb = 0, predicted_comm_s = 0, predicted_comm = 0,
         predicted_scale_out = 0;
  int64_t imb_steps = 0;
  for (const StepRecord& s : steps) {
    tokens += s.num_tokens;
    seqs += s.num_seqs;
    comm += s.comm_bytes_observed;
    scale_out += s.scale_out_bytes_observed;
    predicted_scale_out += s.scale_out_bytes;
    comm_s += s.comm_seconds;
    predicted_comm_s += s.predicted_comm_seconds;
    predicted_comm += s.comm_bytes;
    busy += s.duration_seconds;
    if (s.expert_imbalance > 0) {
      expert_imb += s.expert_imbalance;
      rank_imb += s.rank_imbalance;
      attn_imb += s.attention_imbalance;
      ++imb_steps;
    }
  }
  const double mean_batch = steps.empty() ? 0.0 : static_cast<double>(seqs) / static_cast<double>(steps.size());
  j["tokens_per_second"] = elapsed_seconds > 0 ? tokens / elapsed_seconds : 0.0;
  j["mean_step_ms"] = steps.empty() ? 0.0 : 1e3 * busy / static_cast<double>(steps.size());
  j["mean_batch"] = mean_batch;
  // Every device holds KV (of its layers) for every sequence in flight that it serves; pp stages
  // need pp micro-batches in flight to stay busy.
  const int64_t micro = ec.parallel.pp > 1 ? (ec.parallel.micro_batches > 0 ? ec.parallel.micro_batches : ec.parallel.pp) : 1;
  j["sequences_per_micro_batch"] = mean_batch / static_cast<double>(micro);
  j["kv_bytes_per_device_in_flight"] = kv_token_max * mean_seq_tokens * mean_batch / static_cast<double>(ec.parallel.ep);
  j["comm_bytes_per_token"] = tokens ? static_cast<double>(comm) / static_cast<double>(tokens) : 0.0;
  // ... of which crossed between scale-up domains (--domain-size; 0 with one domain).
  j["scale_out_bytes_per_token"] = tokens ? static_cast<double>(scale_out) / static_cast<double>(tokens) : 0.0;
  j["comm_share_of_step_time"] = busy > 0 ? comm_s / busy : 0.0;
  // Per token, measured (the slowest rank's time in collectives, waiting included) and, with a
  // hardware profile, the roofline's prediction for the layout and its domains.
  j["comm_us_per_token"] = tokens ? 1e6 * comm_s / static_cast<double>(tokens) : 0.0;
  j["domain_size"] = ec.parallel.domain_size;
  j["process_ranks"] = engine.parallel() != nullptr && engine.parallel()->processes() != nullptr;
  if (hw) {
    j["predicted_comm_bytes_per_token"] = tokens ? predicted_comm / static_cast<double>(tokens) : 0.0;
    j["predicted_scale_out_bytes_per_token"] = tokens ? predicted_scale_out / static_cast<double>(tokens) : 0.0;
    j["predicted_comm_us_per_token"] = tokens ? 1e6 * predicted_comm_s / static_cast<double>(tokens) : 0.0;
    AddCriticalBatch(engine, weight_dtype, mean_seq_tokens, *hw, &j);
  }
  j["mean_expert_imbalance"] = imb_steps ? expert_imb / imb_steps : 0.0;
  j["mean_rank_imbalance"] = imb_steps ? rank_imb / imb_steps : 0.0;
  j["mean_attention_imbalance"] = imb_steps ? attn_imb / imb_steps : 0.0;
  if (const EngineStats stats = engine.GetStats(); stats.has_eplb) {  // --eplb-interval
    j["eplb"] = {{"rearrangements", stats.eplb_rearrangements}, {"failures", stats.eplb_failures},
                 {"experts_copied", stats.eplb_experts_copied}, {"bytes_copied", stats.eplb_bytes_copied},
                 {"seconds", stats.eplb_seconds}, {"rank_imbalance_after_last", stats.eplb_rank_imbalance}};
  }
  return j;
}

void PrintParallelReport(const nlohmann::json& j) {
  std::printf("  layout %s: %.1f tokens/s, step %.2f ms, mean batch %.1f\n", j["layout"].get<std::string>().c_str(),
              j["tokens_per_second"].get<double>(), j["mean_step_ms"].get<double>(), j["mean_batch"].get<double>());
  std::printf("    per device: weights %.2f MB (all devices %.2f MB), KV %.1f KB per token, %.2f MB per mean sequence\n",
              j["weight_bytes_per_device_max"].get<double>() / 1e6, j["weight_bytes_all_devices"].get<double>() / 1e6,
              j["kv_bytes_per_token_per_device"].get<double>() / 1e3,
              j["kv_bytes_per_sequence_per_device"].get<double>() / 1e6);
  std::printf("    in flight: %.1f sequences per micro-batch; KV per device for all of them %.2f MB\n",
              j["sequences_per_micro_batch"].get<double>(), j["kv_bytes_per_device_in_flight"].get<double>() / 1e6);
  std::printf("    communication: %.0f bytes per token, %.1f%% of step time; imbalance experts %.2f, EP ranks %.2f "
              "(expert rows), %.2f (attention tokens)\n",
              j["comm_bytes_per_token"].get<double>(), 100 * j["comm_share_of_step_time"].get<double>(),
              j["mean_expert_imbalance"].get<double>(), j["mean_rank_imbalance"].get<double>(),
              j["mean_attention_imbalance"].get<double>());
  std::printf("    communication per token: %.1f us measured%s\n", j["comm_us_per_token"].get<double>(),
              j.contains("predicted_comm_us_per_token")
                  ? absl::StrCat(", predicted ", absl::StrFormat("%.1f", j["predicted_comm_us_per_token"].get<double>()),
                                 " us for ", absl::StrFormat("%.0f", j["predicted_comm_bytes_per_token"].get<double>()),
                                 " bytes (domains of ", j["domain_size"].get<int64_t>(), " ranks; 0: one)")
                        .c_str()
                  : "");
  if (j.contains("eplb")) {
    const nlohmann::json& e = j["eplb"];
    std::printf("    EPLB: %lld re-placements (%lld failed), %lld experts copied (%.1f MiB) in %.1f ms; busiest EP rank "
                "over the mean after the latest %.3f (under its window)\n",
                static_cast<long long>(e["rearrangements"].get<int64_t>()),
                static_cast<long long>(e["failures"].get<int64_t>()),
                static_cast<long long>(e["experts_copied"].get<int64_t>()), e["bytes_copied"].get<double>() / 1048576.0,
                1e3 * e["seconds"].get<double>(), e["rank_imbalance_after_last"].get<double>());
  }
  if (j["domain_size"].get<int64_t>() > 0) {
    std::printf("    across domains: %.0f bytes per token measured%s\n", j["scale_out_bytes_per_token"].get<double>(),
                j.contains("predicted_scale_out_bytes_per_token")
                    ? absl::StrFormat(", predicted %.0f", j["predicted_scale_out_bytes_per_token"].get<double>()).c_str()
                    : "");
  }
  if (j.contains("critical_batch")) {
    std::printf("    roofline: critical batch %.0f, routed experts alone %.0f (sparsity E/k = %.0f), MoE-aware %.0f\n",
                j["critical_batch"].get<double>(), j["critical_batch_routed_experts"].get<double>(),
                j["sparsity"].get<double>(), j["critical_batch_moe_aware"].get<double>());
  }
}

}  // namespace moeserve::tools
