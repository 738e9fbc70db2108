// `moeserve calibrate` and the two transports between processes that Open MPI offers on one
// machine: shared memory (the stand-in for a scale-up domain such as NVLink) and TCP (the
// stand-in for the scale-out network). Plain `calibrate` runs itself under mpirun once per
// transport; under mpirun, `calibrate` only times the job's all-to-all (parallel/alltoall_probe.h)
// and rank 0 prints it as JSON. The best bandwidth over the message sizes becomes the profile's
// interconnect_bandwidth (shared memory) and scale_out_bandwidth (TCP); the smallest message's
// time beyond its bytes, the per-call latency (interconnect_latency_s, scale_out_latency_s).
// The probe's JSON also holds the decode-sized calls after sweeps of memory (TimeAllToAll's
// `sweep_bytes`): what cold caches cost an exchange (docs/parallelism.md); they become the
// profile's scale_out_latency_after_sweep and interconnect_latency_after_sweep.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace moeserve::calibrate {

// Under mpirun: the all-to-all timings of the job's ranks as JSON (rank 0; the other ranks
// return an empty object). `quick`: fewer repeats.
absl::StatusOr<nlohmann::json> ProbeAllToAllUnderMpi(bool quick);

// Runs `moeserve calibrate` under mpirun with 2 ranks over each transport and returns
// {"shared_memory": {...}, "tcp": {...}} with every size's timings. `scale_out_mpirun_args`, when
// given, replace the TCP run's "--mca btl self,tcp": a hostfile and launch agent that put the two
// ranks on two hosts (or network namespaces, docs/multi-host.md), so that "tcp" is the link
// between them rather than loopback. UNIMPLEMENTED without MPI.
absl::StatusOr<nlohmann::json> MeasureMpiTransports(bool quick, const std::string& scale_out_mpirun_args = "");

// The same all-to-all between 2 ranks that are threads of this process (parallel/
// local_communicator.h), as JSON of the same shape: what a layout of thread ranks pays per call.
absl::StatusOr<nlohmann::json> MeasureThreadTransport(bool quick);

// The best bus bandwidth any message size reached in a probe's JSON (bytes/s), as a link's
// datasheet figure is: small messages are bound by latency, very large ones fall out of cache.
double BestBandwidth(const nlohmann::json& probe);

// The per-call latency of a probe's all-to-all (seconds): the smallest message that moves bytes,
// its median time less what its bytes take at the best bandwidth (never below 0; 0 without sizes).
double CallLatency(const nlohmann::json& probe);

// The same latency for each of the probe's after-sweep measurements (the call timed right after
// reading sweep_bytes): [{"sweep_bytes", "latency_s"}], as HardwareProfile's
// scale_out_latency_after_sweep; empty where the probe has none (two clocks, or none ran).
nlohmann::json AfterSweepLatencies(const nlohmann::json& probe);

// Whether a probe's empty all-to-all (0 bytes to every peer) took under half of its smallest
// message's time: the transport skips a call that moves nothing (HardwareProfile::
// empty_exchanges_free). False without a 0-byte size.
bool EmptyExchangeFree(const nlohmann::json& probe);

}  // namespace moeserve::calibrate
