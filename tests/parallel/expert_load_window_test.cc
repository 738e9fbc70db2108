// ExpertLoadWindow (--eplb-window): the sum it keeps equals the last N steps' counts added up
// afresh, and a window too large to keep is refused naming the flag and its limit.
#include "parallel/expert_load_window.h"

#include <gtest/gtest.h>

#include <random>

namespace moeserve {
namespace {

TEST(ExpertLoadWindowTest, HoldsExactlyTheLastSteps) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  for (int64_t steps : {1, 3, 7}) {
    const int64_t layers = 3, experts = 5, cells = layers * experts;
    auto w = ExpertLoadWindow::Create(layers, experts, steps);
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<std::vector<int64_t>> seen;
    for (int s = 0; s < 25; ++s) {
      std::vector<int64_t> step;
      if (gen() % 5 != 0) {  // else a step that routed nothing (empty)
        for (int64_t i = 0; i < cells; ++i) step.push_back(gen() % 100);
      }
      w->Add(step);
      seen.push_back(step.empty() ? std::vector<int64_t>(static_cast<size_t>(cells), 0) : step);
      std::vector<int64_t> want(static_cast<size_t>(cells), 0);
      for (size_t k = seen.size() > static_cast<size_t>(steps) ? seen.size() - steps : 0; k < seen.size(); ++k) {
        for (int64_t i = 0; i < cells; ++i) want[i] += seen[k][i];
      }
      ASSERT_EQ(w->load().tokens, want) << "window " << steps << ", after step " << s << " (seed " << seed << ")";
      EXPECT_EQ(w->steps_held(), std::min<int64_t>(s + 1, steps));
      EXPECT_EQ(w->load().layers, layers);
      EXPECT_EQ(w->load().experts, experts);
    }
  }
}

TEST(ExpertLoadWindowTest, RefusesAWindowItCannotKeep) {
  // DeepSeek-V3's 61 layers x 256 experts: 62,464 bytes a step, so at most 4297 steps in 256 MiB.
  EXPECT_TRUE(ExpertLoadWindow::Create(61, 256, 4297).ok());
  auto big = ExpertLoadWindow::Create(61, 256, 4298);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(big.status().message()).find("--eplb-window must be in [1, 4297]"), std::string::npos)
      << big.status();
  EXPECT_FALSE(ExpertLoadWindow::Create(8, 8, 0).ok());
}

}  // namespace
}  // namespace moeserve
