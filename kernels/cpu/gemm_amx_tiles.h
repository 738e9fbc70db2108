// The tile operations of the amx GEMM kernel (gemm_amx.cc), as two interchangeable structs: on
// the hardware (amx_tiles.h's inline assembly), and a software model of the same instruction
// semantics with which the tests check the kernel's layouts and blocking on any AVX-512 CPU
// (gemm_amx.cc compiles its users for AVX-512). To be included by gemm_amx.cc alone: the structs
// have inline members and thread-local state that one translation unit's target must own. No
// intrinsic here, so the header compiles before that file's target pragma.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/amx_tiles.h"

namespace moeserve::cpu_fast::amx_gemm {

constexpr int64_t kTileK = 32;  // bf16 columns of K per A/B tile (64 bytes a row)
constexpr int64_t kTileN = 16;  // output columns (weight rows) per B tile: two kTiled8 tiles
constexpr int64_t kTileM = 16;  // x rows per A tile

// Each takes the block's rows in its two A tiles: rows0 in 1..16, rows1 in 0..16 (0: one tile).
struct HardwareTiles {
  static void Begin(int rows0, int rows1) { ConfigureAmxTiles(rows0, rows1); }
  static void Zero(int, int rows1) { AmxZeroC(rows1); }
  // C[a][b] += A(a) B(b) for one 32-column K step, B tiles b0 and b1.
  static void Step(const uint16_t* a0, const uint16_t* a1, const uint32_t* b0, const uint32_t* b1, long a_stride, int,
                   int rows1) {
    AmxStepStreamingB(a0, a1, a_stride, b0, b1, rows1);
  }
  // Stores the configured rows of C[a][b] to c + (2a + b) * 256 floats (rows 16 floats apart).
  static void Store(float* c, int, int rows1) {
    const long stride = kTileN * sizeof(float);
    constexpr int64_t kC = kTileM * kTileN;
    __asm__ volatile(
        "tilestored %%tmm0, (%0,%2,1)\n\t"
        "tilestored %%tmm1, (%1,%2,1)" ::"r"(c),
        "r"(c + kC), "r"(stride)
        : "memory");
    if (rows1 == 0) return;
    __asm__ volatile(
        "tilestored %%tmm2, (%0,%2,1)\n\t"
        "tilestored %%tmm3, (%1,%2,1)" ::"r"(c + 2 * kC),
        "r"(c + 3 * kC), "r"(stride)
        : "memory");
  }
  // Stores the configured rows of C[a][b] straight into the output: rows `ld` floats apart,
  // C[a][b] at y + 16 a ld + 16 b.
  static void StoreOut(float* y, int64_t ld, int, int rows1) { AmxStoreC(y, ld, rows1); }
};

// Intel SDM's pseudo-code for tdpbf16ps: per output element, the pair products of each K step
// added in order. The hardware rounds otherwise (on the Sapphire Rapids VM 17-46% of a step's
// outputs differed from this and four other simple models, docs/performance.md), so the tests
// use the emulation for layouts and blocking against float64 with a bound (and emulated
// against emulated bits), never against the hardware's bits.
struct EmulatedTiles {
  static inline thread_local float acc[4][kTileM * kTileN];
  static inline thread_local bool legal = true;
  // The configuration rules the hardware enforces (a fault there): A and C rows 1-16 for the
  // first tile, 0-16 for the second, a second tile only behind a full first. A breach poisons
  // every result, so the tests fail where the hardware would fault.
  static void Begin(int rows0, int rows1) {
    legal = rows0 >= 1 && rows0 <= kTileM && rows1 >= 0 && rows1 <= kTileM && (rows1 == 0 || rows0 == kTileM);
  }
  static void Zero(int, int) { std::memset(acc, 0, sizeof(acc)); }
  static float Bf16(uint16_t v) {
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  // Only the configured rows, as the hardware: a row past them is never read.
  static void Step(const uint16_t* a0, const uint16_t* a1, const uint32_t* b0, const uint32_t* b1, long a_stride,
                   int rows0, int rows1) {
    const uint16_t* a[2] = {a0, a1};
    const int rows[2] = {rows0, rows1};
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const uint32_t* b = tb == 0 ? b0 : b1;
        for (int64_t m = 0; m < rows[ta]; ++m) {
          const uint16_t* row = a[ta] + m * (a_stride / static_cast<long>(sizeof(uint16_t)));
          for (int64_t k = 0; k < kTileK / 2; ++k) {
            for (int64_t n = 0; n < kTileN; ++n) {
              const uint32_t bw = b[k * kTileN + n];
              float& c = acc[2 * ta + tb][m * kTileN + n];
              c += Bf16(row[2 * k]) * Bf16(static_cast<uint16_t>(bw & 0xffff));
              c += Bf16(row[2 * k + 1]) * Bf16(static_cast<uint16_t>(bw >> 16));
            }
          }
        }
      }
    }
  }
  // The configured rows; the rest of each 16-row buffer becomes NaN, as memory the hardware
  // leaves alone holds anything, so a kernel that read an unconfigured row would fail its tests.
  static void Store(float* c, int rows0, int rows1) {
    for (int t = 0; t < 4; ++t) {
      const int rows = t < 2 ? rows0 : rows1;
      for (int64_t i = 0; i < kTileM * kTileN; ++i) {
        c[t * kTileM * kTileN + i] =
            legal && i < rows * kTileN ? acc[t][i] : std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  // Only the configured rows, as the hardware (the rows past them belong to other x rows).
  static void StoreOut(float* y, int64_t ld, int rows0, int rows1) {
    for (int t = 0; t < 4; ++t) {
      for (int64_t r = 0; r < (t < 2 ? rows0 : rows1); ++r) {
        for (int64_t j = 0; j < kTileN; ++j) {
          y[((t / 2) * kTileM + r) * ld + (t % 2) * kTileN + j] =
              legal ? acc[t][r * kTileN + j] : std::numeric_limits<float>::quiet_NaN();
        }
      }
    }
  }
};

}  // namespace moeserve::cpu_fast::amx_gemm
