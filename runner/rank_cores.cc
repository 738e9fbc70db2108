// Ranks' cores (see rank_cores.h).
#include "runner/rank_cores.h"

#include <sched.h>
#include <sys/sysinfo.h>

#include <algorithm>
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

// "machine online cpu,cpu,..." and back.
std::string Encode(const RankCores& c) { return absl::StrCat(c.machine, " ", c.online, " ", absl::StrJoin(c.cpus, ",")); }

RankCores Decode(const std::string& text) {
  RankCores c;
  const std::vector<std::string> parts = absl::StrSplit(text, ' ');
  if (parts.size() != 3) return c;
  if (!absl::SimpleAtoi(parts[0], &c.machine) || !absl::SimpleAtoi(parts[1], &c.online)) return RankCores{};
  for (absl::string_view cpu : absl::StrSplit(parts[2], ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(cpu, &v)) c.cpus.push_back(v);
  }
  return c;
}

}  // namespace

RankCores MyCores() {
  RankCores c;
  c.machine = MachineClockId();
  c.online = get_nprocs();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) c.cpus.push_back(i);
    }
  }
  return c;
}

std::string CoreSharingWarning(const std::vector<RankCores>& ranks) {
  std::map<uint64_t, std::vector<size_t>> by_machine;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].machine != 0) by_machine[ranks[r].machine].push_back(r);
  }
  std::vector<std::string> found;
  for (const auto& [machine, members] : by_machine) {
    std::set<int> cpus;
    int64_t online = 0;
    for (size_t r : members) {
      cpus.insert(ranks[r].cpus.begin(), ranks[r].cpus.end());
      online = std::max(online, ranks[r].online);
    }
    const int64_t room = std::min<int64_t>(static_cast<int64_t>(members.size()), online);
    if (static_cast<int64_t>(cpus.size()) >= room) continue;
    found.push_back(absl::StrCat("ranks ", absl::StrJoin(members, ", "), " share one machine of ", online,
                                 " CPUs but may run only on CPUs {", absl::StrJoin(cpus, ", "), "}"));
  }
  if (found.empty()) return "";
  return absl::StrCat(absl::StrJoin(found, "; "),
                      ": they time-share those cores, which slows every step and exchange. Each host's "
                      "mpirun daemon binds its ranks from core 0 up; where the hosts are namespaces or "
                      "containers of one machine, pass --bind-to none (or a rankfile)");
}

absl::StatusOr<std::string> CheckRankCores(ProcessRanks* world) {
  ASSIGN_OR_RETURN(const std::vector<std::string> all, world->AllGatherBytes(Encode(MyCores())));
  std::vector<RankCores> ranks;
  for (const std::string& text : all) ranks.push_back(Decode(text));
  return CoreSharingWarning(ranks);
}

}  // namespace moeserve
