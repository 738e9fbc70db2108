// Paged attention's products on AMX tiles (see attention_amx.h), in the tile arrangement of
// amx_tiles.h: two A tiles of up to 16 rows against two B tiles, four accumulators, so each K
// step loads four tiles for four tdpbf16ps.
//
// Compiled for AMX by the target pragma below (after every include).
#include "kernels/cpu/attention_amx.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kTileDwords = 256;  // one B tile: 16 rows x 16 dwords
constexpr long kBStride = 64;         // bytes per B tile row

void ZeroC(int rows1) {
  __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1" ::);
  if (rows1 > 0) __asm__ volatile("tilezero %%tmm2\n\ttilezero %%tmm3" ::);
}

// C[a][b] += A(a) B(b): A tiles at a0 / a1 (rows `a_stride` bytes apart), B tiles at b0 / b1.
void Step(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, int rows1) {
  __asm__ volatile(
      "tileloadd (%0,%3,1), %%tmm4\n\t"
      "tileloadd (%1,%4,1), %%tmm6\n\t"
      "tileloadd (%2,%4,1), %%tmm7\n\t"
      "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
      "tdpbf16ps %%tmm7, %%tmm4, %%tmm1" ::"r"(a0),
      "r"(b0), "r"(b1), "r"(a_stride), "r"(kBStride)
      : "memory");
  if (rows1 == 0) return;
  __asm__ volatile(
      "tileloadd (%0,%1,1), %%tmm5\n\t"
      "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
      "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::"r"(a1),
      "r"(a_stride)
      : "memory");
}

// C[a][b] to c + 16 a stride + 16 b (floats; rows `stride` floats apart): the configured rows only.
void StoreC(float* c, int64_t stride, int rows1) {
  const long bytes = static_cast<long>(stride * sizeof(float));
  __asm__ volatile(
      "tilestored %%tmm0, (%0,%2,1)\n\t"
      "tilestored %%tmm1, (%1,%2,1)" ::"r"(c),
      "r"(c + 16), "r"(bytes)
      : "memory");
  if (rows1 == 0) return;
  float* c1 = c + 16 * stride;
  __asm__ volatile(
      "tilestored %%tmm2, (%0,%2,1)\n\t"
      "tilestored %%tmm3, (%1,%2,1)" ::"r"(c1),
      "r"(c1 + 16), "r"(bytes)
      : "memory");
}

}  // namespace

void ScoresAmx(const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks, float* out,
               int64_t out_stride) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  ConfigureAmxTiles(rows0, rows1);
  const long a_stride = static_cast<long>(hd * sizeof(uint16_t));
  const int64_t steps = hd / 32, block_dwords = steps * kTileDwords;
  const uint16_t* q1 = rows1 > 0 ? q + 16 * hd : q;  // the second A tile, when there is one
  for (int64_t b = 0; b < blocks; b += 2) {
    ZeroC(rows1);
    const uint32_t* k0 = kt + b * block_dwords;
    for (int64_t s = 0; s < steps; ++s) {
      Step(q + 32 * s, q1 + 32 * s, a_stride, k0 + s * kTileDwords, k0 + block_dwords + s * kTileDwords, rows1);
    }
    StoreC(out + 16 * b, out_stride, rows1);
  }
}

void WeightedSumAmx(const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt, int64_t steps, int64_t hd,
                    float* acc) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  ConfigureAmxTiles(rows0, rows1);
  const long a_stride = static_cast<long>(p_stride * sizeof(uint16_t));
  const int64_t step_dwords = hd / 16 * kTileDwords;
  const uint16_t* p1 = rows1 > 0 ? p + 16 * p_stride : p;
  for (int64_t c = 0; c < hd / 16; c += 2) {  // 32 dimensions per pass
    ZeroC(rows1);
    for (int64_t t = 0; t < steps; ++t) {
      const uint32_t* v = vt + t * step_dwords + c * kTileDwords;
      Step(p + 32 * t, p1 + 32 * t, a_stride, v, v + kTileDwords, rows1);
    }
    StoreC(acc + 16 * c, hd, rows1);
  }
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
