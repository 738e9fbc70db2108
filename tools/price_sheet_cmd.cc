// `moeserve price-sheet`: a provider's unit prices for a model on a machine (input, output,
// cached input per memory tier, price against context, fast mode), from the roofline alone
// (--predict, any preset) and from the local engine's measured step times (--measure), by the
// same formulas (roofline/pricing.h); docs/economics.md derives them and cites the default prices.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/status.h"
#include "roofline/model_presets.h"
#include "roofline/predicted_times.h"
#include "tools/calibrate/measure.h"
#include "tools/commands.h"
#include "tools/price_measure.h"
#include "tools/price_report.h"

namespace moeserve::tools {
namespace {

// Default prices (sources in docs/economics.md).
constexpr double kDdrUsdPerGbHour = 0.004237;    // cloud VM memory, per GB-hour
constexpr double kFlashUsdPerGbHour = 0.00011;   // local NVMe / block SSD, $0.08 per GB-month
constexpr double kLocalCpuUsdPerHour = 0.15;     // a 2-vCPU, 16 GiB on-demand cloud VM

struct PriceSheetOptions {
  std::string model_dir, preset, config, hardware, dtype, kv_dtype = "bf16";
  int64_t ep = 0;
  double price_per_hour = -1, gb_hour_device = -1, gb_hour_ddr = kDdrUsdPerGbHour, gb_hour_flash = kFlashUsdPerGbHour;
  roofline::TrafficMix mix;
  double tpot_ms = 50, ttft_ms = 2000;
  std::string batches, contexts, prefill_tokens;
  bool measure = false;
  int repeats = 3;
  int64_t tier_prompt = -1;
  int64_t fast_lane_output = -1;
  int threads = 0;
  CpuKernelFlags cpu_kernel;
  std::string json, csv;
};

// A list flag's values, each once.
absl::StatusOr<std::vector<int64_t>> ParseDistinct(const std::string& flag, const std::string& text) {
  ASSIGN_OR_RETURN(std::vector<int64_t> v, ParseIntList(flag, text));
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::vector<int64_t> Powers(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t x = from; x <= to; x *= 2) v.push_back(x);
  return v;
}

// The grid: the flags' lists, or defaults sized for a GPU preset (--predict) or for this CPU
// (--measure, where each point is a run). The mix's decode context is always on the curve.
absl::StatusOr<roofline::PriceGrid> MakeGrid(const PriceSheetOptions& o, int64_t max_context) {
  roofline::PriceGrid g;
  if (o.batches.empty()) {
    g.batches = Powers(1, o.measure ? 256 : 1 << 20);
  } else {
    ASSIGN_OR_RETURN(g.batches, ParseDistinct("--batches", o.batches));
  }
  if (o.prefill_tokens.empty()) {
    g.chunks = Powers(o.measure ? 64 : 256, o.measure ? 4096 : 262144);
  } else {
    ASSIGN_OR_RETURN(g.chunks, ParseDistinct("--prefill-tokens", o.prefill_tokens));
  }
  if (o.contexts.empty()) {
    g.contexts = Powers(256, std::min<int64_t>(max_context, o.measure ? 8192 : max_context));
    if (g.contexts.empty() || g.contexts.back() != max_context) {
      if (!o.measure) g.contexts.push_back(max_context);
    }
  } else {
    ASSIGN_OR_RETURN(g.contexts, ParseDistinct("--contexts", o.contexts));
  }
  g.contexts.push_back(o.mix.DecodeContext());
  std::sort(g.contexts.begin(), g.contexts.end());
  g.contexts.erase(std::unique(g.contexts.begin(), g.contexts.end()), g.contexts.end());
  if (g.contexts.back() > max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("--contexts: ", g.contexts.back(), " exceeds the model's context of ", max_context));
  }
  return g;
}

absl::StatusOr<ModelConfig> ResolveConfig(const PriceSheetOptions& o) {
  if (!o.model_dir.empty() + !o.preset.empty() + !o.config.empty() > 1) {
    return absl::InvalidArgumentError("give one of --model, --preset or --config");
  }
  if (!o.model_dir.empty()) return ModelConfig::FromFile(o.model_dir + "/config.json");
  if (!o.config.empty()) {
    if (o.measure) return absl::InvalidArgumentError("--measure needs weights: --model or an engine --preset");
    return ModelConfig::FromFile(o.config);
  }
  const std::string name = o.preset.empty() ? (o.measure ? "small" : "deepseek-v3-like") : o.preset;
  if (o.measure) {
    const auto engine_presets = PresetNames();
    if (std::find(engine_presets.begin(), engine_presets.end(), name) == engine_presets.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--preset: --measure runs the model, so one of ",
                                                     absl::StrJoin(engine_presets, ", "), "; got '", name, "'"));
    }
  }
  return roofline::AnalysisPreset(name);
}

absl::StatusOr<roofline::HardwareProfile> ResolveHardware(const PriceSheetOptions& o, Backend* backend) {
  if (!o.measure || !o.hardware.empty()) return roofline::LoadHardware(o.hardware.empty() ? "gb200-nvl72" : o.hardware);
  std::fprintf(stderr, "price-sheet: no --hardware given; calibrating this machine first (quick)\n");
  calibrate::CalibrateSettings cs;
  cs.threads = o.threads;
  cs.quick = true;
  ASSIGN_OR_RETURN(calibrate::Calibration c, calibrate::Calibrate(backend, cs));
  return c.profile;
}

absl::Status WriteOutputs(const PriceSheetOptions& o, const nlohmann::json& j, const std::string& csv) {
  if (!o.json.empty()) RETURN_IF_ERROR(WriteFileAtomically(o.json, j.dump(2) + "\n"));
  if (!o.csv.empty()) RETURN_IF_ERROR(WriteFileAtomically(o.csv, csv));
  return absl::OkStatus();
}

// The weights' dtype the sheet prices (--dtype, else the checkpoint's), and the KV's, checked.
absl::StatusOr<std::string> SheetDtype(const PriceSheetOptions& o, const ModelConfig& config) {
  std::string dtype = !o.dtype.empty()         ? o.dtype
                      : config.fp8_checkpoint ? "fp8"
                                              : std::string(DTypeShortName(config.torch_dtype));
  if (dtype == "f16") dtype = "bf16";
  if (dtype != "bf16" && dtype != "f32" && dtype != "fp8") return absl::InvalidArgumentError("--dtype: bf16, f32 or fp8");
  if (o.kv_dtype != "bf16" && o.kv_dtype != "f32") return absl::InvalidArgumentError("--kv-dtype: bf16 or f32");
  return dtype;
}

// The machine's prices, the model's bytes, the request mix and the grid the sheet is drawn on.
absl::StatusOr<roofline::PriceInputs> MakePriceInputs(const PriceSheetOptions& o, const ModelConfig& config,
                                                      const roofline::HardwareProfile& hw,
                                                      const roofline::ModelCosts& costs, int64_t ep) {
  roofline::PriceInputs in;
  ASSIGN_OR_RETURN(in.grid, MakeGrid(o, config.max_position_embeddings));
  in.machine.devices = ep;
  in.machine.usd_per_device_hour =
      o.price_per_hour >= 0 ? o.price_per_hour : (hw.price_per_hour > 0 ? hw.price_per_hour : kLocalCpuUsdPerHour);
  in.machine.device_memory_bytes = hw.mem_capacity;
  in.machine.usd_per_gb_hour_device = o.gb_hour_device;
  in.machine.usd_per_gb_hour_ddr = o.gb_hour_ddr;
  in.machine.usd_per_gb_hour_flash = o.gb_hour_flash;
  in.machine.host_link_bytes_per_s = hw.host_link_bandwidth;
  in.machine.flash_read_bytes_per_s = hw.disk_read_bandwidth;
  // Each EP rank holds its own copy of the weights that are not routed experts.
  in.model.weight_bytes =
      costs.TotalWeightBytes() + costs.replicated_params * costs.weight_bytes_per_param * static_cast<double>(ep - 1);
  in.model.kv_bytes_per_token = costs.kv_bytes_per_token;
  in.model.max_context = config.max_position_embeddings;
  in.mix = o.mix;
  in.mix.tpot_seconds = o.tpot_ms / 1e3;
  in.mix.ttft_seconds = o.ttft_ms / 1e3;
  RETURN_IF_ERROR(in.Validate());
  return in;
}

// The sheet's inputs as JSON, and the two lines that say what is priced.
nlohmann::json DescribeInputs(const PriceSheetOptions& o, const roofline::PriceInputs& in,
                              const roofline::ModelCosts& costs, const roofline::HardwareProfile& hw,
                              const std::string& dtype) {
  nlohmann::json j;
  j["model"] = {{"total_params", costs.total_params}, {"active_params", costs.active_params}, {"weight_dtype", dtype},
                {"weight_bytes", in.model.weight_bytes}, {"kv_bytes_per_token", costs.kv_bytes_per_token},
                {"max_context", in.model.max_context}};
  j["hardware"] = nlohmann::json::parse(hw.ToJson());
  j["prices"] = {{"usd_per_device_hour", in.machine.usd_per_device_hour}, {"devices", in.machine.devices},
                 {"usd_per_gb_hour_device", in.machine.DeviceTierUsdPerGbHour()},
                 {"usd_per_gb_hour_ddr", in.machine.usd_per_gb_hour_ddr},
                 {"usd_per_gb_hour_flash", in.machine.usd_per_gb_hour_flash}};
  j["mix"] = {{"prompt_tokens", in.mix.prompt_tokens}, {"output_tokens", in.mix.output_tokens},
              {"cache_hit_rate", in.mix.cache_hit_rate}, {"tpot_s", in.mix.tpot_seconds},
              {"ttft_s", in.mix.ttft_seconds}};
  std::printf("price sheet: %.3g total / %.3g active parameters (%s), %.3g KB of KV per token; %s x %lld at $%.3f "
              "per device-hour (%s)\n",
              costs.total_params, costs.active_params, dtype.c_str(), costs.kv_bytes_per_token / 1e3, hw.name.c_str(),
              static_cast<long long>(in.machine.devices), in.machine.usd_per_device_hour, hw.source.c_str());
  std::printf("mix: %lld prompt + %lld output tokens, %.0f%% cache hits; TPOT %.1f ms, TTFT %.0f ms\n",
              static_cast<long long>(in.mix.prompt_tokens), static_cast<long long>(in.mix.output_tokens),
              in.mix.cache_hit_rate * 100, o.tpot_ms, o.ttft_ms);
  return j;
}

// --measure: the sheet again from step times measured on this machine, set beside the
// prediction, then the fast lane. The files are written after the sheet and again after the
// fast lane, so that a failure there keeps what was measured.
absl::Status MeasureSheet(const PriceSheetOptions& o, Backend* backend, const roofline::HardwareProfile& hw,
                          const roofline::PriceInputs& in, const roofline::PredictedStepTimes& predicted_times,
                          const roofline::PriceSheet& predicted, const std::string& dtype, nlohmann::json* j,
                          std::string* csv) {
  ModelSpec spec;
  spec.model_dir = o.model_dir;
  if (!o.preset.empty()) spec.preset = o.preset;
  spec.dtype = dtype == "f32" ? DType::kF32 : DType::kBF16;  // what the prediction priced
  std::fprintf(stderr, "loading %s on %s ...\n", DescribeModelSpec(spec).c_str(), backend->Name().c_str());
  ASSIGN_OR_RETURN(auto weights, LoadModel(spec, backend));
  PriceMeasureOptions mo;
  mo.kv_dtype = o.kv_dtype == "f32" ? DType::kF32 : DType::kBF16;
  mo.repeats = o.repeats;
  mo.tier_prompt_tokens = o.tier_prompt >= 0 ? o.tier_prompt : in.mix.prompt_tokens;
  ASSIGN_OR_RETURN(auto m, MeasurePriceTimes(*weights, backend, hw, in, &predicted_times, mo));
  roofline::PriceInputs measured_in = in;
  if (m.host_link_bytes_per_s > 0) measured_in.machine.host_link_bytes_per_s = m.host_link_bytes_per_s;
  if (m.flash_read_bytes_per_s > 0) measured_in.machine.flash_read_bytes_per_s = m.flash_read_bytes_per_s;
  const roofline::PriceSheet measured = roofline::ComputePriceSheet(measured_in, m.times);
  PrintPriceSheet(measured, measured_in, absl::StrCat("measured on ", backend->Name()));
  (*j)["measured"] = PriceSheetToJson(measured, measured_in);
  (*j)["measured"]["backend"] = backend->Name();
  (*j)["measured"]["tier_scenario"] = m.tier_scenario;
  (*j)["comparison"] = ComparePriceSheets(predicted, measured);
  PrintComparison((*j)["comparison"]);
  *csv += PriceCurvesCsv(measured, "measured");
  RETURN_IF_ERROR(WriteOutputs(o, *j, *csv));
  const int64_t lane_output = o.fast_lane_output >= 0 ? o.fast_lane_output : std::min<int64_t>(in.mix.output_tokens, 64);
  if (lane_output < 2) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto lane, MeasureFastLane(*weights, backend, measured.output.batch, in.mix.prompt_tokens,
                                              lane_output, in.machine.usd_per_device_hour, mo));
  PrintFastLane(lane, measured);
  (*j)["measured"]["fast_lane"] = lane;
  return absl::OkStatus();
}

int RunPriceSheet(PriceSheetOptions o) {
  auto config = ResolveConfig(o);
  if (!config.ok()) return Fail(config.status());
  std::unique_ptr<Backend> backend;
  if (o.measure) {
    EngineFlags ef;
    ef.threads = o.threads;
    ef.cpu_kernel = o.cpu_kernel;
    auto b = MakeBackend(ef);
    if (!b.ok()) return Fail(b.status());
    backend = std::move(*b);
  }
  auto hw = ResolveHardware(o, backend.get());
  if (!hw.ok()) return Fail(hw.status());
  auto dtype = SheetDtype(o, *config);
  if (!dtype.ok()) return Fail(dtype.status());
  const roofline::ModelCosts costs = roofline::ModelCosts::From(*config, *dtype, o.kv_dtype);
  roofline::ParallelLayout layout;
  layout.ep = o.measure ? 1 : (o.ep > 0 ? o.ep : hw->devices);
  auto in = MakePriceInputs(o, *config, *hw, costs, layout.ep);
  if (!in.ok()) return Fail(in.status());
  in->latency_floor_seconds = roofline::BatchOneWeightSeconds(costs, *hw, layout);
  const roofline::PredictedStepTimes predicted_times(costs, *hw, layout);
  const roofline::PriceSheet predicted = roofline::ComputePriceSheet(*in, predicted_times);
  nlohmann::json j = DescribeInputs(o, *in, costs, *hw, *dtype);
  PrintPriceSheet(predicted, *in, "predicted (roofline at the profile's peaks)");
  j["predicted"] = PriceSheetToJson(predicted, *in);
  std::string csv = "source,curve,x,batch,step_s,usd_per_million_or_price_multiple,memory_limited_or_speed_multiple\n" +
                    PriceCurvesCsv(predicted, "predicted");
  if (o.measure) {
    if (absl::Status s = MeasureSheet(o, backend.get(), *hw, *in, predicted_times, predicted, *dtype, &j, &csv);
        !s.ok()) {
      return Fail(s);
    }
  }
  if (absl::Status s = WriteOutputs(o, j, csv); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace

void AddPriceSheetCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<PriceSheetOptions>();
  CLI::App* cmd = app.add_subcommand(
      "price-sheet",
      "A provider's prices from physics: $/M input, output and cached tokens per memory tier, price against "
      "context and fast mode, predicted by the roofline and (--measure) measured on this machine");
  cmd->add_option("--model", o->model_dir, "Checkpoint directory whose config.json to price (and run, with --measure)");
  cmd->add_option("--preset", o->preset,
                  "Model preset: " + absl::StrJoin(roofline::AnalysisPresetNames(), ", ") +
                      " (default: deepseek-v3-like; with --measure an engine preset, default small)");
  cmd->add_option("--config", o->config, "A Hugging Face style config.json to price (not with --measure)");
  cmd->add_option("--hardware", o->hardware,
                  "Hardware preset (" + absl::StrJoin(roofline::HardwarePresetNames(), ", ") +
                      ") or a `moeserve calibrate` profile (default: gb200-nvl72; with --measure a quick calibration "
                      "of this machine)");
  cmd->add_option("--dtype", o->dtype,
                  "Weight dtype: bf16, f32 or fp8 (a byte per weight plus block scales; default: fp8 for a config with an fp8 quantization_config, else its torch_dtype)");
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache dtype: bf16 or f32")->capture_default_str();
  cmd->add_option("--ep", o->ep, "Devices the experts are spread over (default: the profile's devices)");
  cmd->add_option("--price-per-hour", o->price_per_hour,
                  "$ per device-hour (default: the profile's; for a profile without one, $0.15, a 2-vCPU cloud VM)");
  cmd->add_option("--usd-per-gb-hour-device", o->gb_hour_device,
                  "$ per GB-hour of device memory (default: the device's price over its memory)");
  cmd->add_option("--usd-per-gb-hour-ddr", o->gb_hour_ddr, "$ per GB-hour of host DDR")->capture_default_str();
  cmd->add_option("--usd-per-gb-hour-flash", o->gb_hour_flash, "$ per GB-hour of flash")->capture_default_str();
  cmd->add_option("--prompt-tokens", o->mix.prompt_tokens, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-tokens", o->mix.output_tokens, "Output tokens per request")->capture_default_str();
  cmd->add_option("--cache-hit-rate", o->mix.cache_hit_rate, "Fraction of prompt tokens that hit a cache")
      ->capture_default_str();
  cmd->add_option("--tpot-ms", o->tpot_ms, "Time per output token target: the decode step must meet it")
      ->capture_default_str();
  cmd->add_option("--ttft-ms", o->ttft_ms, "Time to first token target: the prefill must meet it")
      ->capture_default_str();
  cmd->add_option("--retention-device-s", o->mix.retention_device_s, "Seconds a hit stays in device memory")
      ->capture_default_str();
  cmd->add_option("--retention-ddr-s", o->mix.retention_ddr_s, "Seconds a hit stays in host DDR")
      ->capture_default_str();
  cmd->add_option("--retention-flash-s", o->mix.retention_flash_s, "Seconds a hit stays on flash")
      ->capture_default_str();
  cmd->add_option("--batches", o->batches,
                  "Decode batch candidates, comma-separated (default: powers of 2 to 2^20; to 256 with --measure)");
  cmd->add_option("--contexts", o->contexts,
                  "Contexts of the price curve (default: powers of 2 from 256 to the model's; to 8192 with "
                  "--measure); the mix's prompt + output/2 is always added");
  cmd->add_option("--prefill-tokens", o->prefill_tokens,
                  "Prefill tokens-per-step candidates (default: powers of 2, 256 to 262144; 64 to 4096 with "
                  "--measure); a step larger than a prompt carries several prompts");
  cmd->add_flag("--measure", o->measure,
                "Also run the model on this machine (decode sweep, prefill, one prompt through each KV tier) and "
                "price what was measured, beside the prediction with each figure's error");
  cmd->add_option("--measure-repeats", o->repeats, "Timed runs per measured point (median)")->capture_default_str();
  cmd->add_option("--tier-prompt", o->tier_prompt,
                  "Prompt tokens of the KV tier scenario with --measure (default: --prompt-tokens; 0: skip it)");
  cmd->add_option("--fast-lane-output", o->fast_lane_output,
                  "Output tokens of the fast-lane run with --measure: the operating batch of bulk requests, alone "
                  "and beside one fast-lane request (default: --output-tokens up to 64; below 2: skip it)");
  cmd->add_option("--threads", o->threads, "CPU threads with --measure (0: one per CPU this process may run on)")->capture_default_str();
  AddCpuKernelFlags(cmd, &o->cpu_kernel);
  cmd->add_option("--json", o->json, "Write both sheets, the comparison and the reading as JSON");
  cmd->add_option("--csv", o->csv, "Write the context and fast-mode curves as CSV");
  cmd->callback([o, exit_code] {
    if (o->repeats < 1) {
      *exit_code = Fail(absl::InvalidArgumentError("--measure-repeats must be >= 1"));
      return;
    }
    *exit_code = RunPriceSheet(*o);
  });
}

}  // namespace moeserve::tools
