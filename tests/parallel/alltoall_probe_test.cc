// parallel/alltoall_probe: the all-to-all timing calibrate uses, between two thread ranks.
// After a sweep, a call is timed from the last rank's entry: the sweep itself, which takes far
// longer than an exchange between threads, must not enter the figure.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/alltoall_probe.h"
#include "parallel/comm_group.h"

namespace moeserve {
namespace {

std::vector<absl::StatusOr<AllToAllTiming>> OnTwoThreads(int64_t bytes, int64_t sweep) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(2);
  std::vector<absl::StatusOr<AllToAllTiming>> t(2);
  std::thread peer([&] { t[1] = TimeAllToAll(group->rank(1), bytes, 5, 1, sweep); });
  t[0] = TimeAllToAll(group->rank(0), bytes, 5, 1, sweep);
  peer.join();
  return t;
}

TEST(AllToAllProbeTest, ACallAfterASweepIsTimedWithoutTheSweep) {
  constexpr int64_t kSweep = int64_t{256} << 20;
  // What one sweep of that many bytes takes here, read the same way (a float per cache line).
  std::vector<float> sweep(kSweep / sizeof(float), 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  volatile float sum = 0;
  for (size_t i = 0; i < sweep.size(); i += 16) sum = sum + sweep[i];
  const double sweep_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  sweep = {};
  for (const auto& t : OnTwoThreads(4096, kSweep)) {
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->bytes_per_peer, 4096);
    EXPECT_GT(t->median_us, 0);
    EXPECT_LT(t->median_us, sweep_us / 2) << "one sweep took " << sweep_us << " us";
    EXPECT_GT(t->bus_bytes_per_second, 0);
  }
  for (const auto& t : OnTwoThreads(4096, 0)) {
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_GT(t->median_us, 0);
  }
}

TEST(AllToAllProbeTest, BadArgumentsAreRefusedByName) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(1);
  for (auto [iters, sweep, name] : {std::tuple{0, int64_t{0}, "iters"}, std::tuple{1, int64_t{-1}, "sweep_bytes"}}) {
    const absl::StatusOr<AllToAllTiming> t = TimeAllToAll(group->rank(0), 64, iters, 0, sweep);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace moeserve
