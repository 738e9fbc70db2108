// The experts' fused first half on the amx variant (GemmTask::swiglu: the gate and up tiles of
// one item side by side, silu(gate) * up written straight from the accumulators) against the
// unfused GEMM then SiluMul, bit for bit: in emulation on any AVX-512 CPU, and through the
// backend on AMX hardware.
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/weight_layout.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::RandomFloats;

// A [gate; up] weight of 2 * inter rows x k, bf16, in `layout`.
std::vector<uint8_t> MakeW13(int64_t inter, int64_t k, WeightLayout layout, uint32_t seed) {
  const std::vector<float> values = RandomFloats(static_cast<size_t>(2 * inter * k), seed, 0.1f);
  std::vector<uint8_t> row(values.size() * 2), stored(static_cast<size_t>(WeightStorageElems(layout, 2 * inter, k)) * 2);
  ConvertFromF32(values.data(), values.size(), DType::kBF16, row.data());
  PackWeight(layout, row.data(), 2 * inter, k, 2, stored.data());
  return stored;
}

// Runs every item of `t` (rows padded to AMX tiles first) with `kernel`, as gemm.cc's planner
// cuts it: 64-row chunks, one item per 32 weight rows or per fused 16-column tile.
void RunItems(const cpu_fast::GemmTask& t, void (*kernel)(const cpu_fast::GemmTask&, const uint16_t*,
                                                           const cpu_fast::GemmItem&, cpu_fast::GemmScratch*)) {
  const int64_t k = t.w.cols;
  std::vector<uint16_t> xp(static_cast<size_t>(cpu_fast::PaddedAmxElems(t.m, k)), 0xffff);
  cpu_fast::PadRowsAmx(t.x, t.m, k, 0, RoundUp(t.m, cpu_fast::kAmxRowBlock), xp.data());
  const int64_t tiles = t.swiglu > 0 ? t.swiglu / cpu_fast::kSwiGluItemColumns
                                     : (t.w.rows + cpu_fast::kAmxItemRows - 1) / cpu_fast::kAmxItemRows;
  const int64_t chunk = t.m <= cpu_fast::kDirectMaxRows ? t.m : cpu_fast::kAmxRowChunk;
  cpu_fast::GemmScratch scratch;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    for (int64_t m0 = 0; m0 < t.m; m0 += chunk) kernel(t, xp.data(), {0, tile, m0, std::min(t.m, m0 + chunk)}, &scratch);
  }
}

TEST(FusedSwiGluTest, EmulatedTilesGiveTheGemmThenSiluMulBits) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "the tile layouts need AVX-512 (cpuid avx512f/bw/vl/dq)";
  std::random_device rd;
  uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int64_t inter : {16, 48, 96}) {
    for (int64_t k : {32, 100}) {
      const std::vector<uint8_t> w = MakeW13(inter, k, WeightLayout::kAmxTiles, ++seed);
      const WeightRef ref{w.data(), DType::kBF16, 2 * inter, k, WeightLayout::kAmxTiles};
      ASSERT_TRUE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, ref, inter));
      for (int64_t m : {1, 5, 17, 33, 70}) {
        SCOPED_TRACE(absl::StrFormat("inter %d k %d m %d", inter, k, m));
        const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), ++seed, 3.0f);
        std::vector<float> gate_up(static_cast<size_t>(m * 2 * inter)), want(static_cast<size_t>(m * inter));
        RunItems({x.data(), m, ref, gate_up.data(), false}, cpu_fast::TileAmxEmulated);
        for (int64_t r = 0; r < m; ++r) {
          cpu_fast::SiluMulRow(gate_up.data() + r * 2 * inter, gate_up.data() + r * 2 * inter + inter, inter,
                               want.data() + r * inter);
        }
        std::vector<float> got(static_cast<size_t>(m * inter), -1.0f);
        cpu_fast::GemmTask fused{x.data(), m, ref, got.data(), false};
        fused.swiglu = inter;
        RunItems(fused, cpu_fast::TileAmxSwiGluEmulated);
        for (size_t e = 0; e < got.size(); ++e) {
          ASSERT_EQ(0, std::memcmp(&got[e], &want[e], sizeof(float)))
              << "row " << e / inter << " column " << e % inter << ": fused " << got[e] << ", unfused " << want[e];
        }
      }
    }
  }
}

// Not fusable: another variant, another layout, an intermediate size that is not whole tiles.
TEST(FusedSwiGluTest, OnlyTheAmxVariantOnItsTilesFuses) {
  const WeightRef w{nullptr, DType::kBF16, 96, 64, WeightLayout::kAmxTiles};
  EXPECT_TRUE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, w, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512Bf16, w, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kBF16, 96, 64, WeightLayout::kTiled8}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kF32, 96, 64, WeightLayout::kAmxTiles}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kBF16, 40, 64, WeightLayout::kAmxTiles}, 20));
}

// Through the backend on AMX hardware: three experts with random row counts, the fused call
// against GroupedGemm then SiluMul on the same backend, bit for bit.
TEST(FusedSwiGluTest, TheAmxBackendFusesWithTheUnfusedBits) {
  const CpuFeatures f = DetectCpuFeatures();
  if (!f.amx_bf16) GTEST_SKIP() << "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " << f.amx_detail;
  CpuBackend b{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAmx, CpuKernelNumerics::kFastest}};
  ASSERT_EQ(b.isa(), CpuIsa::kAmx);
  std::random_device rd;
  uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t inter = 64, k = 96, experts = 3;
  std::vector<std::vector<uint8_t>> stored;
  std::vector<WeightRef> w13;
  for (int64_t e = 0; e < experts; ++e) {
    stored.push_back(MakeW13(inter, k, b.PreferredWeightLayout(DType::kBF16), ++seed));
    w13.push_back({stored.back().data(), DType::kBF16, 2 * inter, k, b.PreferredWeightLayout(DType::kBF16)});
  }
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int64_t> offsets = {0};
    for (int64_t e = 0; e < experts; ++e) offsets.push_back(offsets.back() + std::uniform_int_distribution<int64_t>(0, 90)(gen));
    const int64_t rows = offsets.back();
    const std::vector<float> x = RandomFloats(static_cast<size_t>(std::max<int64_t>(rows, 1) * k), ++seed, 3.0f);
    std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter)), want(static_cast<size_t>(rows * inter));
    std::vector<float> got(want.size(), -1.0f), unused(gate_up.size());
    b.GroupedGemm(x.data(), w13, offsets.data(), rows, gate_up.data());
    b.SiluMul(gate_up.data(), rows, inter, want.data());
    b.GroupedGemmSiluMul(x.data(), w13, offsets.data(), rows, inter, unused.data(), got.data());
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "rows " << rows;
  }
  EXPECT_TRUE(b.FusesGateUpSilu(w13, inter));
  // An EP rank: the experts of other ranks are placeholders (row-major, no data, no rows); its
  // own decide, so every rank fuses, not only the one that holds expert 0.
  std::vector<WeightRef> rank1 = {{nullptr, DType::kBF16, 2 * inter, k}, w13[1], w13[2]};
  EXPECT_TRUE(b.FusesGateUpSilu(rank1, inter));
  const std::vector<int64_t> offsets = {0, 0, 37, 70};
  const std::vector<float> x = RandomFloats(static_cast<size_t>(70 * k), ++seed, 3.0f);
  std::vector<float> gate_up(static_cast<size_t>(70 * 2 * inter)), want(static_cast<size_t>(70 * inter));
  std::vector<float> got(want.size(), -1.0f), unused(gate_up.size());
  b.GroupedGemm(x.data(), rank1, offsets.data(), 70, gate_up.data());
  b.SiluMul(gate_up.data(), 70, inter, want.data());
  b.GroupedGemmSiluMul(x.data(), rank1, offsets.data(), 70, inter, unused.data(), got.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "an EP rank's experts";
  EXPECT_FALSE(b.FusesGateUpSilu(w13, inter + 1)) << "inter not whole tiles";
}

}  // namespace
}  // namespace moeserve
