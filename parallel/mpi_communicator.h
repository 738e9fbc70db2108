// Communicator over MPI (Open MPI from Debian), for ranks that are processes: on one machine
// through Open MPI's shared-memory transport, across machines through TCP or InfiniBand, as
// `mpirun` chooses (`--mca btl ...`). Buffers are host memory. Every collective returns a
// Status (the communicator's error handler is MPI_ERRORS_RETURN): UNAVAILABLE naming the MPI
// error when the transport fails, INVALID_ARGUMENT on every rank when the all-to-all counts of
// the ranks disagree (with Counts::kChecked: a small exchange first, so no rank is left
// waiting).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/abort_signal.h"
#include "parallel/communicator.h"

namespace moeserve {

// Completes `request` by polling, so that a raised `signal` (may be null) ends the wait with
// UNAVAILABLE and its message; an MPI error is UNAVAILABLE too.
absl::Status WaitForMpi(MPI_Request* request, MPI_Status* status, const AbortSignal* signal,
                        const char* what);

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over a duplicate of `comm` (MPI must be initialised, with
  // MPI_THREAD_SERIALIZED or more if several threads use it one at a time).
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts, Counts counts) override;
  absl::Status AllToAllCounts(const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts) override;
  absl::Status AllGather(const void* send, int64_t bytes, void* recv) override;
  // Gathers every rank's data and sums in rank order, so every rank gets the same bits (an
  // MPI_Allreduce may associate differently on different ranks).
  absl::Status AllReduceSum(float* data, int64_t count) override;
  // Non-blocking: the data is copied and sent in the background; later calls complete it.
  absl::Status Send(const void* data, int64_t bytes, int peer) override;
  absl::Status Recv(void* data, int64_t bytes, int peer) override;
  absl::Status Barrier() override;
  // MPI cannot leave a group alone: aborting ends the whole job (MPI_Abort), which is what
  // lets an orchestrator restart it. Later local calls return ABORTED.
  void Abort() override;
  CommStats stats() const override { return stats_; }
  // Every wait (collectives, receives, completing sends) also watches `signal` and returns
  // UNAVAILABLE with its message once it is raised: a rank whose peer died stops waiting.
  void SetAbortSignal(const AbortSignal* signal) { signal_ = signal; }

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  absl::Status Check(int err, const char* what) const;
  // Completes `request`, polling so that the abort signal is seen.
  absl::Status Wait(MPI_Request* request, MPI_Status* status, const char* what);
  absl::Status CheckPeer(int peer) const;
  // AllToAll's kChecked: the counts exchanged and compared; every rank returns the same error.
  absl::Status CheckCounts(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts);
  // MPI_Alltoall of one count per peer. With `count_traffic` its bytes go into the statistics
  // (not its call); AllToAll's own check of the counts is left out, so that the statistics
  // report the traffic the model asked for, as the in-process communicator does.
  absl::Status ExchangeCounts(const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts, bool count_traffic);
  // Completes the background sends that have finished (all of them when `wait`).
  absl::Status ReapSends(bool wait);

  struct PendingSend {
    MPI_Request request;
    std::vector<char> data;
  };
  MPI_Comm comm_;
  int rank_, size_;
  bool aborted_ = false;
  const AbortSignal* signal_ = nullptr;
  std::vector<std::unique_ptr<PendingSend>> sends_;
  CommStats stats_;
};

}  // namespace moeserve
