// Whether the ranks of an mpirun job that share a machine were bound to fewer cores than they
// could use. mpirun binds each host's ranks from core 0 up; when the "hosts" are network
// namespaces (or containers) of one machine, each one's daemon binds its first rank to core 0,
// and ranks that should run side by side time-share a core (measured: every all-to-all across
// two namespaces 2-30x slower). Such a job still computes the right answer, so this warns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/process_ranks.h"

namespace moeserve {

// Cores are physical (package and core id from sysfs), so that two hardware threads of one core
// count once; where sysfs has no topology, each CPU is its own core.
struct RankCores {
  uint64_t machine = 0;        // MachineClockId(): ranks with the same id share a machine (0: unknown)
  int64_t online = 0;          // the machine's online cores
  std::vector<int64_t> cores;  // the cores the rank may run on (its affinity)
};

// This process's.
RankCores MyCores();

// A warning naming the ranks of one machine whose cores together are fewer than
// min(ranks there, online cores), or "" where they have room (a necessary condition: ranks
// whose affinities overlap unevenly may still share cores unseen).
std::string CoreSharingWarning(const std::vector<RankCores>& ranks);

// Collective over every rank of `world`: gathers each rank's RankCores and returns the warning.
absl::StatusOr<std::string> CheckRankCores(ProcessRanks* world);

}  // namespace moeserve
