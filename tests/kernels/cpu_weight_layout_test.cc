// The weight layouts the CPU fast path uploads (kernels/weight_layout.h): the tiled and AMX-tile
// layouts round-trip and index like row-major, AMX tiles hold VNNI B tiles in K order, and tiled
// weights give the row-major results bit for bit.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/weight_layout.h"
#include "tests/kernels/cpu_ops_fixture.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using cpu_ops_test::CpuOpsTest;
using cpu_ops_test::HostWeight;
using cpu_ops_test::MakeWeight;
using testing::AllClose;
using testing::RandomFloats;

// The same weight in the tiled layout the fast path uploads (kernels/weight_layout.h).
struct TiledWeight {
  std::vector<uint8_t> bytes;
  WeightRef ref;
};
TiledWeight Tiled(const HostWeight& w, WeightLayout layout = WeightLayout::kTiled8) {
  TiledWeight t;
  const size_t eb = DTypeSize(w.ref.dtype);
  t.bytes.resize(static_cast<size_t>(WeightStorageElems(layout, w.ref.rows, w.ref.cols)) * eb);
  PackWeight(layout, w.bytes.data(), w.ref.rows, w.ref.cols, eb, t.bytes.data());
  t.ref = w.ref;
  t.ref.data = t.bytes.data();
  t.ref.layout = layout;
  return t;
}

TEST_F(CpuOpsTest, WeightLayoutsRoundTripAndIndexAlike) {
  for (WeightLayout layout : {WeightLayout::kTiled8, WeightLayout::kAmxTiles}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 9}, {8, 8}, {17, 30}, {33, 70}, {45, 71}, {64, 512}}) {
      // f32 and bf16: the packers copy 4- and 2-byte elements by separate paths.
      for (DType dt : {DType::kF32, DType::kBF16}) {
        HostWeight w = MakeWeight(rows, cols, dt, static_cast<uint32_t>(rows * 131 + cols));
        const size_t eb = DTypeSize(dt);
        std::vector<uint8_t> packed(static_cast<size_t>(WeightStorageElems(layout, rows, cols)) * eb, 0xff);
        PackWeight(layout, w.bytes.data(), rows, cols, eb, packed.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_EQ(std::memcmp(&packed[WeightIndex(layout, rows, cols, r, c) * eb], &w.bytes[(r * cols + c) * eb], eb), 0)
                << WeightLayoutName(layout) << " " << DTypeShortName(dt) << " " << r << "," << c;
          }
        }
        std::vector<uint8_t> back(w.bytes.size());
        UnpackWeight(layout, packed.data(), rows, cols, eb, back.data());
        EXPECT_EQ(back, w.bytes) << WeightLayoutName(layout) << " " << DTypeShortName(dt) << " " << rows << "x" << cols;
      }
    }
  }
}

// kAmxTiles is the B-tile order tdpbf16ps reads (Intel SDM): for group g, K step s and half h,
// tile row p holds, for each of the 16 weight rows n, the pair (w[32g + 16h + n][32s + 2p],
// w[...][32s + 2p + 1]); tiles follow each other 1 KiB apart, and the padding is zero.
TEST_F(CpuOpsTest, AmxTilesHoldVnniBTilesInKOrder) {
  const int64_t rows = 45, cols = 71, groups = 2, steps = 3;
  HostWeight w = MakeWeight(rows, cols, DType::kBF16, 77);
  std::vector<uint16_t> packed(static_cast<size_t>(WeightStorageElems(WeightLayout::kAmxTiles, rows, cols)), 0xffff);
  ASSERT_EQ(packed.size(), static_cast<size_t>(groups * steps * 2 * 512));
  PackWeight(WeightLayout::kAmxTiles, w.bytes.data(), rows, cols, 2, packed.data());
  const uint16_t* lin = reinterpret_cast<const uint16_t*>(w.bytes.data());
  size_t at = 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t p = 0; p < 16; ++p) {
          for (int64_t n = 0; n < 16; ++n) {
            for (int64_t e = 0; e < 2; ++e, ++at) {
              const int64_t r = 32 * g + 16 * h + n, c = 32 * s + 2 * p + e;
              const uint16_t want = r < rows && c < cols ? lin[r * cols + c] : 0;
              ASSERT_EQ(packed[at], want) << "group " << g << " step " << s << " half " << h << " pair " << p << " row " << n;
            }
          }
        }
      }
    }
  }
}

// The tiled layout changes where the weights are, not the arithmetic: every shape, dtype and
// batch size (both GEMM paths: direct to 16 rows, widened above) gives the row-major result
// bit for bit, and the reference's within tolerance. Embedding reads tiled tables (and AMX tiles) too.
TEST_F(CpuOpsTest, TiledWeightsGiveTheRowMajorResultBitForBit) {
  uint32_t seed = 300;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {9, 7}, {13, 100}, {64, 64}, {515, 300}}) {
      HostWeight w = MakeWeight(n, k, dt, ++seed);
      TiledWeight t = Tiled(w);
      for (int64_t m : {1, 2, 3, 4, 5, 16, 17, 40}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrFormat("%s n=%d k=%d m=%d accumulate=%d", DTypeShortName(dt), n, k, m, accumulate));
          auto x = RandomFloats(m * k, ++seed);
          auto init = RandomFloats(m * n, ++seed);
          std::vector<float> y_rm = init, y_tiled = init, y_ref = init;
          fast_.Gemm(x.data(), m, w.ref, y_rm.data(), accumulate);
          fast_.Gemm(x.data(), m, t.ref, y_tiled.data(), accumulate);
          ref_.Gemm(x.data(), m, t.ref, y_ref.data(), accumulate);
          ASSERT_EQ(std::memcmp(y_rm.data(), y_tiled.data(), y_rm.size() * sizeof(float)), 0);
          EXPECT_TRUE(AllClose(y_tiled, y_ref, 1e-5, 1e-4));
        }
      }
      std::vector<int32_t> ids = {0, static_cast<int32_t>(n - 1), static_cast<int32_t>(n / 2)};
      std::vector<float> e_rm(ids.size() * k), e_tiled(ids.size() * k), e_ref(ids.size() * k);
      fast_.Embedding(ids.data(), static_cast<int64_t>(ids.size()), w.ref, e_rm.data());
      fast_.Embedding(ids.data(), static_cast<int64_t>(ids.size()), t.ref, e_tiled.data());
      ref_.Embedding(ids.data(), static_cast<int64_t>(ids.size()), t.ref, e_ref.data());
      EXPECT_EQ(e_rm, e_tiled);
      EXPECT_EQ(e_ref, e_tiled);
      // A table stored as AMX tiles (the amx variant's bf16 layout) reads its rows alike.
      const TiledWeight amx = Tiled(w, WeightLayout::kAmxTiles);
      std::vector<float> e_amx(ids.size() * k), e_amx_ref(ids.size() * k);
      fast_.Embedding(ids.data(), static_cast<int64_t>(ids.size()), amx.ref, e_amx.data());
      ref_.Embedding(ids.data(), static_cast<int64_t>(ids.size()), amx.ref, e_amx_ref.data());
      EXPECT_EQ(e_rm, e_amx);
      EXPECT_EQ(e_rm, e_amx_ref);
    }
  }
}

// Batch invariance: a row's result must not depend on how many other rows share the GEMM, so
// that a request's greedy tokens do not depend on its batch mates. Both layouts; m = 77 runs
// the widened path, the parts both paths and every kernel shape.
TEST_F(CpuOpsTest, GemmRowsAreBatchInvariant) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {515, 300}, {1024, 512}, {96, 2048}}) {
      const HostWeight rm = MakeWeight(n, k, dt, 5);
      const TiledWeight tiled = Tiled(rm);
      for (const WeightRef& w : {rm.ref, tiled.ref}) {
        const int64_t m = 77;
        auto x = RandomFloats(m * k, 6);
        std::vector<float> all(m * n);
        fast_.Gemm(x.data(), m, w, all.data(), false);
        for (int64_t rows : {1, 2, 3, 4, 8, 9, 16, 17, 33}) {
          std::vector<float> part(rows * n);
          fast_.Gemm(x.data() + 11 * k, rows, w, part.data(), false);
          for (int64_t i = 0; i < rows * n; ++i) {
            ASSERT_EQ(part[i], all[11 * n + i]) << DTypeShortName(dt) << " n=" << n << " k=" << k << " rows=" << rows
                                                << " tiled=" << (w.layout == WeightLayout::kTiled8) << " element " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
