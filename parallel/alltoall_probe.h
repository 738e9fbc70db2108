// Times the all-to-all of expert parallelism on a group: every rank sends `bytes_per_peer` to
// each peer through Communicator::AllToAll with agreed counts (no check exchanges), as a MoE
// layer's dispatch does; a call's time is the slowest rank's. Used by `moeserve calibrate` (under mpirun, per transport) and by
// benchmarks/mpi_alltoall_bench.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace moeserve {

struct AllToAllTiming {
  int64_t bytes_per_peer = 0;
  double median_us = 0, p90_us = 0;
  // Bytes each rank sends to the others per second, at the median: the per-device link
  // bandwidth the roofline's communication term divides by.
  double bus_bytes_per_second = 0;
};

// Collective: every rank of the group calls it with the same arguments (after `warmup` samples,
// `iters` timed ones; a sample is a few back-to-back calls after a barrier, timed together).
absl::StatusOr<AllToAllTiming> TimeAllToAll(Communicator* comm, int64_t bytes_per_peer, int iters,
                                            int warmup = 5);

}  // namespace moeserve
