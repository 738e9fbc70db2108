// Host DDR tier over the flash tier: blocks pushed out of DDR go to flash and come back exact;
// recency decides what stays in DDR; a damaged flash record is never served.
#include "kvcache/host_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tests/test_util.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlockBytes = 3 * 1024;

std::vector<uint8_t> Block(uint64_t i) {
  std::vector<uint8_t> v(kBlockBytes);
  std::mt19937_64 gen(i * 104729 + 3);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}
BlockHash HashOf(uint64_t i) { return BlockHash{i * 0x9e3779b97f4a7c15ull + 1, ~i}; }

HostTierOptions Options(int64_t blocks) {
  HostTierOptions o;
  o.budget_bytes = static_cast<uint64_t>(blocks) * kBlockBytes;
  o.block_bytes = kBlockBytes;
  o.num_layers = 2;
  o.dtype = DType::kBF16;
  o.block_tokens = 16;
  return o;
}

std::string FreshDir() { return testing::FreshTempPath("host_tier"); }

TEST(HostTierTest, WithoutFlashTheLeastRecentlyUsedBlocksAreDropped) {
  auto tier = HostKvTier::Create(Options(4), nullptr);
  ASSERT_TRUE(tier.ok()) << tier.status();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_TRUE((*tier)->Get(HashOf(0), out.data()).ok());  // 0 is now the most recent
  for (uint64_t i = 4; i < 6; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  // 1 and 2 were the least recently used.
  for (uint64_t i : {1, 2}) EXPECT_EQ((*tier)->Get(HashOf(i), out.data()).status().code(), absl::StatusCode::kNotFound);
  for (uint64_t i : {0, 3, 4, 5}) {
    auto t = (*tier)->Get(HashOf(i), out.data());
    ASSERT_TRUE(t.ok()) << i;
    EXPECT_EQ(*t, KvTier::kHost);
    EXPECT_EQ(out, Block(i)) << "block " << i;
  }
  const HostTierStats s = (*tier)->stats();
  EXPECT_EQ(s.dropped, 2);
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.misses, 2);
}

TEST(HostTierTest, BlocksPushedOutOfDdrComeBackExactFromFlash) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  auto tier = HostKvTier::Create(Options(3), flash->get());
  ASSERT_TRUE(tier.ok());
  const int n = 8 + static_cast<int>(std::random_device{}() % 5);
  for (int i = 0; i < n; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  (*tier)->Flush();  // the transfer thread has written every pushed-out block
  EXPECT_EQ((*tier)->stats().demoted_to_flash, n - 3);
  EXPECT_EQ((*tier)->stats().async_writes, n - 3);
  std::vector<uint8_t> out(kBlockBytes);
  for (int i = n - 1; i >= 0; --i) {
    auto t = (*tier)->Get(HashOf(i), out.data());
    ASSERT_TRUE(t.ok()) << i;
    EXPECT_EQ(*t, i >= n - 3 ? KvTier::kHost : KvTier::kFlash) << "block " << i;
    EXPECT_EQ(out, Block(i)) << "block " << i;
  }
  // A flash hit is kept in DDR: read again, it comes from DDR.
  auto again = (*tier)->Get(HashOf(0), out.data());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, KvTier::kHost);
  EXPECT_EQ(out, Block(0));
  tier->reset();  // finishes the transfer thread's queued writes first
  fs::remove_all(dir);
}

TEST(HostTierTest, ADamagedFlashRecordIsNotServed) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  auto tier = HostKvTier::Create(Options(0), flash->get());  // no DDR: straight to flash
  ASSERT_TRUE(tier.ok());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  (*tier)->Flush();
  {
    std::fstream f((*flash)->PathOf(HashOf(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(FlashRecordHeader::kBytes + 100));
    f.put('\x77');
  }
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_EQ((*tier)->Get(HashOf(1), out.data()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*flash)->stats().dropped_corrupt, 1);
  for (uint64_t i : {0, 2}) {
    auto t = (*tier)->Get(HashOf(i), out.data());
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, KvTier::kFlash);
    EXPECT_EQ(out, Block(i));
  }
  tier->reset();  // finishes the transfer thread's queued writes first
  fs::remove_all(dir);
}

// Swap space shares the slab: reserving pushes cached blocks down to flash, pinned slots are
// never pushed out, and a reservation larger than what could be freed is refused.
TEST(HostTierTest, SwapSlotsArePinnedAndPushCachedBlocksDown) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  auto tier = HostKvTier::Create(Options(4), flash->get());
  ASSERT_TRUE(tier.ok());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  auto slots = (*tier)->ReserveSwap(3);
  ASSERT_TRUE(slots.ok()) << slots.status();
  for (int k = 0; k < 3; ++k) std::memcpy((*tier)->SwapData((*slots)[k]), Block(100 + k).data(), kBlockBytes);
  EXPECT_EQ((*tier)->stats().swap_blocks, 3);
  EXPECT_EQ((*tier)->stats().blocks, 1);
  EXPECT_EQ((*tier)->ReserveSwap(2).status().code(), absl::StatusCode::kResourceExhausted);
  // New cached blocks rotate through the one slot left; the swapped contents stay intact.
  for (uint64_t i = 4; i < 8; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  for (int k = 0; k < 3; ++k) {
    const std::vector<uint8_t> got((*tier)->SwapData((*slots)[k]), (*tier)->SwapData((*slots)[k]) + kBlockBytes);
    EXPECT_EQ(got, Block(100 + k)) << "swap slot " << k;
  }
  (*tier)->Flush();
  std::vector<uint8_t> out(kBlockBytes);
  for (uint64_t i = 0; i < 8; ++i) {  // every pushed-out block is still found, exact
    ASSERT_TRUE((*tier)->Get(HashOf(i), out.data()).ok()) << i;
    EXPECT_EQ(out, Block(i)) << i;
  }
  (*tier)->FreeSwap(*slots);
  EXPECT_EQ((*tier)->stats().swap_blocks, 0);
  EXPECT_TRUE((*tier)->ReserveSwap(4).ok());
  tier->reset();  // finishes the transfer thread's queued writes first
  fs::remove_all(dir);
}

// Retention in DDR: retained blocks are pushed out only when nothing else is left, and carry
// their deadline down to flash and back.
TEST(HostTierTest, RetainedBlocksStayInDdrAndKeepTheirDeadline) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  double now = 100.0;
  HostTierOptions o = Options(3);
  o.clock = [&] { return now; };
  auto tier = HostKvTier::Create(o, flash->get());
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->Put(HashOf(0), Block(0).data(), 500.0).ok());
  ASSERT_TRUE((*tier)->Put(HashOf(1), Block(1).data(), 400.0).ok());
  for (uint64_t i = 2; i < 9; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
  (*tier)->Flush();
  std::vector<uint8_t> out(kBlockBytes);
  double until = 0;
  auto t0 = (*tier)->Get(HashOf(0), out.data(), &until);
  ASSERT_TRUE(t0.ok());
  EXPECT_EQ(*t0, KvTier::kHost) << "a retained block was pushed out by ordinary ones";
  EXPECT_EQ(until, 500.0);
  EXPECT_EQ((*tier)->stats().retained, 2);
  // Only retained blocks left in DDR but one slot: the least recently used retained block goes
  // down to flash with its deadline.
  ASSERT_TRUE((*tier)->Put(HashOf(20), Block(20).data(), 600.0).ok());
  ASSERT_TRUE((*tier)->Put(HashOf(21), Block(21).data(), 600.0).ok());
  (*tier)->Flush();
  auto t1 = (*tier)->Get(HashOf(1), out.data(), &until);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(*t1, KvTier::kFlash);
  EXPECT_EQ(until, 400.0);
  EXPECT_EQ(out, Block(1));
  tier->reset();  // finishes the transfer thread's queued writes first
  fs::remove_all(dir);
}

// Prefetch: the transfer thread reads flash blocks into DDR, so the later Get is a DDR hit.
TEST(HostTierTest, PrefetchBringsFlashBlocksIntoDdr) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  for (uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE((*flash)->Put(HashOf(i), 0, 2, DType::kBF16, 16, Block(i).data(), kBlockBytes).ok());
  }
  auto tier = HostKvTier::Create(Options(8), flash->get());
  ASSERT_TRUE(tier.ok());
  (*tier)->Prefetch({HashOf(0), HashOf(1), HashOf(2), HashOf(77)});  // 77 is nowhere
  (*tier)->Flush();
  EXPECT_EQ((*tier)->stats().prefetched, 3);
  std::vector<uint8_t> out(kBlockBytes);
  for (uint64_t i = 0; i < 5; ++i) {
    auto t = (*tier)->Get(HashOf(i), out.data());
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, i < 3 ? KvTier::kHost : KvTier::kFlash) << i;
    EXPECT_EQ(out, Block(i)) << i;
  }
  tier->reset();  // finishes the transfer thread's queued writes first
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
