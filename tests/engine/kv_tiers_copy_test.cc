// The KV tiers' copies byte for byte, below the engine (kv_tiers_test.cc runs them through it):
// on the CPU's deferred-copy engine, and through pinned memory and the copy stream on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#endif

#include "tests/engine/kv_tiers_fixture.h"

namespace moeserve::kv_tiers_test {
namespace {

// Byte for byte, below the engine: random block contents go down to DDR by eviction and come
// back by promotion into other blocks, and a sequence's blocks go out to swap slots and back,
// with the device blocks overwritten in between; a promotion's own evictions are copied down
// before the promoted block is copied in, and a block whose promotion failed is never demoted.
// On `backend` (a deferred-copy CPU backend here; the GPU's pinned memory and copy stream when
// one is present).
void TierRoundTripIsExact(Backend* backend, uint32_t seed) {
  const ModelConfig c = *PresetConfig("tiny");
  const int64_t n = 12;
  auto kv = KvStorage::Create(backend, KvLayoutFor(c, n, 16, DType::kBF16));
  ASSERT_TRUE(kv.ok()) << kv.status();
  const size_t bytes = kv->layout().BlockBytes();
  BlockPool pool(n);
  KvTierConfig config;
  config.host_bytes = 9 * bytes;  // six cached blocks and three swap slots
  config.preemption = PreemptionMode::kSwap;
  auto tiers = KvTiers::Create(config, 7, &pool, KvTierDevices::Single(&*kv, backend));
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  std::mt19937 gen(seed);
  auto random_block = [&] {
    std::vector<uint8_t> v(bytes);
    for (auto& b : v) b = static_cast<uint8_t>(gen());
    return v;
  };
  auto read = [&](int32_t block) {
    std::vector<uint8_t> v(bytes);
    EXPECT_TRUE(backend->Synchronize().ok());
    EXPECT_TRUE(backend->CopyToHost(v.data(), static_cast<uint8_t*>(kv->data()) + block * bytes, bytes).ok());
    return v;
  };
  auto write = [&](int32_t block, const std::vector<uint8_t>& v) {
    ASSERT_TRUE(backend->CopyToDevice(static_cast<uint8_t*>(kv->data()) + block * bytes, v.data(), bytes).ok());
  };
  auto run = [&](std::vector<KvTransfer> transfers) { return (*tiers)->Execute(transfers); };
  // Six cached blocks with known contents, pushed out of the device by six fresh allocations.
  std::vector<std::vector<uint8_t>> contents;
  std::vector<BlockHash> hashes;
  auto first = pool.Allocate(6);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 6; ++i) {
    contents.push_back(random_block());
    hashes.push_back(BlockHash{gen() | 1ull, static_cast<uint64_t>(i)});
    write((*first)[i], contents[i]);
    pool.Register((*first)[i], hashes[i]);
  }
  pool.Release(*first);
  std::vector<BlockEviction> evicted;
  auto fillers = pool.Allocate(n, 0, &evicted);  // every block: the six cached ones are evicted
  ASSERT_TRUE(fillers.ok());
  ASSERT_EQ(evicted.size(), 6u);
  std::vector<KvTransfer> demotions;
  for (const BlockEviction& e : evicted) demotions.push_back(KvTransfer::Demote(e));
  for (const KvTransferOutcome& o : run(demotions)) EXPECT_TRUE(o.ok);
  for (int32_t b : *fillers) write(b, random_block());  // the device copies are gone
  // A sequence of three blocks swapped out, its blocks overwritten, swapped back into others.
  KvTransfer out;
  out.kind = KvTransfer::Kind::kSwapOut;
  out.blocks = {(*fillers)[0], (*fillers)[1], (*fillers)[2]};
  std::vector<std::vector<uint8_t>> seq_contents;
  for (int32_t b : out.blocks) seq_contents.push_back(read(b));
  const auto swapped = run({out});
  ASSERT_TRUE(swapped[0].ok);
  ASSERT_EQ(swapped[0].slots.size(), 3u);
  for (int32_t b : out.blocks) write(b, random_block());
  KvTransfer in;
  in.kind = KvTransfer::Kind::kSwapIn;
  in.blocks = {(*fillers)[5], (*fillers)[4], (*fillers)[3]};
  in.slots = swapped[0].slots;
  ASSERT_TRUE(run({in})[0].ok);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(read(in.blocks[i]) == seq_contents[i]) << "swapped block " << i;
  EXPECT_EQ((*tiers)->stats().host.swap_blocks, 0);
  pool.Release(*fillers);
  // Every evicted block comes back from DDR into some device block, byte for byte.
  std::vector<int32_t> promoted;
  for (int i = 0; i < 6; ++i) {
    auto got = pool.Allocate(1);  // free blocks: nothing is evicted
    ASSERT_TRUE(got.ok());
    KvTransfer p;
    p.kind = KvTransfer::Kind::kPromote;
    p.hash = hashes[i];
    p.blocks = *got;
    const auto o = run({p});
    ASSERT_TRUE(o[0].ok) << "block " << i;
    EXPECT_EQ(o[0].tier, KvTier::kHost);
    EXPECT_TRUE(read(p.blocks[0]) == contents[i]) << "promoted block " << i << " differs (seed " << seed << ")";
    promoted.push_back(p.blocks[0]);
  }
  // A promotion into a block that its own allocation evicted: the evicted contents reach DDR
  // before the promoted ones overwrite the block.
  const BlockHash evicted_hash{gen() | 1ull, 100};
  const std::vector<uint8_t> evicted_contents = read(promoted[0]);
  pool.Register(promoted[0], evicted_hash);
  KvTransfer back;  // hashes[1]'s block goes down first, so there is something to promote
  back.kind = KvTransfer::Kind::kDemote;
  back.blocks = {promoted[1]};
  back.hash = hashes[1];
  KvTransfer p;
  p.kind = KvTransfer::Kind::kPromote;
  p.hash = hashes[1];
  p.blocks = {promoted[0]};
  p.evicted = {BlockEviction{promoted[0], evicted_hash, 0}};
  const auto o = run({back, p});
  ASSERT_TRUE(o[1].ok);
  EXPECT_TRUE(read(promoted[0]) == contents[1]);
  KvTransfer check;
  check.kind = KvTransfer::Kind::kPromote;
  check.hash = evicted_hash;
  check.blocks = {promoted[2]};
  ASSERT_TRUE(run({check})[0].ok);
  EXPECT_TRUE(read(promoted[2]) == evicted_contents) << "the eviction was overwritten before it was copied down";
  // A promotion of a block no tier holds fails, and the block is not demoted after it.
  const BlockHash nowhere{gen() | 1ull, 200};
  KvTransfer missing;
  missing.kind = KvTransfer::Kind::kPromote;
  missing.hash = nowhere;
  missing.blocks = {promoted[3]};
  KvTransfer spoiled = KvTransfer::Demote(BlockEviction{promoted[3], nowhere, 0});
  const auto failed = run({missing, spoiled});
  EXPECT_FALSE(failed[0].ok);
  EXPECT_FALSE((*tiers)->Find(nowhere).has_value()) << "a block whose promotion failed was kept below";
  const KvTierStats st = (*tiers)->stats();
  EXPECT_EQ(st.demoted, 8);  // six evictions, hashes[1] again, evicted_hash
  EXPECT_EQ(st.promoted_ddr, 8);
  EXPECT_EQ(st.promote_failures, 1);
  EXPECT_EQ(st.swapped_out, 1);
  EXPECT_EQ(st.swapped_in, 1);
  EXPECT_EQ(st.host.swap_blocks, 0);
}

TEST(KvTiersCopyTest, RoundTripIsExactOnTheDeferredCopyEngine) {
  CpuBackend backend(BackendOptions(true));
  TierRoundTripIsExact(&backend, std::random_device{}());
}

#if MOESERVE_HAVE_CUDA
TEST(KvTiersCopyTest, RoundTripIsExactThroughPinnedMemoryOnTheGpu) {
  if (cuda::ListDevices().empty()) GTEST_SKIP() << "no GPU visible";
  auto gpu = CudaBackend::Create({});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  TierRoundTripIsExact(gpu->get(), std::random_device{}());
}
#endif

}  // namespace
}  // namespace moeserve::kv_tiers_test
