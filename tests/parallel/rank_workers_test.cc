// parallel/RankWorkers: every rank runs each step at the same time on its own persistent thread
// (rank 0 on the caller's), steps are barriers, and the workers shut down cleanly.
#include "parallel/rank_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace moeserve {
namespace {

TEST(RankWorkersTest, RanksRunConcurrentlyOnTheSameThreadsEveryStep) {
  for (int n : {1, 2, 4}) {
    RankWorkers workers(n);
    ASSERT_EQ(workers.num_ranks(), n);
    std::vector<std::thread::id> first(n);
    for (int step = 0; step < 200; ++step) {
      std::atomic<int> arrived{0};
      std::vector<std::thread::id> ids(n);
      std::vector<int> done(n, 0);
      std::atomic<bool> timed_out{false};
      workers.Run([&](int r) {
        ids[r] = std::this_thread::get_id();
        // Every rank waits here for all the others: it only gets past if they run at once.
        arrived.fetch_add(1);
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (arrived.load() < n) {
          if (std::chrono::steady_clock::now() > give_up) {
            timed_out = true;
            break;
          }
          std::this_thread::yield();
        }
        done[r] = step + 1;
      });
      ASSERT_FALSE(timed_out.load())
          << n << " ranks, step " << step << ": the ranks did not run concurrently";
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(done[r], step + 1) << "Run returned before rank " << r << " finished";
      EXPECT_EQ(ids[0], std::this_thread::get_id()) << "rank 0 runs on the caller's thread";
      if (step == 0) {
        first = ids;
      } else {
        EXPECT_EQ(ids, first) << "a rank changed threads: workers must persist across steps";
      }
    }
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b)
        EXPECT_NE(first[a], first[b]) << "ranks " << a << " and " << b << " share a thread";
    }
  }
}

}  // namespace
}  // namespace moeserve
