// kvcache/KvTiers on its own, below any engine: the transfer lists the scheduler plans, run on
// blocks whose bytes lie in two pieces on two devices (as a two-stage pipeline keeps them).
// The oracle is the blocks' own random bytes: a block demoted and promoted, pushed on to flash
// and read back, or swapped out and in, comes back byte for byte into whatever block receives
// it; a list runs in its order (a block evicted and reused in one list keeps both contents
// apart); a failed promotion's block is never demoted afterwards.
#include "kvcache/kv_tiers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "kernels/cpu/cpu_backend.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlocks = 12;

KvLayout Layout() {
  KvLayout l;
  l.num_blocks = kBlocks;
  l.num_layers = 2;
  l.block_size = 4;
  l.kv_heads = 2;
  l.head_dim = 8;
  l.dtype = DType::kBF16;
  return l;
}

BlockHash HashOf(uint64_t i) { return BlockHash{i * 0x9e3779b97f4a7c15ull + 7, ~i}; }

// A pool block's bytes split in two pieces on two devices: layer 0 on `a`, layer 1 on `b`.
class TwoPieceTiers : public ::testing::Test {
 protected:
  void SetUp() override {
    piece_ = static_cast<size_t>(Layout().BlockBytes() / 2);
    arena_a_ = *a_.Allocate(piece_ * kBlocks);
    arena_b_ = *b_.Allocate(piece_ * kBlocks);
    dir_ = fs::temp_directory_path() / ("moeserve_kv_transfers_" + std::to_string(getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
  }
  void TearDown() override {
    tiers_.reset();
    fs::remove_all(dir_);
  }

  // DDR for `host_blocks` blocks, over a flash directory when `flash`.
  void Open(int64_t host_blocks, bool flash) {
    KvTierConfig c;
    c.host_bytes = static_cast<uint64_t>(host_blocks) * Layout().BlockBytes();
    if (flash) c.flash_dir = dir_.string();
    c.async_flash = false;  // flash writes in list order: deterministic for the assertions
    KvTierDevices d;
    d.layout = Layout();
    uint8_t* pa = static_cast<uint8_t*>(arena_a_.data());
    uint8_t* pb = static_cast<uint8_t*>(arena_b_.data());
    const size_t piece = piece_;
    d.parts = [this, pa, pb, piece](int32_t block, std::vector<KvBlockPart>* parts) {
      parts->assign({KvBlockPart{&a_, pa + block * piece, piece}, KvBlockPart{&b_, pb + block * piece, piece}});
    };
    d.backends = {&a_, &b_};
    auto t = KvTiers::Create(c, /*fingerprint=*/42, &pool_, std::move(d));
    ASSERT_TRUE(t.ok()) << t.status();
    tiers_ = *std::move(t);
  }

  // Block `block`'s two pieces, as one byte string.
  std::vector<uint8_t> Read(int32_t block) const {
    std::vector<uint8_t> out(2 * piece_);
    std::memcpy(out.data(), static_cast<const uint8_t*>(arena_a_.data()) + block * piece_, piece_);
    std::memcpy(out.data() + piece_, static_cast<const uint8_t*>(arena_b_.data()) + block * piece_, piece_);
    return out;
  }
  // Fresh random bytes into block `block`; returns them.
  std::vector<uint8_t> Fill(int32_t block) {
    std::vector<uint8_t> v(2 * piece_);
    for (auto& x : v) x = static_cast<uint8_t>(gen_());
    std::memcpy(static_cast<uint8_t*>(arena_a_.data()) + block * piece_, v.data(), piece_);
    std::memcpy(static_cast<uint8_t*>(arena_b_.data()) + block * piece_, v.data() + piece_, piece_);
    return v;
  }
  std::vector<KvTransferOutcome> Run(std::vector<KvTransfer> list) {
    auto out = tiers_->Execute(list);
    a_.Synchronize().IgnoreError();
    b_.Synchronize().IgnoreError();
    return out;
  }
  static KvTransfer Promote(int32_t block, const BlockHash& h, KvTier planned = KvTier::kHost) {
    KvTransfer t;
    t.kind = KvTransfer::Kind::kPromote;
    t.blocks = {block};
    t.hash = h;
    t.planned = planned;
    return t;
  }

  CpuBackend a_, b_;
  DeviceBuffer arena_a_, arena_b_;
  size_t piece_ = 0;
  BlockPool pool_{kBlocks};
  fs::path dir_;
  std::unique_ptr<KvTiers> tiers_;
  std::mt19937_64 gen_{std::random_device{}()};
};

TEST_F(TwoPieceTiers, DemotedBlocksComeBackIntoOtherBlocksByteForByte) {
  Open(/*host_blocks=*/8, /*flash=*/false);
  std::vector<std::vector<uint8_t>> want;
  std::vector<KvTransfer> down;
  for (int32_t b = 0; b < 4; ++b) {
    want.push_back(Fill(b));
    down.push_back(KvTransfer::Demote(BlockEviction{b, HashOf(b), 0}));
  }
  for (const auto& o : Run(down)) EXPECT_TRUE(o.ok);
  for (int32_t b = 0; b < 4; ++b) {
    ASSERT_EQ(tiers_->Find(HashOf(b)), KvTier::kHost) << b;
    Fill(b);  // the device copy is gone
  }
  std::vector<KvTransfer> up;
  for (int32_t b = 0; b < 4; ++b) up.push_back(Promote(8 + (b + 1) % 4, HashOf(b)));
  const auto outcomes = Run(up);
  for (int32_t b = 0; b < 4; ++b) {
    EXPECT_TRUE(outcomes[b].ok) << b;
    EXPECT_EQ(outcomes[b].tier, KvTier::kHost) << b;
    EXPECT_TRUE(Read(8 + (b + 1) % 4) == want[b]) << "block " << b << " came back different";
  }
  EXPECT_EQ(tiers_->stats().promoted_ddr, 4);
}

TEST_F(TwoPieceTiers, BlocksPushedOnToFlashComeBackFromIt) {
  Open(/*host_blocks=*/2, /*flash=*/true);
  std::vector<std::vector<uint8_t>> want;
  for (int32_t b = 0; b < 6; ++b) {
    want.push_back(Fill(b));
    for (const auto& o : Run({KvTransfer::Demote(BlockEviction{b, HashOf(b), 0})})) EXPECT_TRUE(o.ok);
  }
  tiers_->Flush();
  int64_t on_flash = 0;
  for (int32_t b = 0; b < 6; ++b) {
    const auto tier = tiers_->Find(HashOf(b));
    ASSERT_TRUE(tier.has_value()) << b;
    on_flash += *tier == KvTier::kFlash;
  }
  EXPECT_GE(on_flash, 4) << "DDR holds 2 blocks: the older ones went on to flash";
  for (int32_t b = 0; b < 6; ++b) {
    const KvTier planned = *tiers_->Find(HashOf(b));
    const auto o = Run({Promote(6 + b, HashOf(b), planned)});
    ASSERT_TRUE(o[0].ok) << b;
    EXPECT_TRUE(Read(6 + b) == want[b]) << "block " << b << " from " << KvTierName(planned);
  }
}

TEST_F(TwoPieceTiers, SwappedOutBlocksComeBackAndTheirSlotsAreFreed) {
  Open(/*host_blocks=*/6, /*flash=*/false);
  std::vector<std::vector<uint8_t>> want;
  for (int32_t b = 1; b <= 3; ++b) want.push_back(Fill(b));
  KvTransfer out;
  out.kind = KvTransfer::Kind::kSwapOut;
  out.blocks = {1, 2, 3};
  const auto o = Run({out});
  ASSERT_TRUE(o[0].ok);
  ASSERT_EQ(o[0].slots.size(), 3u);
  for (int32_t b = 1; b <= 3; ++b) Fill(b);
  KvTransfer in;
  in.kind = KvTransfer::Kind::kSwapIn;
  in.blocks = {7, 5, 9};
  in.slots = o[0].slots;
  ASSERT_TRUE(Run({in})[0].ok);
  EXPECT_TRUE(Read(7) == want[0]);
  EXPECT_TRUE(Read(5) == want[1]);
  EXPECT_TRUE(Read(9) == want[2]);
  EXPECT_EQ(tiers_->stats().swapped_in, 1);
  // The slots are free again: a swap of the whole DDR fits.
  KvTransfer all;
  all.kind = KvTransfer::Kind::kSwapOut;
  all.blocks = {0, 1, 2, 3, 4, 5};
  EXPECT_TRUE(Run({all})[0].ok) << "the swap slots were not returned";
}

// A list runs in order: block 2's cached contents go down before another block's are promoted
// into it, and both are then found where they belong.
TEST_F(TwoPieceTiers, AListRunsInItsOrder) {
  Open(/*host_blocks=*/8, /*flash=*/false);
  const auto five = Fill(5);
  ASSERT_TRUE(Run({KvTransfer::Demote(BlockEviction{5, HashOf(50), 0})})[0].ok);
  const auto two = Fill(2);
  const auto o = Run({KvTransfer::Demote(BlockEviction{2, HashOf(20), 0}), Promote(2, HashOf(50))});
  ASSERT_TRUE(o[0].ok && o[1].ok);
  EXPECT_TRUE(Read(2) == five) << "block 2 holds the promoted contents";
  ASSERT_TRUE(Run({Promote(11, HashOf(20))})[0].ok);
  EXPECT_TRUE(Read(11) == two) << "block 2's own contents went down before it was reused";
}

// A promotion that finds nothing fails, and its block (whose contents are now undefined) is
// not demoted later in the same list: nothing is cached under the second hash.
TEST_F(TwoPieceTiers, AFailedPromotionsBlockIsNeverDemoted) {
  Open(/*host_blocks=*/8, /*flash=*/false);
  Fill(3);
  const auto o = Run({Promote(3, HashOf(99)), KvTransfer::Demote(BlockEviction{3, HashOf(30), 0})});
  EXPECT_FALSE(o[0].ok);
  EXPECT_FALSE(tiers_->Find(HashOf(30)).has_value()) << "a spoiled block reached the DDR tier";
  EXPECT_EQ(tiers_->stats().promote_failures, 1);
}

}  // namespace
}  // namespace moeserve
