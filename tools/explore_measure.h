// `moeserve explore --measure`: runs each layout this machine can run, as ranks that are threads
// of this process, and sets the decode speed it measures beside the roofline's prediction for
// the layout as it runs here: every rank a thread with its share of the machine's cores and
// memory bandwidth (so the profile must describe this machine: `moeserve calibrate --out`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_loader.h"
#include "roofline/hardware.h"
#include "roofline/layout_search.h"

namespace moeserve::tools {

struct MeasureOptions {
  ModelSpec model;
  roofline::HardwareProfile hw;  // this machine's
  std::string hardware_path;     // the file it came from
  // A `bench --sweep-batch --out` JSON whose fitted efficiencies turn the bound into a
  // calibrated prediction (empty: the bound).
  std::string calibration;
  std::string kv_dtype = "bf16";
  int64_t context = 256;         // tokens each sequence holds when its decode steps are timed
  int64_t steps = 8;             // decode steps timed per point
  int64_t max_ranks = 4;         // layouts of more ranks are not run
  int64_t max_sequences = 64;    // points of more sequences are not run
  int threads = 0;               // of this process (0: one per CPU it may run on), split over the ranks
  bool processes = false;        // also run each layout of several ranks as processes under mpirun
  std::string mpirun_args;       // added to mpirun's command line (a hostfile, a launch agent: other hosts)
  bool progress = true;
};

struct MeasuredPoint {
  int64_t ep = 1, pp = 1, sequences = 0;
  int64_t domain_size = 0;            // as the ranks ran: 0 (one domain) for threads and one host's processes
  bool processes = false;             // the ranks were processes of an MPI job (else threads)
  double predicted_step_seconds = 0;  // the roofline, per decode step of all the sequences, as run here
  double measured_step_seconds = 0;   // median over the timed decode steps
  double predicted_tokens_per_second = 0, measured_tokens_per_second = 0;
  double error = 0;                   // measured / predicted step time - 1
  double measured_comm_us_per_token = 0;      // the slowest rank's, waits included
  double measured_comm_min_us_per_token = 0;  // the rank that waited least
  // The expert-parallel exchanges from the last rank's arrival to their end: the price's match.
  double measured_comm_after_last_us_per_token = 0;
  double predicted_comm_us_per_token = 0;
  // The job's warning that ranks of one machine time-share cores (runner/rank_cores.h), if any:
  // such a point measures the scheduler as much as the layout.
  std::string core_sharing;
  // The CPUs of this machine the layout's ranks shared. More ranks than CPUs time-share them:
  // a rank waiting in an exchange yields its CPU to another's compute, so the exchange overlaps
  // that work and its time is not the all-to-all's price (the step is still priced).
  int64_t cpus = 0;
  bool Oversubscribed() const { return cpus > 0 && ep * pp > cpus; }
};

// Every point of `candidates` that fits and is within the limits, each run on a fresh engine: the
// sequences prefilled to `context` tokens of random ids, then `steps` decode steps timed. With
// `processes`, each layout of several ranks runs again as an MPI job of that many processes on
// this machine (`moeserve bench` under mpirun, its steps read from --trace-jsonl).
absl::StatusOr<std::vector<MeasuredPoint>> MeasureLayouts(const MeasureOptions& o,
                                                          const std::vector<roofline::LayoutCandidate>& candidates);

// The profile of one rank of a layout of `ranks` on the machine `hw` describes: its share of the
// compute and of the memory bandwidth; its link, the all-to-all calibrate measured between
// `threads` (else between processes: the profile's interconnect, over MPI's shared memory).
// With the profile's bandwidth by thread count, what the rank's machine_threads / ranks threads
// pull alone (solo_mem_bandwidth), for the steps where fewer ranks stream.
roofline::HardwareProfile RankShare(const roofline::HardwareProfile& hw, int64_t ranks, bool threads,
                                    int64_t machine_threads);

}  // namespace moeserve::tools
