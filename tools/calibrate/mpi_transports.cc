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
#if MOESERVE_HAVE_MPI
#include "parallel/mpi_world.h"
#endif

namespace moeserve::calibrate {
namespace {

// From a message small enough that its bytes cost nothing (the call latency, measured rather
// than fitted: a shaped link passes small messages in a burst, faster than its rate) through one
// decode token's hidden state (4 KiB of fp32 at hidden 1024) to a prefill chunk's.
constexpr int64_t kProbeBytes[] = {64, 4096, 65536, int64_t{1} << 20, int64_t{8} << 20};

}  // namespace

double BestBandwidth(const nlohmann::json& probe) {
  double bw = 0;
  if (!probe.contains("sizes")) return 0;
  for (const auto& s : probe["sizes"]) bw = std::max(bw, s["bus_bytes_per_second"].get<double>());
  return bw;
}

double CallLatency(const nlohmann::json& probe) {
  const double bw = BestBandwidth(probe);
  if (bw <= 0 || !probe.contains("ranks")) return 0;
  const auto& smallest = *std::min_element(probe["sizes"].begin(), probe["sizes"].end(), [](const auto& a, const auto& b) {
    return a["bytes_per_peer"].template get<double>() < b["bytes_per_peer"].template get<double>();
  });
  const double bytes = smallest["bytes_per_peer"].get<double>() * (probe["ranks"].get<double>() - 1);
  return std::max(0.0, smallest["median_us"].get<double>() * 1e-6 - bytes / bw);
}

absl::StatusOr<nlohmann::json> MeasureThreadTransport(bool quick) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(2);
  nlohmann::json sizes = nlohmann::json::array();
  for (int64_t bytes : kProbeBytes) {
    absl::StatusOr<AllToAllTiming> timing[2];
    std::thread peer([&] { timing[1] = TimeAllToAll(group->rank(1), bytes, quick ? 5 : 40, quick ? 2 : 5); });
    timing[0] = TimeAllToAll(group->rank(0), bytes, quick ? 5 : 40, quick ? 2 : 5);
    peer.join();
    for (const auto& t : timing) RETURN_IF_ERROR(t.status());
    sizes.push_back({{"bytes_per_peer", timing[0]->bytes_per_peer},
                     {"median_us", timing[0]->median_us},
                     {"p90_us", timing[0]->p90_us},
                     {"bus_bytes_per_second", timing[0]->bus_bytes_per_second}});
  }
  return nlohmann::json{{"ranks", 2}, {"sizes", sizes}};
}

#if MOESERVE_HAVE_MPI

absl::StatusOr<nlohmann::json> ProbeAllToAllUnderMpi(bool quick) {
  ASSIGN_OR_RETURN(std::unique_ptr<MpiWorld> world, MpiWorld::Init());
  ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> group, world->Split(0, world->rank()));
  Communicator* comm = group->rank(world->rank());
  nlohmann::json sizes = nlohmann::json::array();
  for (int64_t bytes : kProbeBytes) {
    ASSIGN_OR_RETURN(AllToAllTiming t, TimeAllToAll(comm, bytes, quick ? 5 : 40, quick ? 2 : 5));
    sizes.push_back({{"bytes_per_peer", t.bytes_per_peer},
                     {"median_us", t.median_us},
                     {"p90_us", t.p90_us},
                     {"bus_bytes_per_second", t.bus_bytes_per_second}});
  }
  // Each rank's host name (the launch agent of docs/multi-host.md sets a namespace's), so the
  // profile says which hosts the scale-out figures were measured between.
  char name[64] = {};
  gethostname(name, sizeof(name) - 1);
  std::vector<char> names(sizeof(name) * static_cast<size_t>(world->size()));
  RETURN_IF_ERROR(comm->AllGather(name, sizeof(name), names.data()));
  if (world->rank() != 0) return nlohmann::json::object();
  nlohmann::json hosts = nlohmann::json::array();
  for (int r = 0; r < world->size(); ++r) hosts.push_back(std::string(names.data() + r * sizeof(name)));
  return nlohmann::json{{"ranks", world->size()}, {"hosts", hosts}, {"sizes", sizes}};
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
