// `moeserve explore`: the layout explorer. Every way to place a model on N devices as
// expert-parallel ranks x pipeline stages, whether each fits (weights, and KV for the sequences
// in flight at the context, per device), and the roofline's tokens/s, time per output token and
// $ per million tokens for each, so an engineer can pick a strategy (roofline/layout_search.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "parallel/expert_load.h"
#include "parallel/placement.h"
#include "parallel/routed_traffic.h"
#include "roofline/layout_search.h"
#include "tools/explore_measure.h"
#include "tools/explore_output.h"
#include "tools/commands.h"

namespace moeserve::tools {
namespace {


struct ExploreOptions {
  std::string model_dir, preset, config;
  std::string hardware = "h100-sxm";
  std::string dtype, kv_dtype = "bf16";
  int64_t devices = 0;
  int64_t context = 4096;
  std::string sequences = "1,8,32,64,128,256,512,1024";
  std::string domain_sizes;  // empty: the profile's scale_up_domain
  std::string expert_load, expert_placement = "contiguous";
  int64_t expert_replicas_per_rank = 0;
  double price_per_hour = -1;
  std::string json, csv, measure_csv;
  bool measure = false;
  MeasureOptions m;
};

// --measure runs what this process can load and compares with this machine's profile.
absl::Status CheckMeasure(ExploreOptions* o) {
  if (!o->measure) {
    if (!o->measure_csv.empty()) return absl::InvalidArgumentError("--measure-csv needs --measure");
    return absl::OkStatus();
  }
  if (!o->config.empty()) return absl::InvalidArgumentError("--measure runs the model: name it with --model or --preset, not --config");
  if (!std::filesystem::exists(o->hardware)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--measure compares with this machine: --hardware must be its profile from `moeserve calibrate --out FILE`, got \"",
        o->hardware, "\""));
  }
  if (o->m.max_ranks < 1 || o->m.max_sequences < 1) {
    return absl::InvalidArgumentError("--measure-max-ranks and --measure-max-sequences must be >= 1");
  }
  if (!o->model_dir.empty()) {
    o->m.model.model_dir = o->model_dir;
  } else if (!o->preset.empty()) {
    o->m.model.preset = o->preset;
  }
  return FinishModelSpec("", "auto", &o->m.model);
}

// --expert-load: the recorded routing under --expert-placement, for every ep a layout may take.
absl::Status SetRouting(const ExploreOptions& o, const ModelConfig& config, roofline::LayoutSearch* s) {
  ASSIGN_OR_RETURN(const ExpertPlacement placement, ParseExpertPlacement(o.expert_placement));
  const int64_t copies = o.expert_replicas_per_rank;
  if (copies != 0 && (placement != ExpertPlacement::kBalanced || copies < 0 || 2 * copies > config.num_local_experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-replicas-per-rank must be in [0, ", config.num_local_experts / 2,
        "] (half the model's experts) and needs --expert-placement balanced, got ", copies));
  }
  if (o.expert_load.empty()) {
    if (o.expert_placement != "contiguous") {
      return absl::InvalidArgumentError("--expert-placement prices a recorded routing: it needs --expert-load FILE");
    }
    return absl::OkStatus();
  }
  s->expert_copies_per_rank = copies;
  ASSIGN_OR_RETURN(ExpertLoad load, ReadExpertLoad(o.expert_load));
  if (load.layers != config.num_hidden_layers || load.experts != config.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("--expert-load: recorded for ", load.layers, " layers x ", load.experts,
                                                   " experts, the model has ", config.num_hidden_layers, " x ",
                                                   config.num_local_experts));
  }
  // Each ep at one domain and at each domain size that cuts its EP group (ExploreLayouts' rule):
  // with copies, the placement spreads an expert's over the domains where they allow it.
  const std::vector<int64_t> domains = s->domain_sizes.empty() ? std::vector<int64_t>{s->hw.scale_up_domain} : s->domain_sizes;
  for (int64_t ep = 1; ep <= std::min(s->devices, s->experts); ++ep) {
    if (s->experts % ep != 0) continue;
    for (int64_t d : domains) {
      const int64_t ep_domain = roofline::RoutingDomain(ep, d);
      if (s->routing.count({ep, ep_domain}) > 0) continue;
      const int64_t replicas = ep > 1 ? copies * ep : 0;
      // More copies than one per domain: serve refuses the layout, so explore does not price it.
      if (replicas > MaxReplicas(load.experts, ep, ep_domain)) continue;
      const ExpertHolderTable holders = ExpertHolders(load.layers, load.experts, ep, placement, &load, replicas, ep_domain);
      const RoutedTraffic t = ExpectedTraffic(holders, &load, ep, ep_domain);
      s->routing[{ep, ep_domain}] = {
          roofline::RecordedRouting::FromCounts(load.tokens, load.experts, config.num_experts_per_tok, ep, holders),
          t.inside, t.outside};
    }
  }
  return absl::OkStatus();
}

// The search the flags ask for: the model's costs on the profile, the sequences counts, the
// domain sizes and the routing.
absl::StatusOr<roofline::LayoutSearch> MakeSearch(const ExploreOptions& o, const ModelConfig& config,
                                                  const roofline::HardwareProfile& hw, const std::string& dtype) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> sequences, ParseIntList("--sequences", o.sequences));
  roofline::LayoutSearch s;
  s.model = roofline::ModelCosts::From(config, dtype, o.kv_dtype);
  s.hw = hw;
  s.devices = o.devices > 0 ? o.devices : hw.devices;
  if (s.devices > 4096) return absl::InvalidArgumentError("--devices must be in [1, 4096]");
  s.experts = config.num_local_experts;
  s.layers = config.num_hidden_layers;
  s.context = o.context;
  s.sequences = sequences;
  s.price_per_hour = o.price_per_hour >= 0 ? o.price_per_hour : hw.price_per_hour;
  if (!o.domain_sizes.empty()) {
    ASSIGN_OR_RETURN(const std::vector<int64_t> domains, ParseIntList("--domain-sizes", o.domain_sizes));
    for (int64_t d : domains) {
      if (d < 0 || d > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("--domain-sizes: each size must be in [0, 4096] (0: every device in one domain), got ", d));
      }
    }
    s.domain_sizes = domains;
  }
  RETURN_IF_ERROR(SetRouting(o, config, &s));
  return s;
}

// What the imbalances come from, for the table's legend.
std::string RoutingName(const ExploreOptions& o) {
  if (o.expert_load.empty()) return "uniform routing";
  return absl::StrCat("the routing of ", o.expert_load, ", ", o.expert_placement, " placement",
                      o.expert_replicas_per_rank > 0
                          ? absl::StrCat(", ", o.expert_replicas_per_rank, " extra copies per rank")
                          : "");
}

int RunExplore(ExploreOptions o) {
  if (absl::Status c = CheckMeasure(&o); !c.ok()) return Fail(c);
  auto config = AnalysisConfig(o.model_dir, o.preset, o.config);
  if (!config.ok()) return Fail(config.status());
  auto hw = roofline::LoadHardware(o.hardware);
  if (!hw.ok()) return Fail(hw.status());
  auto dtype = AnalysisDtype(*config, o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  if (o.kv_dtype != "bf16" && o.kv_dtype != "f32") return Fail(absl::InvalidArgumentError("--kv-dtype: bf16 or f32"));
  if (o.context < 1) return Fail(absl::InvalidArgumentError("--context must be >= 1"));
  auto search = MakeSearch(o, *config, *hw, *dtype);
  if (!search.ok()) return Fail(search.status());
  const roofline::LayoutSearch& s = *search;
  const std::vector<roofline::LayoutCandidate> all = roofline::ExploreLayouts(s);
  const auto best = Best(all, s.sequences);
  PrintLayouts(s, all, best, *dtype, RoutingName(o));
  Json j = ToJson(s, all, best);
  if (o.measure) {
    MeasureOptions m = o.m;
    m.hw = *hw;
    m.hardware_path = o.hardware;
    m.context = o.context;
    m.kv_dtype = o.kv_dtype;
    auto measured = MeasureLayouts(m, all);
    if (!measured.ok()) return Fail(measured.status());
    PrintMeasured(*measured, *hw);
    j["measured"] = MeasuredJson(*measured);
    if (!o.measure_csv.empty()) {
      if (absl::Status st = WriteMeasuredCsv(o.measure_csv, *measured); !st.ok()) return Fail(st);
    }
  }
  if (!o.json.empty()) std::ofstream(o.json) << j.dump(1) << "\n";
  if (!o.csv.empty()) WriteCsv(o.csv, all);
  return 0;
}



}  // namespace

void AddExploreCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ExploreOptions>();
  CLI::App* cmd = app.add_subcommand(
      "explore", "Every expert-parallel x pipeline layout of a model on N devices: whether it fits, and the "
                 "roofline's tokens/s, time per token and cost for each; with --measure, those this machine can run, "
                 "measured beside their prediction");
  cmd->add_option("--model", o->model_dir, "Checkpoint directory whose config.json to place");
  cmd->add_option("--preset", o->preset, "A preset or a real model's shape (moeserve roofline --help lists them)");
  cmd->add_option("--config", o->config, "A Hugging Face style config.json to place");
  cmd->add_option("--hardware", o->hardware,
                  "Device profile: h100-sxm, h200, b200, gb200-nvl72, or a JSON profile from `moeserve calibrate`; its "
                  "scale-up domain size groups EP ranks into domains")
      ->capture_default_str();
  cmd->add_option("--devices", o->devices, "Most devices a layout may use (default: the profile's)");
  cmd->add_option("--domain-sizes", o->domain_sizes,
                  "Comma-separated scale-up domain sizes to price every layout at (default: the profile's): the "
                  "ranks fill domains of each size in order, and the all-to-all and hand-offs that leave a domain "
                  "cross the scale-out network; 0 puts every device in one domain");
  cmd->add_option("--expert-load", o->expert_load,
                  "Price each layout with this recorded routing (`moeserve bench|serve --expert-load-out FILE`) instead "
                  "of uniform routing: the experts a batch hits, and the busiest EP rank's expert weights and rows "
                  "over the mean, under --expert-placement");
  cmd->add_option("--expert-placement", o->expert_placement,
                  "With --expert-load: which EP rank holds each expert, as serve would place them: contiguous, "
                  "round-robin or balanced (from the same load)")
      ->capture_default_str();
  cmd->add_option("--expert-replicas-per-rank", o->expert_replicas_per_rank,
                  "With --expert-placement balanced: each EP rank holds this many extra copies of hot experts per "
                  "MoE layer (serve's --expert-replicas = this x ep), placed from the load as serve places them "
                  "(where a domain size cuts the EP group, an expert's copies in distinct domains and each sender "
                  "using its own domain's: fewer bytes across domains); their weights count against each device's memory")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weight dtype: bf16, f32 or fp8 (default: the checkpoint's)");
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache dtype: bf16 or f32")->capture_default_str();
  cmd->add_option("--context", o->context, "Tokens per sequence, for the KV that must fit and be read")
      ->capture_default_str();
  cmd->add_option("--sequences", o->sequences,
                  "Comma-separated counts of decoding sequences in flight (over all micro-batches) to predict at")
      ->capture_default_str();
  cmd->add_option("--price-per-hour", o->price_per_hour, "$ per device-hour (default: the profile's)");
  cmd->add_option("--json", o->json, "Write every layout and point, and the best layout per sequences count, as JSON");
  cmd->add_option("--csv", o->csv, "Write one row per layout and sequences count as CSV");
  cmd->add_flag("--measure", o->measure,
                "Also run each layout this machine can run (its ranks threads of this process) at each sequences "
                "count that fits, and print the decode speed measured beside the roofline's prediction for the layout "
                "as it runs here (each rank a share of the machine). Needs --model or --preset and --hardware from "
                "`moeserve calibrate`; every point prefills its sequences to --context first, so keep it small");
  cmd->add_flag("--measure-processes", o->m.processes,
                "With --measure: also run each layout of several ranks as an MPI job of that many processes on this "
                "machine (mpirun --oversubscribe; `moeserve bench` with the same workload), beside the threads; each "
                "process gets its share of --threads, as the prediction gives it its share of the machine");
  cmd->add_option("--measure-mpirun-args", o->m.mpirun_args,
                  "With --measure-processes: more arguments for mpirun, e.g. a hostfile and launch agent that put the "
                  "ranks on other hosts or in network namespaces (docs/multi-host.md); passed through a shell");
  cmd->add_option("--measure-csv", o->measure_csv,
                  "With --measure: write one row per measured point (predicted beside measured, as in the JSON's "
                  "'measured') as CSV");
  cmd->add_option("--calibration", o->m.calibration,
                  "With --measure: a `moeserve bench --sweep-batch ... --out` JSON of this machine whose fitted "
                  "efficiencies turn the measured layouts' predictions from the bound into calibrated ones");
  cmd->add_option("--measure-steps", o->m.steps, "Decode steps timed per measured point (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--measure-max-ranks", o->m.max_ranks, "Layouts of more ranks are not measured")->capture_default_str();
  cmd->add_option("--measure-max-sequences", o->m.max_sequences, "Points of more sequences are not measured")
      ->capture_default_str();
  cmd->add_option("--threads", o->m.threads, "CPU threads of the measuring process, split over a layout's ranks (0: one per CPU this process may run on)")
      ->capture_default_str();
  cmd->callback([o, exit_code] { *exit_code = RunExplore(*o); });
}

}  // namespace moeserve::tools
