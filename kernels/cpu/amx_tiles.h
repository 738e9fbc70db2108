// The AMX tile configuration and tile steps the amx kernels share (gemm_amx.cc,
// attention_amx.cc): a block of up to 32 rows in two A tiles against two B tiles, four
// accumulators, so each K step loads four tiles for four tdpbf16ps.
//
// Tiles 0-3 hold C[a][b] (A tile a, B tile b) as rows0 / rows1 x 16 fp32 (tile 2a + b), tiles
// 4-5 the two A tiles (rows0 / rows1 x 32 bf16), 6-7 the two B tiles (16 pair-rows x 16
// columns); rows1 0 leaves tiles 2, 3 and 5 out. Only inline assembly here (no intrinsic), so
// the header compiles under any target.
#pragma once

#include <cstdint>

namespace moeserve::cpu_fast {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile configuration is thread state, loaded only when it differs from what this thread last
// loaded here. Every tile configuration of the kernels goes through this function and they never
// release the tiles (signals and context switches save and restore the state), so the thread's
// own record is the hardware's. calibrate's peak loop (tools/calibrate/peak_flops.cc) configures
// and releases tiles itself, in a forked child that never runs a kernel: it must stay there. Reading it back with sttilecfg instead waits for every
// tile operation in flight: a quarter of a prefill GEMM's time went there when each block of
// 32 rows checked (Sapphire Rapids VM, m 512 x 2048 x 512).
inline void ConfigureAmxTiles(int rows0, int rows1) {
  thread_local int loaded0 = -1, loaded1 = -1;
  if (rows0 == loaded0 && rows1 == loaded1) return;
  AmxTileConfig want;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    want.rows[t] = static_cast<uint8_t>(rows[t]);
    want.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(want));
  loaded0 = rows0, loaded1 = rows1;
}

// C[a][b] = 0 for the configured accumulators.
inline void AmxZeroC(int rows1) {
  __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1" ::);
  if (rows1 > 0) __asm__ volatile("tilezero %%tmm2\n\ttilezero %%tmm3" ::);
}

// C[a][b] += A(a) B(b) for one K step: A tiles at a0 / a1 (rows `a_stride` bytes apart; a1 read
// only when rows1 > 0), B tiles at b0 / b1 (16 rows of 64 bytes), loaded by LOAD_B. AT&T order:
// B, A, C. One body for the two steps below, which differ only in that instruction.
#define MOESERVE_AMX_STEP(NAME, LOAD_B)                                                                   \
  inline void NAME(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, \
                   int rows1) {                                                                          \
    const long b_stride = 64;                                                                            \
    if (rows1 == 0) {                                                                                    \
      __asm__ volatile("tileloadd (%0,%3,1), %%tmm4\n\t" LOAD_B " (%1,%4,1), %%tmm6\n\t" LOAD_B             \
                       " (%2,%4,1), %%tmm7\n\t"                                                           \
                       "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"                                            \
                       "tdpbf16ps %%tmm7, %%tmm4, %%tmm1" ::"r"(a0),                                     \
                       "r"(b0), "r"(b1), "r"(a_stride), "r"(b_stride)                                    \
                       : "memory");                                                                      \
      return;                                                                                            \
    }                                                                                                    \
    __asm__ volatile("tileloadd (%0,%4,1), %%tmm4\n\t" LOAD_B " (%2,%5,1), %%tmm6\n\t" LOAD_B               \
                     " (%3,%5,1), %%tmm7\n\t"                                                             \
                     "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"                                              \
                     "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"                                              \
                     "tileloadd (%1,%4,1), %%tmm5\n\t"                                                   \
                     "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"                                              \
                     "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::"r"(a0),                                       \
                     "r"(a1), "r"(b0), "r"(b1), "r"(a_stride), "r"(b_stride)                             \
                     : "memory");                                                                        \
  }

// The attention's step: its B tiles (packed keys and values) are read again by the next rows.
MOESERVE_AMX_STEP(AmxStep, "tileloadd")
// The GEMM's step: B tiles by tileloaddt1 (the hint that the data is not reused soon), since its
// x block (the A tiles) is reused by every B tile of a group while each B tile serves it once
// (kernels_bench's prefill GEMMs 1.0-1.3x faster than with tileloadd, best of five on the
// Sapphire Rapids VM; bits unchanged).
MOESERVE_AMX_STEP(AmxStepStreamingB, "tileloaddt1")
#undef MOESERVE_AMX_STEP

// C[a][0] += A(a) B(0) for one K step, both A tiles against the one B tile at b0: the
// transposed product (keys as A, the queries' pair rows as B), tiles 0 and 2 its accumulators.
// Needs the configuration ConfigureAmxTiles(16, 16).
inline void AmxStepSharedB(const void* a0, const void* a1, long a_stride, const uint32_t* b0) {
  const long b_stride = 64;
  __asm__ volatile(
      "tileloadd (%2,%4,1), %%tmm6\n\t"
      "tileloadd (%0,%3,1), %%tmm4\n\t"
      "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
      "tileloadd (%1,%3,1), %%tmm5\n\t"
      "tdpbf16ps %%tmm6, %%tmm5, %%tmm2" ::"r"(a0),
      "r"(a1), "r"(b0), "r"(a_stride), "r"(b_stride)
      : "memory");
}

// C[0][0] and C[1][0] (AmxStepSharedB's accumulators) to c and c + 16 stride (rows `stride`
// floats apart).
inline void AmxStoreSharedBC(float* c, int64_t stride) {
  const long bytes = static_cast<long>(stride * sizeof(float));
  __asm__ volatile(
      "tilestored %%tmm0, (%0,%2,1)\n\t"
      "tilestored %%tmm2, (%1,%2,1)" ::"r"(c),
      "r"(c + 16 * stride), "r"(bytes)
      : "memory");
}

// The configured rows of C[a][b] to c + 16 a stride + 16 b (floats; rows `stride` floats apart).
inline void AmxStoreC(float* c, int64_t stride, int rows1) {
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

}  // namespace moeserve::cpu_fast
