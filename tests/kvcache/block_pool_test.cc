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
  std::vector<BlockEviction> evictions;
  std::vector<int32_t> evicted;
  auto b = pool.Allocate(3, 0, &evictions);  // the three ordinary blocks go first, retained ones stay
  ASSERT_TRUE(b.ok());
  for (const BlockEviction& e : evictions) evicted.push_back(e.block);
  EXPECT_EQ(evicted, (std::vector<int32_t>{(*a)[3], (*a)[4], (*a)[5]}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(evictions[i].hash, HashOf(3 + i)) << i;  // the hash it was cached under
    EXPECT_EQ(evictions[i].retain_until, 0.0) << i;
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.Lookup(HashOf(i)).has_value()) << i;
  // Block 1 expires at 150: it becomes the first ordinary candidate.
  pool.AdvanceClock(160.0);
  EXPECT_EQ(pool.num_retained(), 2);
  evictions.clear();
  auto c = pool.Allocate(1, 0, &evictions);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].block, (*a)[1]);
  EXPECT_EQ(evictions[0].retain_until, 150.0);  // the deadline travels with the eviction
  // With nothing else left, a retained block is evicted (LRU among them) rather than failing.
  evictions.clear();
  auto d = pool.Allocate(1, 0, &evictions);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].block, (*a)[0]);
  EXPECT_EQ(evictions[0].retain_until, 200.0);
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

// Forget drops a block's prefix-cache entry (its contents were not what the hash says): an
// in-use block stays in use but is found no more, a cached one becomes free; another hash is
// left alone.
TEST(BlockPoolTest, ForgetDropsTheIndexEntryOnly) {
  BlockPool pool(4);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.ok());
  pool.Register((*a)[0], HashOf(0));
  pool.Register((*a)[1], HashOf(1));
  pool.SetRetention((*a)[1], 100.0);
  pool.Release((*a)[1]);  // cached (retained)
  pool.Forget((*a)[0], HashOf(7));  // not its hash: nothing happens
  EXPECT_TRUE(pool.Lookup(HashOf(0)).has_value());
  pool.Forget((*a)[0], HashOf(0));
  EXPECT_FALSE(pool.Lookup(HashOf(0)).has_value());
  EXPECT_EQ(pool.ref_count((*a)[0]), 1);
  pool.Forget((*a)[1], HashOf(1));
  EXPECT_FALSE(pool.Lookup(HashOf(1)).has_value());
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_retained(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_TRUE(pool.CheckInvariants());
  pool.Release((*a)[0]);  // no hash any more: straight to free
  EXPECT_EQ(pool.num_free(), 4);
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
