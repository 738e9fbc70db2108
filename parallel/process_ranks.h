// The ranks of a parallel layout when they are processes (started by mpirun), seen from one of
// them. Rank 0 runs the front end and the scheduler and sends every other rank its part of each
// step; the others run persistent workers. The interface keeps MPI out of the engine: the MPI
// implementation is parallel/mpi_world.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/abort_signal.h"
#include "parallel/comm_group.h"

namespace moeserve {

class ProcessRanks {
 public:
  virtual ~ProcessRanks() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective over all ranks: the ranks passing the same `color` form a group, ordered by
  // `key`. The group's rank(r) is this process's communicator for r == its own place in the
  // group, null for the others (they live in other processes). A group cannot be reset: a
  // failed step among processes is fatal (Reset returns UNAVAILABLE).
  virtual absl::StatusOr<std::unique_ptr<CommGroup>> Split(int color, int key) = 0;
  // The same group over NCCL on GPU `device` of this process: the group's first rank makes a
  // unique id (ncclGetUniqueId) and broadcasts it over MPI, every member joins with it. A lost
  // rank aborts the NCCL communicator (ncclCommAbort) as it ends MPI waits. UNIMPLEMENTED in a
  // build without CUDA.
  virtual absl::StatusOr<std::unique_ptr<CommGroup>> SplitNccl(int color, int key, int device) = 0;
  // Collective: every rank's value, in rank order.
  virtual absl::StatusOr<std::vector<double>> AllGather(double value) = 0;
  // Collective: every rank's bytes (of any length), in rank order.
  virtual absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) = 0;
  // Step messages between rank 0 and a worker, on a channel of their own (never mixed with the
  // collectives of the data plane). Receive waits until the message arrives or `abort_signal`
  // is raised (UNAVAILABLE with its message).
  virtual absl::Status SendMessage(int peer, const std::string& bytes) = 0;
  virtual absl::StatusOr<std::string> ReceiveMessage(int peer) = 0;
  // Rank 0 marks each step (and which worker's reply it waits for, -1: none), so that a step that
  // outlasts the step timeout ends the job even when every rank still sends heartbeats.
  virtual void StepBegins() = 0;
  virtual void WaitingFor(int rank) = 0;
  virtual void StepEnds() = 0;
  // Raised when a rank is lost; every wait of this process's MPI communicators watches it.
  virtual AbortSignal* abort_signal() = 0;
  // "rank 1 (pid 4242 on host node2)".
  virtual std::string DescribeRank(int rank) const = 0;
};

}  // namespace moeserve
