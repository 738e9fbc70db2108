// Communicator over MPI (Open MPI from Debian), for ranks that are processes: on one machine
// through Open MPI's shared-memory transport, across machines through TCP or InfiniBand, as
// `mpirun` chooses (`--mca btl ...`). Buffers are host memory. Every collective returns a
// Status (the communicator's error handler is MPI_ERRORS_RETURN): UNAVAILABLE naming the MPI
// error when the transport fails, INVALID_ARGUMENT on every rank when the all-to-all counts of
// the ranks disagree (checked by a small exchange first, so no rank is left waiting).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace moeserve {

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over a duplicate of `comm` (MPI must be initialised, with
  // MPI_THREAD_SERIALIZED or more if several threads use it one at a time).
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts) override;
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

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  absl::Status Check(int err, const char* what) const;
  absl::Status CheckPeer(int peer) const;
  // MPI_Alltoall of one count per peer (its bytes go into the statistics, not its call).
  absl::Status ExchangeCounts(const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts);
  // Completes the background sends that have finished (all of them when `wait`).
  absl::Status ReapSends(bool wait);

  struct PendingSend {
    MPI_Request request;
    std::vector<char> data;
  };
  MPI_Comm comm_;
  int rank_, size_;
  bool aborted_ = false;
  std::vector<std::unique_ptr<PendingSend>> sends_;
  CommStats stats_;
};

}  // namespace moeserve
