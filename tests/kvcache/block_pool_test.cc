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

BlockHash HashOf(int i) { return BlockHash{static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + 1, static_cast<uint64_t>(i)}; }

// Retained blocks survive eviction pressure while ordinary cached blocks remain, are evicted
// (least recently released first) only when nothing else is left, and become ordinary LRU
// candidates at their deadline.
TEST(BlockPoolTest, RetentionOutlivesPressureUntilItExpires) {
  BlockPool pool(6);
  pool.AdvanceClock(100.0);
  auto a = pool.Allocate(6);
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 6; ++i) pool.Register((*a)[i], HashOf(i));
  pool.SetRetention((*a)[0], 200.0);  // in use: takes effect on release
  pool.SetRetention((*a)[1], 150.0);
  pool.Release(*a);  // release order 0..5: 0 is the least recently used
  pool.SetRetention((*a)[2], 300.0);  // already cached: moves to the retained list
  EXPECT_EQ(pool.num_cached(), 6);
  EXPECT_EQ(pool.num_retained(), 3);
  std::vector<int32_t> evicted;
  pool.SetEvictionObserver([&](int32_t b, const BlockHash&) { evicted.push_back(b); });
  auto b = pool.Allocate(3);  // the three ordinary blocks go first, retained ones stay
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(evicted, (std::vector<int32_t>{(*a)[3], (*a)[4], (*a)[5]}));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.Lookup(HashOf(i)).has_value()) << i;
  // Block 1 expires at 150: it becomes the first ordinary candidate.
  pool.AdvanceClock(160.0);
  EXPECT_EQ(pool.num_retained(), 2);
  auto c = pool.Allocate(1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(evicted.back(), (*a)[1]);
  // With nothing else left, a retained block is evicted (LRU among them) rather than failing.
  auto d = pool.Allocate(1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(evicted.back(), (*a)[0]);
  EXPECT_EQ(pool.retention((*d)[0]), 0.0);  // a reused block carries no retention
  EXPECT_TRUE(pool.Lookup(HashOf(2)).has_value());
  EXPECT_TRUE(pool.CheckInvariants());
  // Taking a retained block back and releasing it keeps it retained.
  pool.Retain(*pool.Lookup(HashOf(2)));
  EXPECT_EQ(pool.num_retained(), 0);
  pool.Release(*pool.Lookup(HashOf(2)));
  EXPECT_EQ(pool.num_retained(), 1);
  pool.AdvanceClock(400.0);
  EXPECT_EQ(pool.num_retained(), 0);
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_TRUE(pool.CheckInvariants());
}

// Segments (one per expert-parallel rank): allocations stay inside their segment, a full segment
// does not borrow from another, and the prefix cache answers per segment.
TEST(BlockPoolTest, SegmentsKeepTheirBlocksAndPrefixesApart) {
  BlockPool pool(10, 3);  // segments of 3, 3 and 4 blocks
  EXPECT_EQ(pool.segment_blocks(0), 3);
  EXPECT_EQ(pool.segment_blocks(2), 4);
  auto a = pool.Allocate(3, 1);
  ASSERT_TRUE(a.ok());
  for (int32_t b : *a) EXPECT_EQ(pool.segment_of(b), 1) << b;
  EXPECT_EQ(pool.Allocate(1, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_available(0), 3);
  auto c = pool.Allocate(4, 2);
  ASSERT_TRUE(c.ok());
  for (int32_t b : *c) EXPECT_EQ(pool.segment_of(b), 2) << b;
  // The same hash registered in two segments names two blocks; each lookup finds its own.
  pool.Register((*a)[0], HashOf(7));
  pool.Register((*c)[0], HashOf(7));
  EXPECT_EQ(pool.Lookup(HashOf(7), 1), (*a)[0]);
  EXPECT_EQ(pool.Lookup(HashOf(7), 2), (*c)[0]);
  EXPECT_FALSE(pool.Lookup(HashOf(7), 0).has_value());
  pool.Release(*a);
  // Segment 1 evicts its own cached block for a new allocation; segment 2's copy stays.
  auto d = pool.Allocate(3, 1);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(pool.Lookup(HashOf(7), 1).has_value());
  EXPECT_EQ(pool.Lookup(HashOf(7), 2), (*c)[0]);
  EXPECT_TRUE(pool.CheckInvariants());
  pool.Release(*c);
  pool.Release(*d);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_TRUE(pool.CheckInvariants());
}

}  // namespace
}  // namespace moeserve
