// parallel/alltoall_probe: the all-to-all timing calibrate uses, between two thread ranks.
// After a sweep, a call is timed from the last rank's entry: neither the sweep, which takes far
// longer than an exchange between threads, nor the wait for a rank still sweeping may enter it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/alltoall_probe.h"
#include "parallel/comm_group.h"

namespace moeserve {
namespace {

// Both ranks time `bytes` per peer; rank r sweeps sweep[r] bytes before each call. `seconds`
// gets each rank's time in the whole probe.
std::vector<absl::StatusOr<AllToAllTiming>> OnTwoThreads(int64_t bytes, const int64_t (&sweep)[2],
                                                         double (&seconds)[2]) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(2);
  std::vector<absl::StatusOr<AllToAllTiming>> t(2);
  auto run = [&](int r) {
    const auto t0 = std::chrono::steady_clock::now();
    t[r] = TimeAllToAll(group->rank(r), bytes, /*iters=*/5, /*warmup=*/1, sweep[r]);
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::thread peer(run, 1);
  run(0);
  peer.join();
  return t;
}

// Rank 1 sweeps 128 MiB before each call, rank 0 almost nothing: rank 1 always enters last, so
// a figure timed from the first entry would hold rank 1's whole sweep.
TEST(AllToAllProbeTest, ACallAfterASweepIsTimedFromTheLastEntry) {
  constexpr int64_t kSweep = int64_t{128} << 20;
  // What one sweep of that many bytes takes here, read the same way (a float per cache line):
  // the fastest of three, so that a sweep slowed by other tests (ctest -j) sets no bound below.
  std::vector<float> sweep(kSweep / sizeof(float), 1.0f);
  double sweep_us = 1e30, slowest_sweep_us = 0;  // the bound below takes the fastest, above the slowest
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sum = 0;
    for (size_t i = 0; i < sweep.size(); i += 16) sum = sum + sweep[i];
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    sweep_us = std::min(sweep_us, us);
    slowest_sweep_us = std::max(slowest_sweep_us, us);
  }
  sweep = {};
  double seconds[2] = {};
  const auto timings = OnTwoThreads(4096, {64, kSweep}, seconds);
  for (const auto& t : timings) {
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->bytes_per_peer, 4096);
    EXPECT_GT(t->median_us, 0);
    EXPECT_LT(t->median_us, slowest_sweep_us / 2) << "one sweep took " << slowest_sweep_us << " us";
    EXPECT_GT(t->bus_bytes_per_second, 0);
  }
  // The sweeps did run: 6 samples of 4 calls, each after one (a quarter of their time at the
  // fastest pace seen: without them the probe takes a few hundred microseconds).
  EXPECT_GT(seconds[1] * 1e6, 0.25 * 24 * sweep_us) << "one sweep took " << sweep_us << " us";
  double idle[2] = {};
  for (const auto& t : OnTwoThreads(4096, {0, 0}, idle)) {
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_GT(t->median_us, 0);
  }
}

TEST(AllToAllProbeTest, BadArgumentsAreRefusedByName) {
  const std::unique_ptr<CommGroup> group = MakeLocalGroup(1);
  const std::tuple<int, int64_t, const char*, const char*> cases[] = {{0, 0, "iters", "sweep_bytes"},
                                                                      {1, -1, "sweep_bytes", "iters"}};
  for (const auto& [iters, sweep, name, other] : cases) {
    const absl::StatusOr<AllToAllTiming> t = TimeAllToAll(group->rank(0), 64, iters, 0, sweep);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status();
    EXPECT_EQ(t.status().message().find(other), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace moeserve
