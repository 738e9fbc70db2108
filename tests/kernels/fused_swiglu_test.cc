// The experts' fused first half on the amx variant (GemmTask::swiglu: the gate and up tiles of
// one item side by side, silu(gate) * up written straight from the accumulators) against the
// unfused GEMM then SiluMul, bit for bit: in emulation on any AVX-512 CPU, and through the
// backend on AMX hardware; and the avx512-bf16 variant's fused kernel through its backend.
#include <cstring>
#include <limits>
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

// A w2 [hidden, inter] weight, bf16, in `layout`.
std::vector<uint8_t> MakeW2(int64_t hidden, int64_t inter, WeightLayout layout, uint32_t seed) {
  const std::vector<float> values = RandomFloats(static_cast<size_t>(hidden * inter), seed, 0.1f);
  std::vector<uint8_t> row(values.size() * 2), stored(static_cast<size_t>(WeightStorageElems(layout, hidden, inter)) * 2);
  ConvertFromF32(values.data(), values.size(), DType::kBF16, row.data());
  PackWeight(layout, row.data(), hidden, inter, 2, stored.data());
  return stored;
}

// The backend's fused MLP against its GroupedGemm, SiluMul, GroupedGemm, bit for bit.
void ExpectUnfusedBits(CpuBackend& b, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                       const std::vector<int64_t>& offsets, int64_t inter, uint32_t seed) {
  const int64_t rows = offsets.back(), k = w13.back().cols, hidden = w2.back().rows;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(std::max<int64_t>(rows, 1) * k), seed, 3.0f);
  std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter)), act(static_cast<size_t>(rows * inter));
  std::vector<float> want(static_cast<size_t>(rows * hidden)), got(want.size(), -1.0f);
  b.GroupedGemm(x.data(), w13, offsets.data(), rows, gate_up.data());
  b.SiluMul(gate_up.data(), rows, inter, act.data());
  b.GroupedGemm(act.data(), w2, offsets.data(), rows, want.data());
  std::vector<float> unused_gate_up(gate_up.size()), unused_act(act.size());
  b.GroupedSwiGluMlp(x.data(), w13, w2, offsets.data(), rows, inter, unused_gate_up.data(), unused_act.data(), got.data());
  for (size_t e = 0; e < got.size(); ++e) {
    ASSERT_EQ(0, std::memcmp(&got[e], &want[e], sizeof(float)))
        << "rows " << rows << ", element " << e << ": fused " << got[e] << ", unfused " << want[e];
  }
}

// Runs every item of `t` (rows padded to AMX tiles first) with `kernel`, as gemm.cc's planner
// cuts it: 32-row chunks, one item per 32 weight rows or per fused 16-column tile.
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

// The fused kernel's 16-lane activation against SiluMulRow, bit for bit, over fresh random values
// and the edges: the clamps of the exponential (|g| near and past 88), results that underflow,
// zeros of both signs, infinities and NaN.
TEST(FusedSwiGluTest, SiluMulRow16GivesSiluMulRowsBits) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "needs AVX-512 (cpuid avx512f/bw/vl/dq)";
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f), unit(-3.0f, 3.0f);
  std::vector<float> g, u;
  const float inf = std::numeric_limits<float>::infinity();
  // The edges first, inside the 16-lane loop (padded to whole vectors), then random values.
  for (float v : {0.0f, -0.0f, 87.3f, -87.3f, 88.3f, -88.3f, 89.0f, -89.0f, 103.9f, -103.9f, 1e-40f, -1e-40f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), 1.0f}) {
    g.push_back(v), u.push_back(1.5f);
  }
  for (int i = 0; i < 4096 + 7; ++i) g.push_back(i % 2 ? wide(gen) : unit(gen)), u.push_back(unit(gen));
  const int64_t n = static_cast<int64_t>(g.size());  // not a multiple of 16: the tail too
  std::vector<float> want(g.size()), got(g.size());
  cpu_fast::SiluMulRow(g.data(), u.data(), n, want.data());
  cpu_fast::SiluMulRow16(g.data(), u.data(), n, got.data());
  for (int64_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4), std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << "g " << g[i] << " u " << u[i] << ": " << want[i] << " against " << got[i] << " (seed " << seed << ")";
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

// With y_packed the fused items write the activations as the down projection's A tiles: exactly
// PadRowsAmx of the unfused fp32 result, padding rows zero (the buffer starts as NaN bits).
TEST(FusedSwiGluTest, EmulatedTilesWriteTheDownProjectionsTiles) {
  if (!DetectCpuFeatures().avx512) GTEST_SKIP() << "the tile layouts need AVX-512 (cpuid avx512f/bw/vl/dq)";
  std::random_device rd;
  uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int64_t inter : {32, 96}) {
    const int64_t k = 100;
    const std::vector<uint8_t> w = MakeW13(inter, k, WeightLayout::kAmxTiles, ++seed);
    const WeightRef ref{w.data(), DType::kBF16, 2 * inter, k, WeightLayout::kAmxTiles};
    for (int64_t m : {1, 16, 17, 33, 70, 130}) {
      SCOPED_TRACE(absl::StrFormat("inter %d m %d", inter, m));
      const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), ++seed, 3.0f);
      std::vector<float> act(static_cast<size_t>(m * inter));
      cpu_fast::GemmTask plain{x.data(), m, ref, act.data(), false};
      plain.swiglu = inter;
      RunItems(plain, cpu_fast::TileAmxSwiGluEmulated);
      const size_t elems = static_cast<size_t>(cpu_fast::PaddedAmxElems(m, inter));
      std::vector<uint16_t> want(elems), got(elems, 0x7fc1);
      cpu_fast::PadRowsAmx(act.data(), m, inter, 0, RoundUp(m, cpu_fast::kAmxRowBlock), want.data());
      cpu_fast::GemmTask tiles = plain;
      tiles.y = nullptr;
      tiles.y_packed = got.data();
      RunItems(tiles, cpu_fast::TileAmxSwiGluEmulated);
      for (size_t e = 0; e < elems; ++e) {
        ASSERT_EQ(want[e], got[e]) << "element " << e << " of the padded tiles (" << RoundUp(m, cpu_fast::kAmxRowBlock)
                                   << " rows): " << got[e] << ", PadRowsAmx " << want[e];
      }
    }
  }
}

// Not fusable: another variant, another layout, an intermediate size that is not whole tiles.
TEST(FusedSwiGluTest, TheBf16VariantsFuseOnTheirOwnLayoutsOnly) {
  const WeightRef w{nullptr, DType::kBF16, 96, 64, WeightLayout::kAmxTiles};
  EXPECT_TRUE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, w, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512Bf16, w, 48));
  EXPECT_TRUE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512Bf16, {nullptr, DType::kBF16, 96, 64, WeightLayout::kTiled8}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512Bf16, {nullptr, DType::kBF16, 40, 64, WeightLayout::kTiled8}, 20))
      << "inter not whole 8-row tiles";
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512Bf16, {nullptr, DType::kF32, 96, 64, WeightLayout::kTiled8}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAvx512, {nullptr, DType::kBF16, 96, 64, WeightLayout::kTiled8}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kBF16, 96, 64, WeightLayout::kTiled8}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kF32, 96, 64, WeightLayout::kAmxTiles}, 48));
  EXPECT_FALSE(cpu_fast::SwiGluFusable(CpuIsa::kAmx, {nullptr, DType::kBF16, 40, 64, WeightLayout::kAmxTiles}, 20));
}

// Through the backend of the amx variant (on AMX hardware, and amx-model on any AVX512-BF16 CPU):
// three experts with random row counts, the fused MLP against GroupedGemm, SiluMul, GroupedGemm
// on the same backend, bit for bit; inter 64 passes the activations as bf16 tiles, inter 48 as
// fp32.
class FusedSwiGluAmxTest : public ::testing::TestWithParam<CpuIsa> {};

INSTANTIATE_TEST_SUITE_P(Units, FusedSwiGluAmxTest, ::testing::Values(CpuIsa::kAmx, CpuIsa::kAmxModel),
                         [](const auto& info) { return std::string(info.param == CpuIsa::kAmx ? "amx" : "amx_model"); });

TEST_P(FusedSwiGluAmxTest, TheBackendFusesWithTheUnfusedBits) {
  std::string missing;
  if (!CpuSupports(DetectCpuFeatures(), GetParam(), &missing)) GTEST_SKIP() << "this CPU lacks " << missing;
  CpuBackend b{CpuBackendOptions{CpuPath::kFast, 2, 0, true, GetParam(), CpuKernelNumerics::kFastest}};
  ASSERT_EQ(b.isa(), GetParam());
  std::random_device rd;
  uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const int64_t inter : {64, 48}) {
    SCOPED_TRACE(absl::StrFormat("inter %d", inter));
    const int64_t k = 96, hidden = 40, experts = 3;
    std::vector<std::vector<uint8_t>> stored;
    std::vector<WeightRef> w13, w2;
    for (int64_t e = 0; e < experts; ++e) {
      stored.push_back(MakeW13(inter, k, b.PreferredWeightLayout(DType::kBF16), ++seed));
      w13.push_back({stored.back().data(), DType::kBF16, 2 * inter, k, b.PreferredWeightLayout(DType::kBF16)});
      stored.push_back(MakeW2(hidden, inter, b.PreferredWeightLayout(DType::kBF16), ++seed));
      w2.push_back({stored.back().data(), DType::kBF16, hidden, inter, b.PreferredWeightLayout(DType::kBF16)});
    }
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<int64_t> offsets = {0};
      for (int64_t e = 0; e < experts; ++e) offsets.push_back(offsets.back() + std::uniform_int_distribution<int64_t>(0, 90)(gen));
      ExpectUnfusedBits(b, w13, w2, offsets, inter, ++seed);
    }
    EXPECT_TRUE(b.FusesGateUpSilu(w13, inter));
    // An EP rank: the experts of other ranks are placeholders (row-major, no data, no rows); its
    // own decide, so every rank fuses, not only the one that holds expert 0.
    std::vector<WeightRef> rank1 = {{nullptr, DType::kBF16, 2 * inter, k}, w13[1], w13[2]};
    std::vector<WeightRef> rank1_w2 = {{nullptr, DType::kBF16, hidden, inter}, w2[1], w2[2]};
    EXPECT_TRUE(b.FusesGateUpSilu(rank1, inter));
    ExpectUnfusedBits(b, rank1, rank1_w2, {0, 0, 37, 70}, inter, ++seed);
    EXPECT_FALSE(b.FusesGateUpSilu(w13, inter + 1)) << "inter not whole tiles";
  }
}

// The avx512-bf16 backend's fused MLP (its gate/up and SiLU kernel on 8-row tiles, the
// activations passed to w2 as its packed bf16 rows) against GroupedGemm, SiluMul, GroupedGemm on
// the same backend, bit for bit: random row counts (empty experts, rows not whole 12-row blocks,
// more than an item's 48), inter of odd 8-row tile counts, an EP rank's placeholders, and an
// inter the kernel does not take (20: the unfused path).
TEST(FusedSwiGluTest, TheAvx512Bf16BackendFusesWithTheUnfusedBits) {
  if (!DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "needs AVX512-BF16 (cpuid avx512_bf16)";
  CpuBackend b{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAvx512Bf16, CpuKernelNumerics::kFastest}};
  ASSERT_EQ(b.isa(), CpuIsa::kAvx512Bf16);
  std::random_device rd;
  uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const int64_t inter : {64, 40, 24, 20}) {
    SCOPED_TRACE(absl::StrFormat("inter %d", inter));
    const int64_t k = 100, hidden = 40, experts = 3;
    const WeightLayout layout = b.PreferredWeightLayout(DType::kBF16);
    std::vector<std::vector<uint8_t>> stored;
    std::vector<WeightRef> w13, w2;
    for (int64_t e = 0; e < experts; ++e) {
      stored.push_back(MakeW13(inter, k, layout, ++seed));
      w13.push_back({stored.back().data(), DType::kBF16, 2 * inter, k, layout});
      stored.push_back(MakeW2(hidden, inter, layout, ++seed));
      w2.push_back({stored.back().data(), DType::kBF16, hidden, inter, layout});
    }
    std::uniform_int_distribution<int64_t> rows_of(0, 90);
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<int64_t> offsets = {0};
      for (int64_t e = 0; e < experts; ++e) offsets.push_back(offsets.back() + rows_of(gen));
      ExpectUnfusedBits(b, w13, w2, offsets, inter, ++seed);
    }
    EXPECT_EQ(b.FusesGateUpSilu(w13, inter), inter % 8 == 0);
    std::vector<WeightRef> rank1 = {{nullptr, DType::kBF16, 2 * inter, k}, w13[1], w13[2]};
    std::vector<WeightRef> rank1_w2 = {{nullptr, DType::kBF16, hidden, inter}, w2[1], w2[2]};
    ExpectUnfusedBits(b, rank1, rank1_w2, {0, 0, 37, 70}, inter, ++seed);
    ExpectUnfusedBits(b, w13, w2, {0, 3, 3, 9}, inter, ++seed);  // a decode step's few rows: unfused
  }
}

}  // namespace
}  // namespace moeserve
