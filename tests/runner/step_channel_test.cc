// runner/ThreadChannel: each worker thread takes its own sub-steps (lent, not copied), the
// workers of a step run at the same time (ranks meet in collectives), every reply reaches its
// rank's Receive with its status, and Shutdown ends the loops. The process channel runs under
// mpirun in the MPI tests (tests/server/mpi_serve_test.cc, tests/engine/...).
#include "runner/step_channel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moeserve {
namespace {

TEST(ThreadChannelTest, WorkersRunEachStepTogetherAndEveryReplyReachesItsRank) {
  for (int n : {2, 4}) {
    ThreadChannel channel(n);
    std::atomic<int> arrived{0};
    std::atomic<bool> timed_out{false};
    std::vector<std::thread> workers;
    std::vector<int> steps_run(static_cast<size_t>(n), 0);
    for (int r = 1; r < n; ++r) {
      workers.emplace_back([&, r] {
        while (true) {
          auto task = channel.Next(r);
          ASSERT_TRUE(task.ok());
          if (task->shutdown()) return;
          ASSERT_EQ(task->kv, nullptr) << "in-process ranks are never sent KV piece copies";
          // Every rank (rank 0 included) waits here for all the others in this step.
          const int step = static_cast<int>(task->step->size());
          arrived.fetch_add(1);
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (arrived.load() < n * (step + 1)) {
            if (std::chrono::steady_clock::now() > give_up) {
              timed_out = true;
              break;
            }
            std::this_thread::yield();
          }
          ++steps_run[static_cast<size_t>(r)];
          RankStepResult result;
          result.a2a_bytes = r * 1000 + step;
          const absl::Status status =
              step % 7 == r ? absl::InternalError(absl::StrCat("rank ", r, " failed step ", step)) : absl::OkStatus();
          ASSERT_TRUE(channel.Reply(r, status, std::move(result)).ok());
        }
      });
    }
    for (int step = 0; step < 100; ++step) {
      // Rank r's sub-steps: `step` of them, so the worker can tell which step it was lent.
      std::vector<std::vector<SubStep>> subs(static_cast<size_t>(n), std::vector<SubStep>(static_cast<size_t>(step)));
      for (int r = 1; r < n; ++r) ASSERT_TRUE(channel.Send(r, subs[static_cast<size_t>(r)]).ok());
      arrived.fetch_add(1);  // rank 0's own part
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (arrived.load() < n * (step + 1) && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      for (int r = 1; r < n; ++r) {
        RankStepResult result;
        const absl::Status s = channel.Receive(r, &result);
        EXPECT_EQ(result.a2a_bytes, r * 1000 + step) << "rank " << r << " step " << step;
        EXPECT_EQ(s.ok(), step % 7 != r) << s;
      }
      ASSERT_FALSE(timed_out) << n << " ranks, step " << step << ": a worker did not run with the others";
    }
    ASSERT_TRUE(channel.Shutdown().ok());
    for (auto& t : workers) t.join();
    for (int r = 1; r < n; ++r) EXPECT_EQ(steps_run[static_cast<size_t>(r)], 100) << "rank " << r;
    EXPECT_EQ(channel.DescribeRank(3), "rank 3");
    EXPECT_FALSE(channel.failures_are_fatal());
  }
}

}  // namespace
}  // namespace moeserve
