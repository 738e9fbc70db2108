// kvcache/: block pool accounting under random allocate / retain / release sequences,
// checked against an independent model of the reference counts.
#include <map>
#include <random>

#include "kvcache/block_pool.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

TEST(BlockPoolTest, AllocateIsAllOrNothing) {
  BlockPool pool(8);
  auto a = pool.Allocate(5);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(4);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(b.status().message()).find("need 4 blocks, 3 of 8 available"), std::string::npos)
      << b.status();
  EXPECT_EQ(pool.num_free(), 3);
  pool.Release(*a);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_TRUE(pool.CheckInvariants());
}

TEST(BlockPoolTest, RandomWorkloadKeepsExactAccounting) {
  BlockPool pool(64);
  std::map<int32_t, int> refs;  // independent model
  std::mt19937 gen(17);
  for (int step = 0; step < 5000; ++step) {
    const int op = gen() % 3;
    if (op == 0) {
      const int64_t n = gen() % 6;
      auto got = pool.Allocate(n);
      ASSERT_EQ(got.ok(), n <= static_cast<int64_t>(64 - refs.size()));
      if (got.ok()) {
        for (int32_t b : *got) {
          ASSERT_EQ(refs.count(b), 0u) << "block " << b << " handed out twice";
          refs[b] = 1;
        }
      }
    } else if (!refs.empty()) {
      auto it = refs.begin();
      std::advance(it, gen() % refs.size());
      if (op == 1) {
        pool.Retain(it->first);
        ++it->second;
      } else {
        pool.Release(it->first);
        if (--it->second == 0) refs.erase(it);
      }
    }
    ASSERT_EQ(pool.num_used(), static_cast<int64_t>(refs.size()));
  }
  for (auto& [b, c] : refs) EXPECT_EQ(pool.ref_count(b), c);
  EXPECT_TRUE(pool.CheckInvariants());
}

}  // namespace
}  // namespace moeserve
