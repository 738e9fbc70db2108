// The tile operations of the amx GEMM kernel (gemm_amx.cc), as two interchangeable structs: on
// the hardware (amx_tiles.h's inline assembly), and on the software model of the tile unit
// (amx_tile_model.h) with which the tests check the kernel's layouts and blocking on any
// AVX-512 CPU (gemm_amx.cc compiles its users for AVX-512). To be included by gemm_amx.cc alone:
// the structs have inline members that one translation unit's target must own. No intrinsic
// here, so the header compiles before that file's target pragma.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/amx_tile_model.h"
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

// The same operations on the software model of the tile unit (amx_tile_model.h), with which the
// tests check the kernel's layouts and blocking against float64 on any CPU (and model against
// model bit for bit), never against the hardware's bits.
struct EmulatedTiles {
  static void Begin(int rows0, int rows1) { amx_model::Configure(rows0, rows1); }
  static void Zero(int, int rows1) { amx_model::ZeroC(rows1); }
  static void Step(const uint16_t* a0, const uint16_t* a1, const uint32_t* b0, const uint32_t* b1, long a_stride, int,
                   int rows1) {
    amx_model::Step(a0, a1, a_stride, b0, b1, rows1);
  }
  // The configured rows; the rest of each 16-row buffer becomes NaN, as memory the hardware
  // leaves alone holds anything, so a kernel that read an unconfigured row would fail its tests.
  static void Store(float* c, int, int rows1) {
    std::fill(c, c + 4 * kTileM * kTileN, std::numeric_limits<float>::quiet_NaN());
    for (int t = 0; t < (rows1 > 0 ? 4 : 2); ++t) amx_model::StoreTile(t, c + t * kTileM * kTileN, kTileN);
  }
  static void StoreOut(float* y, int64_t ld, int, int rows1) { amx_model::StoreC(y, ld, rows1); }
};

}  // namespace moeserve::cpu_fast::amx_gemm
