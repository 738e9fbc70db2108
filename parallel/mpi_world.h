// The MPI job this process belongs to when mpirun started it: initialisation, the ranks' pids and
// hosts, groups for the data plane (MpiCommunicator), the channel for step messages, and the
// monitor that notices a lost rank. Owned by the command that runs the job (no global state).
//
// Faults: rank 0 expects a heartbeat from every worker every `heartbeat_seconds` (sent by a
// thread of the worker, on a communicator of their own) and checks the pids of the workers on
// its own host (same host name and pid namespace). A worker that dies (its pid is gone or a
// zombie), stops beating for `timeout_seconds` (a stopped process, a lost host), reports that
// its step failed, or a step that outlasts the step timeout, raises the abort signal with a
// message naming it; every MPI wait of rank 0 then returns UNAVAILABLE instead of hanging.
// Heartbeats need MPI_THREAD_MULTIPLE (Open MPI provides it); without it only the pid checks
// and the step timeout watch the ranks.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/process_ranks.h"

namespace moeserve {

class MpiWorld final : public ProcessRanks {
 public:
  // MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the heartbeats run beside the engine
  // thread); without it, only the pid checks watch the ranks.
  static absl::StatusOr<std::unique_ptr<MpiWorld>> Init();
  ~MpiWorld() override;  // stops the monitor and finalises MPI
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::StatusOr<std::unique_ptr<CommGroup>> Split(int color, int key) override;
  absl::StatusOr<std::unique_ptr<CommGroup>> SplitNccl(int color, int key, int device) override;
  absl::StatusOr<std::vector<double>> AllGather(double value) override;
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) override;
  absl::Status SendMessage(int peer, const std::string& bytes) override;
  absl::StatusOr<std::string> ReceiveMessage(int peer) override;
  AbortSignal* abort_signal() override { return &signal_; }
  std::string DescribeRank(int rank) const override;
  // Each rank's host name (gethostname; a network namespace's under netns-hosts.sh's agent).
  const std::vector<std::string>& hosts() const { return hosts_; }

  void StepBegins() override;
  void WaitingFor(int rank) override { waiting_for_.store(rank); }
  void StepEnds() override { step_start_ns_.store(0); }

  // Starts the heartbeats (workers) or their watch (rank 0). Idempotent. A step longer than
  // `step_timeout_seconds` (0: no limit) is lost as well.
  void StartMonitor(double heartbeat_seconds, double timeout_seconds,
                    double step_timeout_seconds = 0);
  void StopMonitor();
  // A worker whose own step failed: its next heartbeat (sent at once) tells rank 0, which
  // fails its engine and ends the job.
  void ReportFailure() { failed_.store(true); }
  // Rank 0 was told to stop (SIGTERM/SIGINT). mpirun sends it when it tears the job down after
  // a rank died, and kills the survivors soon after (1 s by default), well within the rank
  // timeout; so from now on a worker silent for three heartbeats is taken as lost, and rank 0
  // can still name it to its clients. A worker of a healthy job beats on through a drain.
  void ShutdownRequested();
  // Ends the whole job (MPI_Abort): mpirun stops every rank and exits with `code`.
  [[noreturn]] void Abort(int code);

 private:
  MpiWorld() = default;
  // Raises the abort signal and the NCCL groups' abort flags.
  void Lose(const std::string& message);
  void Beat();   // a worker's heartbeat thread
  void Watch();  // rank 0's monitor thread
  bool LocalRankDead(int rank) const;

  int rank_ = 0, size_ = 1;
  bool thread_multiple_ = false;
  MPI_Comm control_ = MPI_COMM_NULL;    // step messages
  MPI_Comm heartbeat_ = MPI_COMM_NULL;  // heartbeats only
  std::vector<int> pids_;
  std::vector<std::string> hosts_;
  std::vector<int64_t> pid_namespaces_;  // inode of /proc/self/ns/pid, -1 unknown
  AbortSignal signal_;
  std::mutex flags_mu_;
  std::vector<std::shared_ptr<std::atomic<bool>>> nccl_abort_flags_;  // one per NCCL group
  double heartbeat_seconds_ = 0.5, step_timeout_seconds_ = 0;
  std::atomic<double> timeout_seconds_{10};  // lowered by ShutdownRequested
  std::atomic<int64_t> step_start_ns_{0};  // steady clock; 0: no step in flight
  std::atomic<int> waiting_for_{-1};
  std::atomic<bool> stop_monitor_{false};
  std::atomic<bool> failed_{false};
  std::thread monitor_;
};

}  // namespace moeserve
