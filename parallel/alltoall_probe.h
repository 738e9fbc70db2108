// Times the all-to-all of expert parallelism on a group: every rank sends `bytes_per_peer` to
// each peer through Communicator::AllToAll with agreed counts (no check exchanges), as a MoE
// layer's dispatch does. Used by `moeserve calibrate` (under mpirun, per transport; between
// threads) and by benchmarks/mpi_alltoall_bench.
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
// `iters` timed ones). Two settings:
// - `sweep_bytes` 0, idle: a sample is a few back-to-back calls after a barrier, timed together
//   (the slowest rank's time per call), as a MoE layer's exchanges follow one another.
// - `sweep_bytes` > 0, as in a running engine: before each call every rank reads that many
//   bytes of memory of its own, as a decode step's weight streaming does, which leaves the
//   caches and TLBs cold for the transport's code and state. Each call is timed from the last
//   rank's entry to the last rank's exit (the engine's `comm_after_last`), so neither the sweep
//   nor the ranks' skew enters. Needs the ranks' steady clocks to be one clock (one machine).
absl::StatusOr<AllToAllTiming> TimeAllToAll(Communicator* comm, int64_t bytes_per_peer, int iters, int warmup = 5,
                                            int64_t sweep_bytes = 0);

}  // namespace moeserve
