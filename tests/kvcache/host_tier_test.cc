// Host DDR tier over the flash tier: blocks pushed out of DDR go to flash and come back exact;
// recency decides what stays in DDR; a damaged flash record is never served.
#include "kvcache/host_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

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

std::string FreshDir() {
  const fs::path p = fs::temp_directory_path() /
                     ("moeserve_host_tier_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p.string();
}

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
  EXPECT_EQ((*tier)->stats().demoted_to_flash, n - 3);
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
  fs::remove_all(dir);
}

TEST(HostTierTest, ADamagedFlashRecordIsNotServed) {
  const std::string dir = FreshDir();
  auto flash = FlashStore::Open({dir, 1 << 20, 42});
  ASSERT_TRUE(flash.ok());
  auto tier = HostKvTier::Create(Options(0), flash->get());  // no DDR: straight to flash
  ASSERT_TRUE(tier.ok());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE((*tier)->Put(HashOf(i), Block(i).data()).ok());
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
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
