// `moeserve roofline`: the lecture-style numbers of a model on a machine, from the cost model
// alone (nothing runs): critical batch, latency floor, drain time, KV limits, and a table of
// predicted step time, throughput and cost per million tokens over batch sizes.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/status.h"
#include "roofline/analysis.h"
#include "roofline/model_presets.h"
#include "tools/commands.h"

namespace moeserve::tools {
namespace {

struct RooflineOptions {
  std::string model_dir;
  std::string preset;
  std::string config;
  std::string hardware = "h100-sxm";
  std::string dtype;
  std::string kv_dtype = "bf16";
  int64_t context = 4096;
  std::string batches = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384";
  int64_t ep = 0;
  int64_t pp = 1;
  int64_t domain_size = 0;
  double price_per_hour = -1;
  std::string json;
  std::string csv;
};

std::string Human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (v >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g %s%s", v, prefixes[i], unit);
  return buf;
}

// The analysis' inputs from the flags, checked.
absl::StatusOr<roofline::RooflineInputs> MakeInputs(const RooflineOptions& o, const ModelConfig& config,
                                                     const roofline::HardwareProfile& hw, const std::string& dtype) {
  if (o.kv_dtype != "bf16" && o.kv_dtype != "f32") return absl::InvalidArgumentError("--kv-dtype: bf16 or f32");
  if (o.context < 1) return absl::InvalidArgumentError("--context must be >= 1");
  if (o.pp < 1) return absl::InvalidArgumentError("--pp must be >= 1");
  roofline::RooflineInputs in;
  in.model = roofline::ModelCosts::From(config, dtype, o.kv_dtype);
  in.hw = hw;
  in.layout.ep = o.ep > 0 ? o.ep : hw.devices;
  in.layout.pp = o.pp;
  in.layout.domain_size = o.domain_size;
  RETURN_IF_ERROR(roofline::CheckDomainSize(in.layout, "--domain-size"));
  in.context = o.context;
  in.price_per_hour = o.price_per_hour >= 0 ? o.price_per_hour : hw.price_per_hour;
  for (absl::string_view part : absl::StrSplit(o.batches, ',', absl::SkipEmpty())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--batches: '", part, "' is not an integer >= 1"));
    }
    in.batches.push_back(b);
  }
  return in;
}

void PrintReport(const roofline::RooflineInputs& in, const roofline::RooflineReport& r, const std::string& dtype) {
  const roofline::HardwareProfile& hw = in.hw;
  const double devices = static_cast<double>(in.layout.devices());
  const long long context = static_cast<long long>(in.context);
  std::printf("model: %s total, %s active parameters (%s weights, %s KV per token)\n",
              Human(in.model.total_params, "").c_str(), Human(in.model.active_params, "").c_str(), dtype.c_str(),
              Human(r.kv_bytes_per_token, "B").c_str());
  std::printf("hardware: %s x %lld (ep=%lld pp=%lld): %s FLOP/s, %s/s, %s per device (%s)\n", hw.name.c_str(),
              static_cast<long long>(in.layout.devices()), static_cast<long long>(in.layout.ep),
              static_cast<long long>(in.layout.pp), Human(hw.PeakFlops(dtype), "").c_str(),
              Human(hw.mem_bandwidth, "B").c_str(), Human(hw.mem_capacity, "B").c_str(), hw.source.c_str());
  std::printf("  FLOP/byte ratio:             %.1f\n", r.flops_per_byte);
  std::printf("  critical batch:              %.0f tokens  (ratio x total/active%s)\n", r.critical_batch,
              dtype == "f32" ? " x 2 for f32" : "");
  std::printf("  ... routed-expert layers:    %.0f tokens  (ratio x experts/top-k)\n", r.critical_batch_routed_experts);
  std::printf("  ... MoE-aware, this layout:  %.0f tokens  (compute = weight time, experts expected to be hit)\n",
              r.critical_batch_moe_aware);
  std::printf("  latency floor:               %.3f ms  (all weights once over %s/s, fully sharded)\n",
              r.latency_floor_seconds * 1e3, Human(hw.mem_bandwidth * devices, "B").c_str());
  std::printf("  ... with this layout:        %.3f ms  (each EP rank reads the dense weights)\n",
              r.latency_floor_layout_seconds * 1e3);
  std::printf("  batch-1 step at context %lld: %.3f ms\n", context, r.latency_floor_batch1_seconds * 1e3);
  std::printf("  drain time:                  %.2f ms  (capacity / bandwidth)\n", r.drain_seconds * 1e3);
  std::printf("  largest batch whose KV fits at context %lld: %lld\n", context,
              static_cast<long long>(r.max_batch_kv_fits));
  std::printf("  context where KV reads = weight reads: %.0f tokens at batch 1, %.0f at the critical batch\n",
              r.kv_equals_weights_context_batch1, r.kv_equals_weights_context_at_critical);
  if (in.layout.ep > 1) {
    const int64_t d = in.layout.EpDomain();
    std::printf("  expert all-to-all: %lld EP ranks in domains of %lld; scale-up %s/s, scale-out %s/s per device\n",
                static_cast<long long>(in.layout.ep), static_cast<long long>(d),
                Human(hw.interconnect_bandwidth, "B").c_str(), Human(hw.scale_out_bandwidth, "B").c_str());
  }
  std::printf("\n%8s %12s %12s %12s %12s %12s %14s %10s %6s\n", "batch", "step ms", "compute ms", "memory ms",
              "comm ms", "tokens/s", "$/M tokens", "bound", "fits");
  for (const auto& row : r.rows) {
    std::printf("%8lld %12.4f %12.4f %12.4f %12.4f %12.1f %14.4f %10s %6s\n", static_cast<long long>(row.batch),
                row.cost.bound_seconds * 1e3, row.cost.compute_seconds * 1e3, row.cost.memory_seconds * 1e3,
                row.cost.comm_seconds * 1e3, row.tokens_per_second, row.usd_per_million_tokens,
                row.cost.compute_bound ? "compute" : "memory", row.kv_fits ? "yes" : "no");
  }
  std::printf("(price: $%.2f per device-hour; context %lld per sequence)\n", in.price_per_hour, context);
}

// --json and --csv: the figures above and one row per batch.
absl::Status WriteReport(const RooflineOptions& o, const roofline::RooflineInputs& in,
                         const roofline::RooflineReport& r, const std::string& dtype) {
  nlohmann::json j;
  j["hardware"] = nlohmann::json::parse(in.hw.ToJson());
  j["model"] = {{"total_params", in.model.total_params}, {"active_params", in.model.active_params},
                {"weight_dtype", dtype}, {"kv_bytes_per_token", r.kv_bytes_per_token}};
  j["layout"] = {{"ep", in.layout.ep}, {"pp", in.layout.pp}, {"domain_size", in.layout.domain_size}};
  j["context"] = o.context;
  j["flops_per_byte"] = r.flops_per_byte;
  j["critical_batch"] = r.critical_batch;
  j["critical_batch_routed_experts"] = r.critical_batch_routed_experts;
  j["critical_batch_moe_aware"] = r.critical_batch_moe_aware;
  j["latency_floor_s"] = r.latency_floor_seconds;
  j["latency_floor_layout_s"] = r.latency_floor_layout_seconds;
  j["batch1_step_s"] = r.latency_floor_batch1_seconds;
  j["drain_s"] = r.drain_seconds;
  j["max_batch_kv_fits"] = r.max_batch_kv_fits;
  j["kv_equals_weights_context_batch1"] = r.kv_equals_weights_context_batch1;
  j["kv_equals_weights_context_at_critical"] = r.kv_equals_weights_context_at_critical;
  std::string csv = "batch,step_s,compute_s,memory_s,tokens_per_s,usd_per_million_tokens,compute_bound,kv_fits\n";
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"batch", row.batch},
                         {"step_s", row.cost.bound_seconds},
                         {"compute_s", row.cost.compute_seconds},
                         {"memory_s", row.cost.memory_seconds},
                         {"weight_s", row.cost.weight_seconds},
                         {"kv_s", row.cost.kv_seconds},
                         {"comm_s", row.cost.comm_seconds},
                         {"comm_bytes", row.cost.comm_bytes},
                         {"scale_out_bytes", row.cost.scale_out_bytes},
                         {"experts_hit", row.cost.experts_hit},
                         {"tokens_per_s", row.tokens_per_second},
                         {"usd_per_million_tokens", row.usd_per_million_tokens},
                         {"kv_fits", row.kv_fits}});
    csv += absl::StrCat(row.batch, ",", row.cost.bound_seconds, ",", row.cost.compute_seconds, ",",
                        row.cost.memory_seconds, ",", row.tokens_per_second, ",", row.usd_per_million_tokens, ",",
                        row.cost.compute_bound ? 1 : 0, ",", row.kv_fits ? 1 : 0, "\n");
  }
  if (!o.json.empty()) RETURN_IF_ERROR(WriteFileAtomically(o.json, j.dump(2) + "\n"));
  if (!o.csv.empty()) RETURN_IF_ERROR(WriteFileAtomically(o.csv, csv));
  return absl::OkStatus();
}

int RunRoofline(const RooflineOptions& o) {
  auto config = AnalysisConfig(o.model_dir, o.preset, o.config);
  if (!config.ok()) return Fail(config.status());
  auto hw = roofline::LoadHardware(o.hardware);
  if (!hw.ok()) return Fail(hw.status());
  auto dtype = AnalysisDtype(*config, o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto in = MakeInputs(o, *config, *hw, *dtype);
  if (!in.ok()) return Fail(in.status());
  const roofline::RooflineReport r = roofline::AnalyzeRoofline(*in);
  PrintReport(*in, r, *dtype);
  if (absl::Status s = WriteReport(o, *in, r, *dtype); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace

absl::StatusOr<ModelConfig> AnalysisConfig(const std::string& model_dir, const std::string& preset,
                                           const std::string& config) {
  const int given = !model_dir.empty() + !preset.empty() + !config.empty();
  if (given > 1) return absl::InvalidArgumentError("give one of --model, --preset or --config");
  if (!model_dir.empty()) return ModelConfig::FromFile(model_dir + "/config.json");
  if (!config.empty()) return ModelConfig::FromFile(config);
  return roofline::AnalysisPreset(preset.empty() ? "small" : preset);
}

absl::StatusOr<std::string> AnalysisDtype(const ModelConfig& config, const std::string& dtype_flag) {
  std::string dtype = !dtype_flag.empty()     ? dtype_flag
                      : config.fp8_checkpoint ? "fp8"
                                              : std::string(DTypeShortName(config.torch_dtype));
  if (dtype == "f16") dtype = "bf16";  // same size and rate
  if (dtype != "bf16" && dtype != "f32" && dtype != "fp8") return absl::InvalidArgumentError("--dtype: bf16, f32 or fp8");
  return dtype;
}

void AddRooflineCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RooflineOptions>();
  CLI::App* cmd = app.add_subcommand(
      "roofline", "Critical batch, latency floor, drain time, KV limits and a cost table from the roofline model");
  cmd->add_option("--model", o->model_dir, "Checkpoint directory whose config.json to analyse");
  cmd->add_option("--preset", o->preset,
                  "Model preset: " + absl::StrJoin(roofline::AnalysisPresetNames(), ", ") + " (default: small)");
  cmd->add_option("--config", o->config, "A Hugging Face style config.json to analyse");
  cmd->add_option("--hardware", o->hardware,
                  "Hardware preset (" + absl::StrJoin(roofline::HardwarePresetNames(), ", ") +
                      ") or a JSON profile from `moeserve calibrate`")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "Weight dtype: bf16, f32 or fp8 (a byte per weight plus block scales; default: fp8 for a config with an fp8 quantization_config, else its torch_dtype)");
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache dtype: bf16 or f32")->capture_default_str();
  cmd->add_option("--context", o->context, "Tokens per sequence for the KV terms")->capture_default_str();
  cmd->add_option("--batches", o->batches, "Comma-separated batch sizes of the table")->capture_default_str();
  cmd->add_option("--ep", o->ep, "Devices the experts are spread over (default: the profile's devices)");
  cmd->add_option("--pp", o->pp, "Pipeline stages")->capture_default_str();
  cmd->add_option("--domain-size", o->domain_size,
                  "Devices per scale-up domain (NVLink island; ranks numbered stage x ep + EP rank fill the domains "
                  "in order): all-to-all traffic between domains and pipeline hand-offs between stages in different "
                  "domains are priced at the profile's scale_out_bandwidth and scale_out_latency. 0: one domain")
      ->capture_default_str();
  cmd->add_option("--price-per-hour", o->price_per_hour, "$ per device-hour (default: the profile's)");
  cmd->add_option("--json", o->json, "Write the numbers and the table as JSON");
  cmd->add_option("--csv", o->csv, "Write the table as CSV");
  cmd->callback([o, exit_code] { *exit_code = RunRoofline(*o); });
}

}  // namespace moeserve::tools
