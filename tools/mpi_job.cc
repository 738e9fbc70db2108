// MpiJob over Open MPI (parallel/mpi_world.h), when moeserve is built with MPI.
#include "tools/mpi_job.h"

#include "tools/launch.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#if MOESERVE_HAVE_MPI
#include "absl/strings/str_join.h"
#include "parallel/mpi_world.h"
#include "parallel/placement.h"
#include "roofline/cost_model.h"
#include "runner/rank_cores.h"
#endif

namespace moeserve::tools {
namespace {

// The expert load a balanced placement comes from and its replica count, as a number every rank
// can compare (52 bits of an FNV-1a hash of the counts, exact in a double); 0 without a load.
[[maybe_unused]] double PlacementDigest(const ParallelConfig& p) {
  if (p.expert_load == nullptr) return 0;
  uint64_t h = 1469598103934665603ull;
  std::vector<int64_t> values = p.expert_load->tokens;
  values.push_back(p.expert_replicas);
  for (int64_t v : values) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<uint64_t>(v) >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return static_cast<double>(h & ((1ull << 52) - 1));
}

// The heartbeat period and how long rank 0 waits for a silent worker (MOESERVE_RANK_TIMEOUT_S
// overrides the timeout: tests shorten it).
constexpr double kHeartbeatSeconds = 0.5;
constexpr double kRankTimeoutSeconds = 10;
// A step that runs longer than this ends the job even if every rank beats (a rank stuck in a
// computation); MOESERVE_STEP_TIMEOUT_S overrides it. A step is at most --max-tokens-per-step
// tokens: seconds on a CPU.
constexpr double kStepTimeoutSeconds = 300;

double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atof(v) > 0 ? std::atof(v) : fallback;
}

#if MOESERVE_HAVE_MPI
class OpenMpiJob final : public MpiJob {
 public:
  explicit OpenMpiJob(std::unique_ptr<MpiWorld> world) : world_(std::move(world)) {}
  ~OpenMpiJob() override { world_->StopMonitor(); }
  int rank() const override { return world_->rank(); }

  void Configure(const EngineFlags& f, EngineConfig* c) override {
    if (f.backend == "cuda") c->parallel.nccl_devices.assign(static_cast<size_t>(world_->size()), Gpu(f));
    DomainFromHosts(c);
  }

  ProcessRanks* processes() override { return world_.get(); }

  BackendFactory RankBackend(const EngineFlags& f) const override {
    // One device per process: all of --threads (the ranks may be on different machines; on
    // one, mpirun's binding decides), or its GPU, the ranks talking over NCCL bootstrapped over
    // MPI (MpiWorld::SplitNccl).
    return RankBackends(f, /*processes=*/true, Gpu(f));
  }

  void StartMonitor(std::function<void(const std::string&)> on_lost) override {
    world_->abort_signal()->OnRaise(std::move(on_lost));
    world_->StartMonitor(kHeartbeatSeconds,
                         EnvSeconds("MOESERVE_RANK_TIMEOUT_S", kRankTimeoutSeconds),
                         EnvSeconds("MOESERVE_STEP_TIMEOUT_S", kStepTimeoutSeconds));
  }

  int RunWorker(const EngineFlags& f, const ModelSpec& spec) override {
    // mpirun forwards SIGTERM/SIGINT to every rank; a worker keeps serving steps so that rank 0
    // can drain, and ends when rank 0 says so (or mpirun kills the job).
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    const std::string who = absl::StrCat("moeserve rank ", world_->rank(), ": ");
    auto fail = [&](const absl::Status& s) {
      std::fprintf(stderr, "%serror: %s\n", who.c_str(), std::string(s.message()).c_str());
      Abort(s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    };
    auto config = MakeEngineConfig(f);
    if (!config.ok()) fail(config.status());
    Configure(f, &*config);
    Stopwatch sw;
    // Only this rank's layers and experts are read from the checkpoint.
    auto loaded = LoadRank(f, spec, *config, this, who);
    if (!loaded.ok()) fail(loaded.status());
    ModelWeights* weights = loaded->weights.get();
    auto executor = MakeRanks(f, *config, weights, loaded->backend.get(), this, spec);
    if (!executor.ok()) fail(executor.status());
    ReleaseStagingCopy(*config, weights, who.c_str());
    const RankLayout& mine = (*executor)->layout()[static_cast<size_t>(world_->rank())];
    std::fprintf(stderr, "%sready in %.2f s: %s\n", who.c_str(), sw.Seconds(),
                 std::all_of(mine.experts.begin(), mine.experts.end(), [](const auto& e) { return e.empty(); })
                     ? "no experts"
                     : "serving steps");
    world_->StartMonitor(kHeartbeatSeconds, kRankTimeoutSeconds);
    absl::Status s = (*executor)->ServeSteps();
    if (!s.ok()) {
      // Tell rank 0 (its next heartbeat goes at once) so that it ends its requests with
      // UNAVAILABLE and the job; abort only if it does not within the grace period.
      std::fprintf(stderr, "%serror: %s\n", who.c_str(), std::string(s.message()).c_str());
      world_->ReportFailure();
      std::this_thread::sleep_for(std::chrono::seconds(30));
      Abort(1);
    }
    world_->StopMonitor();
    return 0;
  }

  absl::Status ShareDigests(ModelWeights* weights) override {
    return ShareWeightDigests(world_.get(), weights);
  }

  void StopMonitor() override {
    world_->abort_signal()->OnRaise(nullptr);
    world_->StopMonitor();
  }

  void ShutdownRequested() override { world_->ShutdownRequested(); }

  [[noreturn]] void Abort(int code) override { world_->Abort(code); }

 private:
  // --device plus this rank's index among the ranks of its host.
  static int Gpu(const EngineFlags& f) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    return f.device + (local != nullptr ? std::atoi(local) : 0);
  }

  // The scale-up domain is the ranks' hosts: --domain-size, when not given (0), is taken from
  // them; a given one they contradict is named. It sets the roofline's prices and where replicated
  // experts' copies go (never the answers: every placement computes the same bits).
  void DomainFromHosts(EngineConfig* c) const {
    const std::vector<std::string>& hosts = world_->hosts();
    const int64_t per_host = DomainSizeOfHosts(hosts);
    int64_t& d = c->parallel.domain_size;
    const int64_t ranks = static_cast<int64_t>(hosts.size());
    if (per_host == (d == ranks ? 0 : d)) return;
    std::vector<std::string> runs;  // "host: ranks a-b", in rank order
    for (size_t r = 0, begin = 0; r < hosts.size(); ++r) {
      if (r + 1 < hosts.size() && hosts[r + 1] == hosts[r]) continue;
      runs.push_back(absl::StrCat(hosts[r], ": ranks ", begin, "-", r));
      begin = r + 1;
    }
    std::string note;
    const roofline::ParallelLayout from_hosts{c->parallel.ep, c->parallel.pp, per_host};
    if (d == 0 && per_host > 0 && roofline::CheckDomainSize(from_hosts, "--domain-size").ok()) {
      d = per_host;
      note = absl::StrCat("one scale-up domain per host, ", d, " ranks each (", absl::StrJoin(runs, ", "),
                          "); --domain-size overrides it");
    } else if (d == 0 && per_host > 0) {
      note = absl::StrCat("warning: the ranks' hosts (", absl::StrJoin(runs, ", "), ") make domains of ", per_host,
                          " ranks, which ep ", c->parallel.ep, " x pp ", c->parallel.pp,
                          " cannot be priced with; the roofline prices one domain (--domain-size 0)");
    } else {
      note = absl::StrCat("warning: ", d == 0 ? "one scale-up domain (--domain-size 0)" : absl::StrCat("--domain-size ", d),
                          " does not match the ranks' hosts (", absl::StrJoin(runs, ", "),
                          "): the roofline prices exchanges and places replicated experts' copies by --domain-size, the "
                          "transport follows the hosts");
    }
    if (world_->rank() == 0) std::fprintf(stderr, "moeserve rank 0: %s\n", note.c_str());
  }

  std::unique_ptr<MpiWorld> world_;
};
#endif

}  // namespace

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

absl::StatusOr<std::unique_ptr<MpiJob>> MpiJob::Join(const EngineFlags& f, const ModelSpec& spec) {
  if (!LaunchedByMpirun()) return std::unique_ptr<MpiJob>();
#if MOESERVE_HAVE_MPI
  ASSIGN_OR_RETURN(std::unique_ptr<MpiWorld> world, MpiWorld::Init());
  // Checked by every rank on its own (same flags, same config), before any weights load.
  const std::string prefix = absl::StrCat("rank ", world->rank(), " of ", world->size(), ": ");
  absl::Status verdict = absl::OkStatus();
  auto config = LoadModelConfig(spec);
  ParallelConfig parallel = f.config.parallel;
  if (!config.ok()) {
    verdict = absl::InvalidArgumentError(absl::StrCat(prefix, config.status().message()));
  } else if (absl::Status s = ApplyPlacementFlags(f, &parallel); !s.ok()) {
    verdict = absl::InvalidArgumentError(absl::StrCat(prefix, s.message()));
  } else if (absl::Status s = parallel.Validate(*config, world->size()); !s.ok()) {
    verdict = absl::InvalidArgumentError(absl::StrCat(prefix, s.message()));
  }
  // Every rank learns whether all of them agreed (a config missing on one host only), so that
  // none goes on into a collective the others never join.
  ASSIGN_OR_RETURN(const std::vector<double> ok, world->AllGather(verdict.ok() ? 1.0 : 0.0));
  if (!verdict.ok()) return verdict;
  for (size_t r = 0; r < ok.size(); ++r) {
    if (ok[r] == 0)
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "rank ", r, " refused the job (its log says why)"));
  }
  // Each rank read its own --expert-load: the hosts' files must place the experts alike, or
  // the ranks would disagree on who computes what.
  ASSIGN_OR_RETURN(const std::vector<double> placements, world->AllGather(PlacementDigest(parallel)));
  for (size_t r = 0; r < placements.size(); ++r) {
    if (placements[r] != placements.front()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "rank ", r, " read an --expert-load that places the experts "
                                                     "differently from rank 0's: the hosts hold different files"));
    }
  }
  ASSIGN_OR_RETURN(const std::string sharing, CheckRankCores(world.get()));
  if (!sharing.empty() && world->rank() == 0) std::fprintf(stderr, "%swarning: %s\n", prefix.c_str(), sharing.c_str());
  return std::unique_ptr<MpiJob>(std::make_unique<OpenMpiJob>(std::move(world)));
#else
  (void)f;
  (void)spec;
  return absl::FailedPreconditionError(
      "started by mpirun, but this moeserve was built without MPI (install libopenmpi-dev and "
      "rebuild)");
#endif
}

}  // namespace moeserve::tools
