// runner/rank_cores: the warning for ranks of one machine bound to fewer cores than they could
// use (each namespace's mpirun daemon binds its first rank to core 0).
#include "runner/rank_cores.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

RankCores On(uint64_t machine, int64_t online, std::vector<int64_t> cores) { return {machine, online, std::move(cores)}; }

TEST(RankCoresTest, RanksOfOneMachineOnOneCoreAreNamed) {
  // Two namespaces of a 2-CPU machine, each daemon binding its rank to core 0.
  const std::string w = CoreSharingWarning({On(7, 2, {0}), On(7, 2, {0})});
  EXPECT_NE(w.find("ranks 0, 1"), std::string::npos) << w;
  EXPECT_NE(w.find("machine of 2 cores but may run only on 1 of them"), std::string::npos) << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  // Only the machine that lacks room: machine 9's two ranks have a core each.
  const std::string two = CoreSharingWarning({On(9, 2, {0}), On(7, 4, {1}), On(9, 2, {1}), On(7, 4, {1})});
  EXPECT_NE(two.find("ranks 1, 3"), std::string::npos) << two;
  EXPECT_EQ(two.find("ranks 0, 2"), std::string::npos) << two;
}

TEST(RankCoresTest, RanksWithRoomOrOnOtherMachinesPass) {
  EXPECT_EQ(CoreSharingWarning({On(7, 2, {0}), On(7, 2, {1})}), "");          // a core each
  EXPECT_EQ(CoreSharingWarning({On(7, 2, {0, 1}), On(7, 2, {0, 1})}), "");    // unbound
  EXPECT_EQ(CoreSharingWarning({On(7, 2, {0}), On(8, 2, {0})}), "");          // two machines
  // Four ranks on two CPUs can have no more than two: oversubscribed by choice, not by binding.
  EXPECT_EQ(CoreSharingWarning({On(7, 2, {0}), On(7, 2, {1}), On(7, 2, {0}), On(7, 2, {1})}), "");
  EXPECT_EQ(CoreSharingWarning({On(0, 2, {0}), On(0, 2, {0})}), "") << "machine unknown: no claim";
  EXPECT_EQ(CoreSharingWarning({On(7, 2, {0})}), "");
}

TEST(RankCoresTest, ThisProcessReportsItsMachineAndCpus) {
  const RankCores me = MyCores();
  EXPECT_NE(me.machine, 0u);
  EXPECT_GT(me.online, 0);
  ASSERT_FALSE(me.cores.empty());
  EXPECT_LE(static_cast<int64_t>(me.cores.size()), me.online);
}

}  // namespace
}  // namespace moeserve
