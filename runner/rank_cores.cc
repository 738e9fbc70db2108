// Ranks' cores (see rank_cores.h).
#include "runner/rank_cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "runner/rank_step.h"

namespace moeserve {
namespace {

// "machine online core,core,..." and back.
std::string Encode(const RankCores& c) { return absl::StrCat(c.machine, " ", c.online, " ", absl::StrJoin(c.cores, ",")); }

RankCores Decode(const std::string& text) {
  RankCores c;
  const std::vector<std::string> parts = absl::StrSplit(text, ' ');
  if (parts.size() != 3) return c;
  if (!absl::SimpleAtoi(parts[0], &c.machine) || !absl::SimpleAtoi(parts[1], &c.online)) return RankCores{};
  for (absl::string_view core : absl::StrSplit(parts[2], ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(core, &v)) c.cores.push_back(v);
  }
  return c;
}

// CPU `cpu`'s physical core: package x 2^20 + core id; the CPU itself where sysfs has no topology.
int64_t CoreOf(int cpu) {
  const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
  int64_t package = -1, core = -1;
  std::ifstream(dir + "physical_package_id") >> package;
  std::ifstream(dir + "core_id") >> core;
  if (package < 0 || core < 0) return cpu;
  return (package << 20) + core;
}

// Whether CPU `cpu` is online (cpu0 often has no "online" file: it always is).
bool Online(int cpu) {
  std::ifstream in(absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/online"));
  int on = 1;
  if (in) in >> on;
  return on != 0;
}

}  // namespace

RankCores MyCores() {
  RankCores c;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return c;  // unknown: no claim about this rank
  c.machine = MachineClockId();
  std::set<int64_t> mine, online;
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  for (int i = 0; i < configured && i < CPU_SETSIZE; ++i) {
    if (!Online(i)) continue;
    const int64_t core = CoreOf(i);
    online.insert(core);
    if (CPU_ISSET(i, &set)) mine.insert(core);
  }
  c.online = static_cast<int64_t>(online.size());
  c.cores.assign(mine.begin(), mine.end());
  return c;
}

std::string CoreSharingWarning(const std::vector<RankCores>& ranks) {
  std::map<uint64_t, std::vector<size_t>> by_machine;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].machine != 0) by_machine[ranks[r].machine].push_back(r);
  }
  std::vector<std::string> found;
  for (const auto& [machine, members] : by_machine) {
    std::set<int64_t> cores;
    int64_t online = 0;
    for (size_t r : members) {
      cores.insert(ranks[r].cores.begin(), ranks[r].cores.end());
      online = std::max(online, ranks[r].online);
    }
    const int64_t room = std::min<int64_t>(static_cast<int64_t>(members.size()), online);
    if (static_cast<int64_t>(cores.size()) >= room) continue;
    found.push_back(absl::StrCat("ranks ", absl::StrJoin(members, ", "), " share one machine of ", online,
                                 " cores but may run only on ", cores.size(), " of them"));
  }
  if (found.empty()) return "";
  return absl::StrCat(absl::StrJoin(found, "; "),
                      ": they time-share those cores, which slows every step and exchange. Each host's "
                      "mpirun daemon binds its ranks from core 0 up; where the hosts are namespaces or "
                      "containers of one machine with cores to spare, pass --bind-to none (or a rankfile)");
}

absl::StatusOr<std::string> CheckRankCores(ProcessRanks* world) {
  ASSIGN_OR_RETURN(const std::vector<std::string> all, world->AllGatherBytes(Encode(MyCores())));
  std::vector<RankCores> ranks;
  for (const std::string& text : all) ranks.push_back(Decode(text));
  return CoreSharingWarning(ranks);
}

}  // namespace moeserve
