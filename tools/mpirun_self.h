// Runs this moeserve binary as an MPI job on this machine (mpirun --oversubscribe), for the
// commands that measure across processes: calibrate's transport probes, explore --measure.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace moeserve::tools {

struct MpirunOutput {
  int status = 0;      // mpirun's exit status, as pclose gives it
  std::string output;  // stdout and stderr together
};

// `mpirun --oversubscribe [--allow-run-as-root] MPIRUN_ARGS -np NP <this binary> ARGS`, through a
// shell (quote paths in the arguments). UNIMPLEMENTED in a build without MPI.
absl::StatusOr<MpirunOutput> RunSelfUnderMpirun(int np, const std::string& mpirun_args, const std::string& args);

}  // namespace moeserve::tools
