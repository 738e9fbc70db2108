// The two operand orders of the amx attention's scores, on AMX hardware and on the software model
// of the tiles: keys packed as B tiles (ScoresAmx, a prefill tile's rows) against keys read in
// place as A tiles (ScoresAmxKeysAsA, a decode token's), bit for bit over random queries and keys
// with spread exponents, for every head size, DeepSeek-V3's latent rows (576) and odd group
// counts, one or two groups of 16 query rows; and on the model against
// float64 (each score a sum of exact products, so within (hd + 1) 2^-24 of the sum of |products|).
// Skips naming the cpuid flags where AMX is not granted (the hardware) or AVX512-BF16 is missing
// (the packing, either way).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "core/dtype.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

class AmxAttentionTest : public ::testing::TestWithParam<cpu_fast::AmxUnit> {};

INSTANTIATE_TEST_SUITE_P(Units, AmxAttentionTest, ::testing::Values(cpu_fast::AmxUnit::kTiles, cpu_fast::AmxUnit::kModel),
                         [](const auto& info) { return std::string(info.param == cpu_fast::AmxUnit::kTiles ? "tiles" : "model"); });

TEST_P(AmxAttentionTest, KeysAsATilesGiveThePackedKeysBits) {
  const CpuFeatures f = DetectCpuFeatures();
  if (!f.avx512_bf16) GTEST_SKIP() << "this CPU lacks cpuid flag avx512_bf16";
  if (GetParam() == cpu_fast::AmxUnit::kTiles && !f.amx_bf16) {
    GTEST_SKIP() << "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " << f.amx_detail;
  }
  const cpu_fast::AmxUnit unit = GetParam();
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::uniform_int_distribution<int> spread(-20, 20);
  auto value = [&] { return std::ldexp(u(gen), spread(gen)); };
  for (int64_t hd : {32, 64, 128, 256, 576}) {  // 576: DeepSeek-V3's latent rows
    for (int64_t rows : {1, 3, 8, 16, 24, 32}) {  // past 16: two query groups, as the latent kernel's
      for (int64_t keys : {5, 16, 37, 64}) {
        SCOPED_TRACE(absl::StrFormat("head_dim %d, %d rows, %d keys", hd, rows, keys));
        const int64_t stride = 3 * hd;  // keys a cache slot apart: other heads' values between
        const int64_t groups = (keys + 15) / 16, padded = (keys + 31) / 32 * 32;
        std::vector<float> qf(static_cast<size_t>(rows * hd)), kf(static_cast<size_t>(groups * 16 * stride));
        for (float& x : qf) x = value();
        for (float& x : kf) x = value();
        std::vector<uint16_t> q(qf.size()), cache(kf.size());
        cpu_fast::RoundRowsToBf16(qf.data(), rows, hd, q.data());
        cpu_fast::RoundRowsToBf16(kf.data(), 1, static_cast<int64_t>(kf.size()), cache.data());
        // Packed: every 16-key block's pairs, blocks to a multiple of 32 keys (zero keys after).
        const std::vector<uint16_t> zeros(static_cast<size_t>(hd), 0);
        std::vector<uint32_t> kt(static_cast<size_t>(padded / 16 * hd / 2 * 16));
        for (int64_t b = 0; b < padded / 16; ++b) {
          const uint16_t* rows_of[16];
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t key = 16 * b + j;
            rows_of[j] = key < keys ? cache.data() + key * stride : zeros.data();
          }
          cpu_fast::KeyPairsBf16(rows_of, hd, kt.data() + b * hd / 2 * 16);
        }
        std::vector<float> want(static_cast<size_t>(rows * padded)), got(want.size());
        cpu_fast::ScoresAmx(unit, q.data(), rows, hd, kt.data(), padded / 16, want.data(), padded);
        std::vector<uint32_t> q_pairs(static_cast<size_t>(cpu_fast::QueryGroupsDwords(rows, hd)));
        cpu_fast::QueryGroupsAmx(q.data(), rows, hd, q_pairs.data());
        std::vector<const uint16_t*> starts(static_cast<size_t>(groups));
        for (int64_t g = 0; g < groups; ++g) starts[g] = cache.data() + 16 * g * stride;
        for (int64_t g0 = 0; g0 < rows; g0 += 16) {
          cpu_fast::ScoresAmxKeysAsA(unit, q_pairs.data() + g0 / 16 * (hd / 32) * 256, std::min<int64_t>(16, rows - g0),
                                     hd, starts.data(), groups, stride, 2 * hd, got.data() + g0 * padded, padded);
        }
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < keys; ++j) {
            const float a = got[r * padded + j], b = want[r * padded + j];
            ASSERT_EQ(0, std::memcmp(&a, &b, sizeof(float))) << "row " << r << " key " << j << ": " << a << " vs " << b;
            if (unit != cpu_fast::AmxUnit::kModel) continue;
            double exact = 0, magnitude = 0;
            for (int64_t e = 0; e < hd; ++e) {
              const double p = double{Bf16ToF32(q[r * hd + e])} * Bf16ToF32(cache[j * stride + e]);
              exact += p;
              magnitude += std::fabs(p);
            }
            const double err = std::fabs(a - exact), bound = (hd + 1) * std::ldexp(magnitude, -24);
            ASSERT_LE(err, bound) << "row " << r << " key " << j << ": " << a << " against " << exact;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
