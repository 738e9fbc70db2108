// `moeserve explore`'s output (see explore_output.h).
#include "tools/explore_output.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moeserve::tools {

// The layout with the most tokens/s among those that fit, for each sequences count.
BestLayouts Best(const std::vector<roofline::LayoutCandidate>& all, const std::vector<int64_t>& sequences) {
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

Json ToJson(const roofline::LayoutSearch& s, const std::vector<roofline::LayoutCandidate>& all,
            const BestLayouts& best) {
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
                             {"comm_seconds", p.cost.comm_seconds}, {"comm_bytes", p.cost.comm_bytes},
                             {"scale_out_bytes", p.cost.scale_out_bytes},
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
       "experts_hit,comm_seconds,comm_bytes,scale_out_bytes\n";
  for (const auto& c : all) {
    for (const auto& p : c.points) {
      f << c.layout.ep << "," << c.layout.pp << "," << c.layout.domain_size << "," << c.layout.devices() << ","
        << c.weight_bytes_per_device << "," << p.sequences << "," << (p.fits ? 1 : 0) << "," << p.kv_bytes_per_device
        << "," << p.tokens_per_second << "," << p.token_seconds << "," << p.usd_per_million_tokens << ","
        << p.engine_tokens_per_second << "," << p.cost.expert_rank_imbalance << "," << p.cost.expert_rows_imbalance
        << "," << p.cost.experts_hit << "," << p.cost.comm_seconds << "," << p.cost.comm_bytes << ","
        << p.cost.scale_out_bytes << "\n";
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

void PrintLayouts(const roofline::LayoutSearch& s, const std::vector<roofline::LayoutCandidate>& all,
                  const BestLayouts& best, const std::string& dtype, const std::string& routing) {
  std::printf("explore: %.3g B parameters (%.3g B active, %s) on up to %lld x %s, context %lld\n",
              s.model.total_params / 1e9, s.model.active_params / 1e9, dtype.c_str(),
              static_cast<long long>(s.devices), s.hw.name.c_str(), static_cast<long long>(s.context));
  std::printf("(tokens/s: a pipeline that never drains; moeserve tok/s: as moeserve's engine runs it, draining its\n"
              " pp micro-batches each step; imb: the busiest EP rank's expert weights over the mean, rows: its expert\n"
              " rows; %s)\n",
              routing.c_str());
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
}

}  // namespace moeserve::tools
