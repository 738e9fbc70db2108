// The two operand orders of the amx attention's scores on AMX hardware: keys packed as B tiles
// (ScoresAmx, a prefill tile's rows) against keys read in place as A tiles (ScoresAmxKeysAsA, a
// decode token's), bit for bit over random queries and keys with spread exponents, for every
// head size and odd group counts. Skips naming the cpuid flags where AMX is not granted.
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(AmxAttentionTest, KeysAsATilesGiveThePackedKeysBits) {
  const CpuFeatures f = DetectCpuFeatures();
  if (!f.amx_bf16) GTEST_SKIP() << "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " << f.amx_detail;
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::uniform_int_distribution<int> spread(-20, 20);
  auto value = [&] { return std::ldexp(u(gen), spread(gen)); };
  for (int64_t hd : {32, 64, 128, 256}) {
    for (int64_t rows : {1, 3, 8, 16}) {
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
        cpu_fast::ScoresAmx(q.data(), rows, hd, kt.data(), padded / 16, want.data(), padded);
        std::vector<uint32_t> q_pairs(static_cast<size_t>(hd / 32 * 256));
        cpu_fast::QueryPairsAmx(q.data(), rows, hd, q_pairs.data());
        std::vector<const uint16_t*> starts(static_cast<size_t>(groups));
        for (int64_t g = 0; g < groups; ++g) starts[g] = cache.data() + 16 * g * stride;
        cpu_fast::ScoresAmxKeysAsA(q_pairs.data(), rows, hd, starts.data(), groups, stride, 2 * hd, got.data(), padded);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < keys; ++j) {
            const float a = got[r * padded + j], b = want[r * padded + j];
            ASSERT_EQ(0, std::memcmp(&a, &b, sizeof(float))) << "row " << r << " key " << j << ": " << a << " vs " << b;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
