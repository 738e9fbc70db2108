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
#include "roofline/layout_search.h"
#include "tools/explore_measure.h"
#include "tools/commands.h"

namespace moeserve::tools {
namespace {

using Json = nlohmann::json;

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

// The layout with the most tokens/s among those that fit, for each sequences count.
std::vector<std::pair<int64_t, const roofline::LayoutCandidate*>> Best(const std::vector<roofline::LayoutCandidate>& all,
                                                                       const std::vector<int64_t>& sequences) {
  std::vector<std::pair<int64_t, const roofline::LayoutCandidate*>> best;
  for (int64_t n : sequences) {
    const roofline::LayoutCandidate* pick = nullptr;
    double rate = 0;
    for (const auto& c : all) {
      for (const auto& p : c.points) {
        if (p.sequences == n && p.fits && p.tokens_per_second > rate) rate = p.tokens_per_second, pick = &c;
      }
    }
    best.emplace_back(n, pick);
  }
  return best;
}

Json MeasuredJson(const std::vector<MeasuredPoint>& measured) {
  Json out = Json::array();
  for (const MeasuredPoint& p : measured) {
    out.push_back({{"ep", p.ep}, {"pp", p.pp}, {"domain_size", p.domain_size}, {"sequences", p.sequences},
                   {"ranks_as", p.processes ? "processes" : "threads"},
                   {"predicted_step_seconds", p.predicted_step_seconds}, {"measured_step_seconds", p.measured_step_seconds},
                   {"predicted_tokens_per_second", p.predicted_tokens_per_second},
                   {"measured_tokens_per_second", p.measured_tokens_per_second}, {"error", p.error},
                   {"predicted_comm_us_per_token", p.predicted_comm_us_per_token},
                   {"measured_comm_us_per_token", p.measured_comm_us_per_token},
                   {"measured_comm_min_us_per_token", p.measured_comm_min_us_per_token},
                   {"measured_comm_after_last_us_per_token", p.measured_comm_after_last_us_per_token}});
    if (!p.core_sharing.empty()) out.back()["core_sharing"] = p.core_sharing;
    if (p.Oversubscribed()) out.back()["oversubscribed_cpus"] = p.cpus;
  }
  return out;
}

// Predicted beside measured, each layout as it ran here (its ranks threads sharing the machine).
void PrintMeasured(const std::vector<MeasuredPoint>& measured, const roofline::HardwareProfile& hw) {
  std::printf("measured on this machine (%s), each rank (a thread, or a process) with its share of the cores and the memory bandwidth:\n",
              hw.name.c_str());
  std::printf("(error: the measured decode step's time over the predicted one, less 1; comm: time in collectives and\n"
              " stage hand-offs per token: the slowest rank's, waiting for the others included, and the least-waiting\n"
              " rank's; after last: the expert-parallel exchanges from the last rank's arrival to their end, summed,\n"
              " which no waiting enters: what the price of the all-to-all stands for)\n");
  std::printf("%4s %4s %6s %9s %9s | %14s %14s %8s | %16s %16s %16s %12s\n", "ep", "pp", "domain", "ranks as", "sequences",
              "predicted tok/s", "measured tok/s", "error", "comm us/tok pred", "comm us/tok meas", "least-waiting",
              "after last");
  for (const MeasuredPoint& p : measured) {
    std::printf("%4lld %4lld %6lld %9s %9lld | %14.1f %14.1f %+7.0f%% | %16.1f %16.1f %16.1f %12.1f\n",
                static_cast<long long>(p.ep), static_cast<long long>(p.pp), static_cast<long long>(p.domain_size),
                p.processes ? "processes" : "threads",
                static_cast<long long>(p.sequences), p.predicted_tokens_per_second, p.measured_tokens_per_second,
                100 * p.error, p.predicted_comm_us_per_token, p.measured_comm_us_per_token,
                p.measured_comm_min_us_per_token, p.measured_comm_after_last_us_per_token);
  }
  std::vector<std::string> shared;  // the layouts with more ranks than CPUs, once each
  int64_t cpus = 0;
  for (const MeasuredPoint& p : measured) {
    const std::string name = absl::StrCat("ep ", p.ep, " pp ", p.pp);
    if (!p.Oversubscribed() || std::find(shared.begin(), shared.end(), name) != shared.end()) continue;
    shared.push_back(name);
    cpus = p.cpus;
  }
  if (shared.empty()) return;
  std::printf("note: %s ran more ranks than this machine's %lld CPUs, so the ranks time-share them: a rank waiting\n"
              " in an exchange yields its CPU to another's compute, and its 'after last' time overlaps that work rather\n"
              " than pricing the all-to-all; read their steps' error (docs/parallelism.md, \"ep 4, two ranks per\n"
              " namespace\")\n",
              absl::StrJoin(shared, ", ").c_str(), static_cast<long long>(cpus));
}

Json ToJson(const ExploreOptions& o, const roofline::LayoutSearch& s, const std::vector<roofline::LayoutCandidate>& all,
            const std::vector<std::pair<int64_t, const roofline::LayoutCandidate*>>& best) {
  Json j = {{"hardware", s.hw.name}, {"devices", s.devices}, {"context", s.context},
            {"weight_dtype", s.model.weight_dtype}, {"total_params", s.model.total_params},
            {"active_params", s.model.active_params}, {"layouts", Json::array()}, {"best", Json::array()}};
  for (const auto& c : all) {
    Json l = {{"ep", c.layout.ep}, {"pp", c.layout.pp}, {"domain_size", c.layout.domain_size},
              {"devices", c.layout.devices()}, {"weight_bytes_per_device", c.weight_bytes_per_device},
              {"weights_fit", c.weights_fit}, {"max_sequences", c.max_micro_batch * c.layout.pp}, {"points", Json::array()}};
    for (const auto& p : c.points) {
      l["points"].push_back({{"sequences", p.sequences}, {"micro_batch", p.micro_batch}, {"fits", p.fits},
                             {"kv_bytes_per_device", p.kv_bytes_per_device}, {"tokens_per_second", p.tokens_per_second},
                             {"token_seconds", p.token_seconds}, {"usd_per_million_tokens", p.usd_per_million_tokens},
                             {"compute_seconds", p.cost.compute_seconds}, {"memory_seconds", p.cost.memory_seconds},
                             {"comm_seconds", p.cost.comm_seconds},
                             {"expert_rank_imbalance", p.cost.expert_rank_imbalance},
                             {"expert_rows_imbalance", p.cost.expert_rows_imbalance},
                             {"experts_hit", p.cost.experts_hit},
                             {"engine_step_seconds", p.engine_step_seconds},
                             {"engine_tokens_per_second", p.engine_tokens_per_second}});
    }
    j["layouts"].push_back(l);
  }
  for (const auto& [n, c] : best) {
    j["best"].push_back(c == nullptr ? Json{{"sequences", n}, {"ep", nullptr}, {"pp", nullptr}}
                                     : Json{{"sequences", n}, {"ep", c->layout.ep}, {"pp", c->layout.pp},
                                            {"domain_size", c->layout.domain_size}});
  }
  return j;
}

void WriteCsv(const std::string& path, const std::vector<roofline::LayoutCandidate>& all) {
  std::ofstream f(path);
  f << "ep,pp,domain_size,devices,weight_bytes_per_device,sequences,fits,kv_bytes_per_device,tokens_per_second,"
       "token_seconds,usd_per_million_tokens,engine_tokens_per_second,expert_rank_imbalance,expert_rows_imbalance,"
       "experts_hit\n";
  for (const auto& c : all) {
    for (const auto& p : c.points) {
      f << c.layout.ep << "," << c.layout.pp << "," << c.layout.domain_size << "," << c.layout.devices() << ","
        << c.weight_bytes_per_device << "," << p.sequences << "," << (p.fits ? 1 : 0) << "," << p.kv_bytes_per_device
        << "," << p.tokens_per_second << "," << p.token_seconds << "," << p.usd_per_million_tokens << ","
        << p.engine_tokens_per_second << "," << p.cost.expert_rank_imbalance << "," << p.cost.expert_rows_imbalance
        << "," << p.cost.experts_hit << "\n";
    }
  }
}

// One row per measured point, predicted beside measured (the columns of MeasuredJson).
absl::Status WriteMeasuredCsv(const std::string& path, const std::vector<MeasuredPoint>& measured) {
  std::ofstream f(path);
  f << "ep,pp,domain_size,sequences,ranks_as,predicted_step_seconds,measured_step_seconds,predicted_tokens_per_second,"
       "measured_tokens_per_second,error,predicted_comm_us_per_token,measured_comm_us_per_token,"
       "measured_comm_min_us_per_token,measured_comm_after_last_us_per_token,oversubscribed_cpus\n";
  for (const MeasuredPoint& p : measured) {
    f << p.ep << "," << p.pp << "," << p.domain_size << "," << p.sequences << "," << (p.processes ? "processes" : "threads") << ","
      << p.predicted_step_seconds << "," << p.measured_step_seconds << "," << p.predicted_tokens_per_second << ","
      << p.measured_tokens_per_second << "," << p.error << "," << p.predicted_comm_us_per_token << ","
      << p.measured_comm_us_per_token << "," << p.measured_comm_min_us_per_token << ","
      << p.measured_comm_after_last_us_per_token << "," << (p.Oversubscribed() ? p.cpus : 0) << "\n";
  }
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("--measure-csv: cannot write \"", path, "\""));
  return absl::OkStatus();
}

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
  ExpertPlacement placement = ExpertPlacement::kContiguous;
  if (o.expert_placement == "round-robin") {
    placement = ExpertPlacement::kRoundRobin;
  } else if (o.expert_placement == "balanced") {
    placement = ExpertPlacement::kBalanced;
  } else if (o.expert_placement != "contiguous") {
    return absl::InvalidArgumentError(absl::StrCat("--expert-placement must be contiguous, round-robin or balanced, got '",
                                                   o.expert_placement, "'"));
  }
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
  for (int64_t ep = 1; ep <= std::min(s->devices, s->experts); ++ep) {
    if (s->experts % ep != 0) continue;
    const ExpertHolderTable holders = ExpertHolders(load.layers, load.experts, ep, placement, &load, ep > 1 ? copies * ep : 0);
    s->routing[ep] = roofline::RecordedRouting::FromCounts(load.tokens, load.experts, config.num_experts_per_tok, ep, holders);
  }
  return absl::OkStatus();
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
  auto sequences = ParseIntList("--sequences", o.sequences);
  if (!sequences.ok()) return Fail(sequences.status());
  roofline::LayoutSearch s;
  s.model = roofline::ModelCosts::From(*config, *dtype, o.kv_dtype);
  s.hw = *hw;
  s.devices = o.devices > 0 ? o.devices : hw->devices;
  if (s.devices > 4096) return Fail(absl::InvalidArgumentError("--devices must be in [1, 4096]"));
  s.experts = config->num_local_experts;
  s.layers = config->num_hidden_layers;
  s.context = o.context;
  s.sequences = *sequences;
  s.price_per_hour = o.price_per_hour >= 0 ? o.price_per_hour : hw->price_per_hour;
  if (!o.domain_sizes.empty()) {
    auto domains = ParseIntList("--domain-sizes", o.domain_sizes);
    if (!domains.ok()) return Fail(domains.status());
    for (int64_t d : *domains) {
      if (d < 0 || d > 4096) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("--domain-sizes: each size must be in [0, 4096] (0: every device in one domain), got ", d)));
      }
    }
    s.domain_sizes = *domains;
  }
  if (absl::Status r = SetRouting(o, *config, &s); !r.ok()) return Fail(r);
  const std::vector<roofline::LayoutCandidate> all = roofline::ExploreLayouts(s);
  const auto best = Best(all, s.sequences);
  std::printf("explore: %.3g B parameters (%.3g B active, %s) on up to %lld x %s, context %lld\n",
              s.model.total_params / 1e9, s.model.active_params / 1e9, dtype->c_str(),
              static_cast<long long>(s.devices), hw->name.c_str(), static_cast<long long>(s.context));
  std::printf("(tokens/s: a pipeline that never drains; moeserve tok/s: as moeserve's engine runs it, draining its\n"
              " pp micro-batches each step; imb: the busiest EP rank's expert weights over the mean, rows: its expert\n"
              " rows; %s)\n",
              o.expert_load.empty() ? "uniform routing"
                                    : absl::StrCat("the routing of ", o.expert_load, ", ", o.expert_placement, " placement",
                                                   o.expert_replicas_per_rank > 0
                                                       ? absl::StrCat(", ", o.expert_replicas_per_rank, " extra copies per rank")
                                                       : "")
                                          .c_str());
  std::printf("%4s %4s %6s %7s %12s %9s | %9s %5s %12s %12s %14s %5s %5s %10s %9s\n", "ep", "pp", "domain", "devices",
              "weights GB/dev", "max seqs", "sequences", "fits", "KV GB/dev", "tokens/s", "moeserve tok/s", "imb",
              "rows", "ms/token", "$/Mtok");
  for (const auto& c : all) {
    for (const auto& p : c.points) {
      bool is_best = false;
      for (const auto& [n, b] : best) is_best |= n == p.sequences && b == &c;
      std::printf("%4lld %4lld %6lld %7lld %12.2f %9lld | %9lld %5s %12.2f %12.1f %14.1f %5.2f %5.2f %10.3f %9.3f%s\n",
                  static_cast<long long>(c.layout.ep), static_cast<long long>(c.layout.pp),
                  static_cast<long long>(c.layout.domain_size), static_cast<long long>(c.layout.devices()),
                  c.weight_bytes_per_device / 1e9, static_cast<long long>(c.max_micro_batch * c.layout.pp),
                  static_cast<long long>(p.sequences), p.fits ? "yes" : "no", p.kv_bytes_per_device / 1e9,
                  p.tokens_per_second, p.engine_tokens_per_second, p.cost.expert_rank_imbalance,
                  p.cost.expert_rows_imbalance, p.token_seconds * 1e3,
                  p.usd_per_million_tokens, is_best ? "  <- best" : "");
    }
  }
  for (const auto& [n, b] : best) {
    if (b == nullptr) std::printf("  %lld sequences: no layout fits\n", static_cast<long long>(n));
  }
  Json j = ToJson(o, s, all, best);
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
                  "MoE layer (serve's --expert-replicas = this x ep), placed from the load as serve places them; "
                  "their weights count against each device's memory")
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
