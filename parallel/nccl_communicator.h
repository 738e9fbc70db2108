// The communicator of one GPU rank over NCCL (compiled only with CUDA). Buffers are device
// memory of the rank's GPU; every call is enqueued on the rank's stream and waited for, so a
// returned call is complete (Send therefore waits for the matching Recv, which a pipeline that
// only sends forward tolerates). All-to-all is a group of ncclSend/ncclRecv, one pair per peer
// with a non-zero count. Ranks are bootstrapped from a unique id created on one rank and handed
// to the others by any channel (a thread, a file, a TCP socket), so the same code spans nodes;
// CreateAll makes every rank of a single-process group at once.
//
// Aborting: a rank that fails calls Abort(), which raises the group's shared flag. The others
// wait for their NCCL work by polling the stream, and on seeing the flag abort their own
// communicator (ncclCommAbort, which stops kernels waiting for the failed rank) and return
// ABORTED instead of hanging. No NCCL or CUDA headers here.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace moeserve {

class NcclCommunicator final : public Communicator {
 public:
  // A fresh bootstrap id (ncclGetUniqueId), as bytes to hand to every rank.
  static absl::StatusOr<std::string> NewUniqueId();
  // Joins the group as `rank` of `size` on GPU `device` (blocks until every rank has joined).
  // `abort_flag` (optional) is shared by the group's ranks in this process, see Abort().
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const std::string& unique_id, int rank, int size, int device,
      std::shared_ptr<std::atomic<bool>> abort_flag = nullptr);
  // Every rank of a group within this process, rank r on GPU devices[r] (ncclCommInitAll), with
  // a shared abort flag.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateAll(const std::vector<int>& devices);
  // Rebuilds such a group in place after an abort (the objects, and pointers to them, stay
  // valid): destroys each rank's communicator and makes a fresh one on the same GPU. On failure
  // the ranks are left unusable (every call returns ABORTED).
  static absl::Status ReinitAll(const std::vector<int>& devices, const std::vector<NcclCommunicator*>& ranks);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts, Counts counts) override;
  absl::Status AllToAllCounts(const std::vector<int64_t>& send_counts, std::vector<int64_t>* recv_counts) override;
  absl::Status AllGather(const void* send, int64_t bytes, void* recv) override;
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status Send(const void* data, int64_t bytes, int peer) override;
  absl::Status Recv(void* data, int64_t bytes, int peer) override;
  absl::Status Barrier() override;
  // Raises the group's abort flag and aborts this rank's communicator (ncclCommAbort); it
  // cannot be used afterwards.
  void Abort() override;
  CommStats stats() const override { return stats_; }

 private:
  struct Impl;
  NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int size);
  // Stream and scratch of one rank on `device` (the NCCL communicator is made by the caller).
  static absl::StatusOr<std::unique_ptr<Impl>> NewImpl(int device, int size,
                                                       std::shared_ptr<std::atomic<bool>> abort_flag);
  // Waits for the rank's stream, watching the abort flag and NCCL's asynchronous errors.
  absl::Status Wait();
  // ABORTED when the communicator is gone or the group's flag is up (then aborts it first).
  absl::Status Usable();
  absl::Status Finish(double seconds, int64_t sent, int64_t received);

  std::unique_ptr<Impl> impl_;
  int rank_, size_;
  CommStats stats_;
};

}  // namespace moeserve
