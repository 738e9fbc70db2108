// Collectives among the ranks of one parallel group (expert-parallel ranks of a stage, or the
// stages of a pipeline). Every rank calls the same collectives in the same order (SPMD); a
// buffer is host memory for LocalCommunicator and device memory for NcclCommunicator.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace moeserve {

// Traffic through one rank's communicator, cumulative (difference two snapshots per step).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;      // to other ranks (a rank's own share is not traffic)
  int64_t bytes_received = 0;  // from other ranks
  double seconds = 0;          // wall time inside collectives, waiting for peers included
};

// What AllToAll may assume of its counts. kChecked: it checks that every recv_counts[p] is what
// p sends, and every rank returns the same error before any data moves (under MPI, two more
// exchanges before the data: a decode step's all-to-all is latency-bound, so they triple it).
// kAgreed: the caller vouches for them: they come from an AllToAllCounts on this group, as the
// expert dispatch's do; a call that breaks this is not caught across ranks. (NCCL never checks:
// its counts are always the caller's word.)
enum class Counts { kChecked, kAgreed };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Each rank sends send_counts[p] bytes to peer p and receives recv_counts[p] bytes from it;
  // both buffers are packed in peer order. Zero counts are allowed. recv_counts[p] must equal
  // what p sends to this rank (with kChecked, INVALID_ARGUMENT otherwise, on every rank; MPI and
  // in-process groups).
  virtual absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                const std::vector<int64_t>& recv_counts, Counts counts) = 0;
  // Exchanges counts themselves, m per peer (send_counts holds size() * m, peer p's m at p * m;
  // every rank passes the same m): recv_counts[p * m + i] = what peer p passes as
  // send_counts[rank * m + i]. On the host, whatever the device.
  virtual absl::Status AllToAllCounts(const std::vector<int64_t>& send_counts, std::vector<int64_t>* recv_counts) = 0;
  // recv receives size() * bytes: rank p's `bytes` at offset p * bytes.
  virtual absl::Status AllGather(const void* send, int64_t bytes, void* recv) = 0;
  // Element-wise sum over ranks, the same bits on every rank (summed in rank order).
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // Point to point (pipeline stages): Send does not wait for the matching Recv.
  virtual absl::Status Send(const void* data, int64_t bytes, int peer) = 0;
  virtual absl::Status Recv(void* data, int64_t bytes, int peer) = 0;
  virtual absl::Status Barrier() = 0;
  // Gives up on the group after a local failure: every peer's pending and later calls return
  // ABORTED instead of waiting for this rank. The group must be reset or rebuilt before reuse.
  virtual void Abort() = 0;

  virtual CommStats stats() const = 0;
};

}  // namespace moeserve
