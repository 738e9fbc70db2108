// All-to-all bandwidth per MPI transport.
#include "tools/calibrate/mpi_transports.h"

#include <algorithm>
#include <cstdio>

#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "tools/mpirun_self.h"
#include "parallel/alltoall_probe.h"
#include "parallel/comm_group.h"
#include "runner/rank_cores.h"
#include "tools/calibrate/measure.h"
#include "runner/rank_step.h"
#if MOESERVE_HAVE_MPI
#include "parallel/mpi_world.h"
#endif

namespace moeserve::calibrate {
namespace {

// From a message small enough that its bytes cost nothing (the call latency, measured rather
// than fitted: a shaped link passes small messages in a burst, faster than its rate) through one
// decode token's hidden state (4 KiB of fp32 at hidden 1024) to a prefill chunk's.
constexpr int64_t kProbeBytes[] = {0, 64, 4096, 65536, int64_t{1} << 20, int64_t{8} << 20};
// The decode-sized ones again after a sweep of memory, as an engine's exchanges follow its
// compute: sweeps of a quarter, one and four times the last-level cache.
constexpr int64_t kSweptBytes[] = {64, 4096, 65536};
constexpr double kSweepsOfLlc[] = {0.25, 1, 4};

nlohmann::json ToJson(const AllToAllTiming& t) {
  return {{"bytes_per_peer", t.bytes_per_peer},
          {"median_us", t.median_us},
          {"p90_us", t.p90_us},
          {"bus_bytes_per_second", t.bus_bytes_per_second}};
}

// The probe's JSON: every size idle ("sizes"), and with `one_clock` (the ranks' steady clocks are
// one machine's, which the timing after a sweep compares) the decode-sized ones after each
// sweep ("after_sweep": [{"sweep_bytes", "sizes"}]). `time(bytes, sweep_bytes)` times one size
// on every rank of the group.
template <typename Time>
absl::StatusOr<nlohmann::json> ProbeSizes(bool one_clock, Time&& time) {
  nlohmann::json idle = nlohmann::json::array(), swept = nlohmann::json::array();
  for (int64_t bytes : kProbeBytes) {
    ASSIGN_OR_RETURN(const AllToAllTiming t, time(bytes, 0));
    idle.push_back(ToJson(t));
  }
  if (!one_clock) return nlohmann::json{{"sizes", idle}};
  const double measured = LastLevelCacheBytes();  // measure.h's; 32 MiB where the system does not say
  const double llc = measured > 0 ? measured : static_cast<double>(int64_t{32} << 20);
  for (double f : kSweepsOfLlc) {
    const int64_t sweep = static_cast<int64_t>(f * llc);
    nlohmann::json sizes = nlohmann::json::array();
    for (int64_t bytes : kSweptBytes) {
      ASSIGN_OR_RETURN(const AllToAllTiming t, time(bytes, sweep));
      sizes.push_back(ToJson(t));
    }
    swept.push_back({{"sweep_bytes", sweep}, {"sizes", sizes}});
  }
  return nlohmann::json{{"sizes", idle}, {"after_sweep", swept}};
}

}  // namespace

double BestBandwidth(const nlohmann::json& probe) {
  double bw = 0;
  if (!probe.contains("sizes")) return 0;
  for (const auto& s : probe["sizes"]) bw = std::max(bw, s["bus_bytes_per_second"].get<double>());
  return bw;
}

namespace {

// The smallest message of `sizes` that moves bytes (an empty exchange may cost nothing:
// EmptyExchangeFree); null where there is none.
const nlohmann::json* SmallestMoving(const nlohmann::json& sizes) {
  const nlohmann::json* smallest = nullptr;
  for (const auto& s : sizes) {
    const double b = s["bytes_per_peer"].get<double>();
    if (b > 0 && (smallest == nullptr || b < (*smallest)["bytes_per_peer"].get<double>())) smallest = &s;
  }
  return smallest;
}

// That message's latency, less its bytes at `bw`.
double SmallestCallLatency(const nlohmann::json& sizes, double ranks, double bw) {
  const nlohmann::json* smallest = SmallestMoving(sizes);
  if (smallest == nullptr) return 0;
  const double bytes = (*smallest)["bytes_per_peer"].get<double>() * (ranks - 1);
  return std::max(0.0, (*smallest)["median_us"].get<double>() * 1e-6 - bytes / bw);
}

}  // namespace

double CallLatency(const nlohmann::json& probe) {
  const double bw = BestBandwidth(probe);
  if (bw <= 0 || !probe.contains("ranks")) return 0;
  return SmallestCallLatency(probe["sizes"], probe["ranks"].get<double>(), bw);
}

nlohmann::json AfterSweepLatencies(const nlohmann::json& probe) {
  nlohmann::json out = nlohmann::json::array();
  const double bw = BestBandwidth(probe);
  if (bw <= 0 || !probe.contains("ranks") || !probe.contains("after_sweep")) return out;
  for (const auto& a : probe["after_sweep"]) {  // ascending sweep sizes, as the probe ran them
    out.push_back({{"sweep_bytes", a["sweep_bytes"].get<double>()},
                   {"latency_s", SmallestCallLatency(a["sizes"], probe["ranks"].get<double>(), bw)}});
  }
  return out;
}

bool EmptyExchangeFree(const nlohmann::json& probe) {
  const nlohmann::json sizes = probe.value("sizes", nlohmann::json::array());
  double empty_us = -1;
  for (const auto& s : sizes) {
    if (s["bytes_per_peer"].get<double>() == 0) empty_us = s["median_us"].get<double>();
  }
  const nlohmann::json* smallest = SmallestMoving(sizes);
  const double smallest_us = smallest != nullptr ? (*smallest)["median_us"].get<double>() : 0;
  return empty_us >= 0 && smallest_us > 0 && empty_us < 0.5 * smallest_us;
}

absl::StatusOr<nlohmann::json> MeasureThreadTransport(bool quick) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(2);
  ASSIGN_OR_RETURN(nlohmann::json probe, ProbeSizes(true, [&](int64_t bytes, int64_t sweep) -> absl::StatusOr<AllToAllTiming> {
    absl::StatusOr<AllToAllTiming> timing[2];
    std::thread peer([&] { timing[1] = TimeAllToAll(group->rank(1), bytes, quick ? 5 : 40, quick ? 2 : 5, sweep); });
    timing[0] = TimeAllToAll(group->rank(0), bytes, quick ? 5 : 40, quick ? 2 : 5, sweep);
    peer.join();
    RETURN_IF_ERROR(timing[1].status());
    return timing[0];
  }));
  probe["ranks"] = 2;
  return probe;
}

#if MOESERVE_HAVE_MPI

absl::StatusOr<nlohmann::json> ProbeAllToAllUnderMpi(bool quick) {
  ASSIGN_OR_RETURN(std::unique_ptr<MpiWorld> world, MpiWorld::Init());
  ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> group, world->Split(0, world->rank()));
  Communicator* comm = group->rank(world->rank());
  const uint64_t clock = MachineClockId();
  std::vector<uint64_t> clocks(static_cast<size_t>(world->size()));
  RETURN_IF_ERROR(comm->AllGather(&clock, sizeof(clock), clocks.data()));
  const bool one_clock = clock != 0 && std::all_of(clocks.begin(), clocks.end(), [&](uint64_t c) { return c == clock; });
  // Ranks time-sharing a core would make every figure a scheduler's: said in the profile.
  ASSIGN_OR_RETURN(const std::string sharing, CheckRankCores(world.get()));
  ASSIGN_OR_RETURN(nlohmann::json probe, ProbeSizes(one_clock, [&](int64_t bytes, int64_t sweep) {
    return TimeAllToAll(comm, bytes, quick ? 5 : 40, quick ? 2 : 5, sweep);
  }));
  // Each rank's host name (the launch agent of docs/multi-host.md sets a namespace's), so the
  // profile says which hosts the scale-out figures were measured between.
  char name[64] = {};
  gethostname(name, sizeof(name) - 1);
  std::vector<char> names(sizeof(name) * static_cast<size_t>(world->size()));
  RETURN_IF_ERROR(comm->AllGather(name, sizeof(name), names.data()));
  if (world->rank() != 0) return nlohmann::json::object();
  nlohmann::json hosts = nlohmann::json::array();
  for (int r = 0; r < world->size(); ++r) hosts.push_back(std::string(names.data() + r * sizeof(name)));
  probe["ranks"] = world->size();
  probe["hosts"] = hosts;
  if (!sharing.empty()) probe["core_sharing"] = sharing;
  return probe;
}

absl::StatusOr<nlohmann::json> MeasureMpiTransports(bool quick, const std::string& scale_out_mpirun_args) {
  nlohmann::json out;
  const std::string tcp = scale_out_mpirun_args.empty() ? "--mca btl self,tcp" : scale_out_mpirun_args;
  for (auto [name, args] :
       {std::pair<const char*, std::string>{"shared_memory", "--mca btl self,vader"}, {"tcp", tcp}}) {
    ASSIGN_OR_RETURN(const tools::MpirunOutput run,
                     tools::RunSelfUnderMpirun(2, args, quick ? "calibrate --quick" : "calibrate"));
    const std::string& text = run.output;
    const int rc = run.status;
    // Rank 0 printed its JSON object on a line of its own; mpirun may add lines around it.
    nlohmann::json probe;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!absl::StartsWith(line, "{")) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("ranks")) probe = std::move(j);
    }
    if (rc != 0 || !probe.is_object()) {
      return absl::UnavailableError(
          absl::StrCat("calibrate: the transport probe with mpirun ", args, " failed (status ", rc, "): ", text));
    }
    if (probe.contains("core_sharing")) {
      std::fprintf(stderr, "calibrate: %s: warning: %s\n", name, probe["core_sharing"].get<std::string>().c_str());
    }
    out[name] = probe;
  }
  return out;
}

#else

absl::StatusOr<nlohmann::json> ProbeAllToAllUnderMpi(bool) {
  return absl::UnimplementedError("started by mpirun, but this moeserve was built without MPI");
}
absl::StatusOr<nlohmann::json> MeasureMpiTransports(bool, const std::string&) {
  return absl::UnimplementedError("this moeserve was built without MPI");
}

#endif

}  // namespace moeserve::calibrate
