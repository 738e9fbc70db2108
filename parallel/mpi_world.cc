// MpiWorld.
#include "parallel/mpi_world.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/status.h"
#include "parallel/mpi_communicator.h"
#if MOESERVE_HAVE_CUDA
#include "parallel/nccl_communicator.h"
#endif

namespace moeserve {
namespace {

constexpr int kMessageTag = 7;
constexpr int kHeartbeatTag = 8;
constexpr int kHostChars = 64;

// A group of process ranks: this process holds one of its communicators (MPI or NCCL).
class SingleRankGroup final : public CommGroup {
 public:
  explicit SingleRankGroup(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int size() const override { return comm_->size(); }
  Communicator* rank(int r) override { return r == comm_->rank() ? comm_.get() : nullptr; }
  absl::Status Reset() override {
    return absl::UnavailableError(
        "a failed step among process ranks cannot be retried: the job must restart");
  }

 private:
  std::unique_ptr<Communicator> comm_;
};

absl::Status MpiError(int err, const char* what) {
  if (err == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  return absl::UnavailableError(
      absl::StrCat(what, " failed: ", std::string(text, static_cast<size_t>(len))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiWorld>> MpiWorld::Init() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized)
    return absl::FailedPreconditionError("MPI is already initialised in this process");
  int provided = 0;
  RETURN_IF_ERROR(MpiError(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                           "MPI_Init_thread"));
  std::unique_ptr<MpiWorld> w(new MpiWorld());
  w->thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &w->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &w->size_);
  RETURN_IF_ERROR(MpiError(MPI_Comm_dup(MPI_COMM_WORLD, &w->control_), "MPI_Comm_dup"));
  RETURN_IF_ERROR(MpiError(MPI_Comm_dup(MPI_COMM_WORLD, &w->heartbeat_), "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(w->control_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(w->heartbeat_, MPI_ERRORS_RETURN);
  // Who is who, for messages that name a rank and for the pid checks of local ranks.
  const int pid = static_cast<int>(getpid());
  w->pids_.resize(static_cast<size_t>(w->size_));
  RETURN_IF_ERROR(
      MpiError(MPI_Allgather(&pid, 1, MPI_INT, w->pids_.data(), 1, MPI_INT, MPI_COMM_WORLD),
               "MPI_Allgather"));
  // The host name and the pid namespace together say whether a peer's pid can be looked up in
  // this /proc (containers on one host may share a name but not their pids).
  struct stat ns = {};
  const int64_t pid_ns = stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<int64_t>(ns.st_ino) : -1;
  w->pid_namespaces_.resize(static_cast<size_t>(w->size_));
  RETURN_IF_ERROR(MpiError(MPI_Allgather(&pid_ns, 1, MPI_INT64_T, w->pid_namespaces_.data(), 1, MPI_INT64_T,
                                         MPI_COMM_WORLD),
                           "MPI_Allgather"));
  char host[kHostChars] = {};
  gethostname(host, kHostChars - 1);
  std::vector<char> hosts(static_cast<size_t>(w->size_ * kHostChars));
  RETURN_IF_ERROR(MpiError(
      MPI_Allgather(host, kHostChars, MPI_CHAR, hosts.data(), kHostChars, MPI_CHAR, MPI_COMM_WORLD),
      "MPI_Allgather"));
  for (int r = 0; r < w->size_; ++r) w->hosts_.emplace_back(hosts.data() + r * kHostChars);
  return w;
}

MpiWorld::~MpiWorld() {
  StopMonitor();
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  if (heartbeat_ != MPI_COMM_NULL) MPI_Comm_free(&heartbeat_);
  MPI_Finalize();
}

void MpiWorld::Abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

std::string MpiWorld::DescribeRank(int rank) const {
  if (rank < 0 || rank >= size_) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (pid ", pids_[rank], " on ", hosts_[rank], ")");
}

absl::StatusOr<std::unique_ptr<CommGroup>> MpiWorld::Split(int color, int key) {
  MPI_Comm split;
  RETURN_IF_ERROR(MpiError(MPI_Comm_split(MPI_COMM_WORLD, color, key, &split), "MPI_Comm_split"));
  auto comm = MpiCommunicator::Create(split);
  MPI_Comm_free(&split);
  if (!comm.ok()) return comm.status();
  (*comm)->SetAbortSignal(&signal_);
  return std::unique_ptr<CommGroup>(new SingleRankGroup(*std::move(comm)));
}

absl::StatusOr<std::unique_ptr<CommGroup>> MpiWorld::SplitNccl(int color, int key, int device) {
#if MOESERVE_HAVE_CUDA
  MPI_Comm split;
  RETURN_IF_ERROR(MpiError(MPI_Comm_split(MPI_COMM_WORLD, color, key, &split), "MPI_Comm_split"));
  int rank = 0, size = 1;
  MPI_Comm_rank(split, &rank);
  MPI_Comm_size(split, &size);
  // The id is 128 bytes (NCCL_UNIQUE_ID_BYTES); the group's first rank makes it.
  std::string id(128, '\0');
  absl::Status made = absl::OkStatus();
  if (rank == 0) {
    absl::StatusOr<std::string> fresh = NcclCommunicator::NewUniqueId();
    if (fresh.ok() && fresh->size() == id.size()) {
      id = *fresh;
    } else {
      made =
          fresh.ok() ? absl::InternalError("NCCL unique id of an unexpected size") : fresh.status();
    }
  }
  // Broadcast even on failure, so that no member is left waiting; then all refuse.
  int ok = made.ok() ? 1 : 0;
  const absl::Status sent = MpiError(MPI_Bcast(&ok, 1, MPI_INT, 0, split), "MPI_Bcast");
  const absl::Status sent_id =
      MpiError(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, split), "MPI_Bcast");
  MPI_Comm_free(&split);
  RETURN_IF_ERROR(sent);
  RETURN_IF_ERROR(sent_id);
  if (!ok)
    return made.ok() ? absl::UnavailableError("the group's first rank could not make an NCCL id")
                     : made;
  std::shared_ptr<std::atomic<bool>> flag;
  {
    std::lock_guard<std::mutex> lock(flags_mu_);  // against Lose, which raises then takes it
    flag = std::make_shared<std::atomic<bool>>(signal_.raised());
    nccl_abort_flags_.push_back(flag);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                   NcclCommunicator::Create(id, rank, size, device, flag));
  return std::unique_ptr<CommGroup>(new SingleRankGroup(std::move(comm)));
#else
  (void)color;
  (void)key;
  return absl::UnimplementedError(
      absl::StrCat("NCCL ranks need a build with CUDA; asked for GPU ", device));
#endif
}

void MpiWorld::Lose(const std::string& message) {
  signal_.Raise(message);
  std::lock_guard<std::mutex> lock(flags_mu_);
  for (auto& flag : nccl_abort_flags_) flag->store(true);
}

absl::StatusOr<std::vector<double>> MpiWorld::AllGather(double value) {
  std::vector<double> all(static_cast<size_t>(size_));
  MPI_Request req;
  RETURN_IF_ERROR(
      MpiError(MPI_Iallgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, control_, &req),
               "MPI_Iallgather"));
  RETURN_IF_ERROR(WaitForMpi(&req, MPI_STATUS_IGNORE, &signal_, "MPI_Iallgather"));
  return all;
}

absl::StatusOr<std::vector<std::string>> MpiWorld::AllGatherBytes(const std::string& bytes) {
  ASSIGN_OR_RETURN(std::vector<double> sizes, AllGather(static_cast<double>(bytes.size())));
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<int>(sizes[r]);
    displs[r] = static_cast<int>(total);
    total += counts[r];
    if (total > INT_MAX) return absl::InvalidArgumentError("all-gather of more than 2 GiB");
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Request req;
  RETURN_IF_ERROR(
      MpiError(MPI_Iallgatherv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, all.data(),
                               counts.data(), displs.data(), MPI_BYTE, control_, &req),
               "MPI_Iallgatherv"));
  RETURN_IF_ERROR(WaitForMpi(&req, MPI_STATUS_IGNORE, &signal_, "MPI_Iallgatherv"));
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r)
    out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(counts[r])));
  return out;
}

absl::Status MpiWorld::SendMessage(int peer, const std::string& bytes) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step message of ", bytes.size(), " bytes is beyond MPI's 2 GiB"));
  }
  MPI_Request req;
  RETURN_IF_ERROR(MpiError(MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer,
                                     kMessageTag, control_, &req),
                           "MPI_Isend"));
  return WaitForMpi(&req, MPI_STATUS_IGNORE, &signal_, "sending a step message");
}

absl::StatusOr<std::string> MpiWorld::ReceiveMessage(int peer) {
  // Probe first (polling, so that the abort signal is seen), then receive the size it reports.
  for (int64_t spins = 0;; ++spins) {
    int found = 0;
    MPI_Status st;
    RETURN_IF_ERROR(MpiError(MPI_Iprobe(peer, kMessageTag, control_, &found, &st), "MPI_Iprobe"));
    if (found) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::string bytes(static_cast<size_t>(count), '\0');
      RETURN_IF_ERROR(MpiError(
          MPI_Recv(bytes.data(), count, MPI_BYTE, peer, kMessageTag, control_, MPI_STATUS_IGNORE),
          "MPI_Recv"));
      return bytes;
    }
    if (signal_.raised()) {
      return absl::UnavailableError(
          absl::StrCat("waiting for ", DescribeRank(peer), " gave up: ", signal_.message()));
    }
    if (spins > 200000) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (spins > 2000) {
      std::this_thread::yield();
    }
  }
}

void MpiWorld::StepBegins() {
  waiting_for_.store(-1);
  step_start_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

void MpiWorld::StartMonitor(double heartbeat_seconds, double timeout_seconds,
                            double step_timeout_seconds) {
  if (monitor_.joinable() || size_ == 1) return;
  heartbeat_seconds_ = heartbeat_seconds;
  timeout_seconds_ = timeout_seconds;
  step_timeout_seconds_ = step_timeout_seconds;
  stop_monitor_ = false;
  monitor_ = std::thread([this] { rank_ == 0 ? Watch() : Beat(); });
}

void MpiWorld::ShutdownRequested() {
  const double tight = 3 * heartbeat_seconds_;
  if (tight < timeout_seconds_.load()) timeout_seconds_.store(tight);
}

void MpiWorld::StopMonitor() {
  stop_monitor_ = true;
  if (monitor_.joinable()) monitor_.join();
}

void MpiWorld::Beat() {
  if (!thread_multiple_) return;  // MPI from a second thread needs MPI_THREAD_MULTIPLE
  int64_t count = 0;
  while (!stop_monitor_) {
    MPI_Request req;
    int64_t beat = failed_.load() ? -1 : ++count;  // -1: this rank failed its step
    if (MPI_Isend(&beat, 1, MPI_INT64_T, 0, kHeartbeatTag, heartbeat_, &req) != MPI_SUCCESS) return;
    // Rank 0 receives every beat; a dead rank 0 ends the job through mpirun anyway.
    if (!WaitForMpi(&req, MPI_STATUS_IGNORE, nullptr, "heartbeat").ok()) return;
    for (double waited = 0; waited < heartbeat_seconds_ && !stop_monitor_ && (beat < 0 || !failed_.load());
         waited += 0.01) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

bool MpiWorld::LocalRankDead(int rank) const {
  // Another host, or another pid namespace (a container): only its heartbeats tell.
  if (hosts_[rank] != hosts_[rank_] || pid_namespaces_[rank] != pid_namespaces_[rank_] || pid_namespaces_[rank] < 0) {
    return false;
  }
  // Gone, or a zombie that mpirun has not reaped yet ("pid (name) Z ...").
  std::ifstream stat(absl::StrCat("/proc/", pids_[rank], "/stat"));
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

void MpiWorld::Watch() {
  std::vector<Clock::time_point> last(static_cast<size_t>(size_), Clock::now());
  int64_t beat = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  auto post = [&] {
    if (thread_multiple_)
      MPI_Irecv(&beat, 1, MPI_INT64_T, MPI_ANY_SOURCE, kHeartbeatTag, heartbeat_, &req);
  };
  post();
  while (!stop_monitor_ && !signal_.raised()) {
    for (int got = 1; got && req != MPI_REQUEST_NULL;) {  // every beat that has arrived
      MPI_Status st;
      got = 0;
      if (MPI_Test(&req, &got, &st) != MPI_SUCCESS) break;
      if (got) {
        last[static_cast<size_t>(st.MPI_SOURCE)] = Clock::now();
        const int64_t value = beat;
        post();
        if (value < 0) {  // the worker's own step failed; its log and reply have the error
          Lose(absl::StrCat(DescribeRank(st.MPI_SOURCE), " failed its part of a step (its log has the error)"));
        }
      }
    }
    for (int r = 1; r < size_; ++r) {
      if (LocalRankDead(r)) {
        Lose(absl::StrCat(DescribeRank(r), " died"));
        break;
      }
      const double silent =
          std::chrono::duration<double>(Clock::now() - last[static_cast<size_t>(r)]).count();
      if (thread_multiple_ && silent > timeout_seconds_.load()) {
        Lose(absl::StrCat(DescribeRank(r), " sent no heartbeat for ", absl::StrFormat("%.1f", silent),
                          " s"));
        break;
      }
    }
    // A rank that still beats but does not finish its step (stuck in a computation).
    const int64_t started = step_start_ns_.load();
    if (step_timeout_seconds_ > 0 && started != 0) {
      const double ran =
          1e-9 * static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         Clock::now().time_since_epoch())
                                         .count() -
                                     started);
      if (ran > step_timeout_seconds_) {
        const int peer = waiting_for_.load();
        Lose(absl::StrCat("a step has run for ", static_cast<int>(ran), " s (the step timeout is ",
                          step_timeout_seconds_, " s); rank 0 was ",
                          peer > 0
                              ? absl::StrCat("waiting for the reply of ", DescribeRank(peer))
                              : std::string("in its own part of the step, waiting for its peers")));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (req != MPI_REQUEST_NULL) {
    MPI_Cancel(&req);
    MPI_Request_free(&req);
  }
}

}  // namespace moeserve
