// What gemm.cc's planner hands a kernel variant (gemm_avx2.cc, gemm_avx512.cc, gemm_bf16.cc,
// gemm_amx.cc): one work item, rows [m0, m1) of x against the 8-row tile `tile` of w (for AMX,
// the 32-row group `tile`), and a per-thread scratch. Internal to the CPU fast path.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {

struct GemmItem {
  int32_t task;
  int64_t tile;
  int64_t m0, m1;
};

// Up to this many x rows a GEMM streams its stored weights directly; above, the exact variants
// widen each bf16 tile to fp32 once and reuse it for every x row (the same arithmetic).
inline constexpr int64_t kDirectMaxRows = 16;  // measured: direct is faster to ~16 rows
// x rows per work item of a large GEMM (a multiple of every kernel's row block: 2, 3, 6, 12).
inline constexpr int64_t kRowChunk = 48;
// How far ahead of the tile being computed the weight stream is prefetched (the bf16 kernel:
// three times this for items of 6 rows or more, and the next tile by an item's later row
// blocks; gemm_bf16.cc's PlanFetch).
inline constexpr int64_t kPrefetchBytes = 2048;

// A thread's scratch: an fp32 copy of the tile it works on (64-byte aligned), or a repacked one.
struct GemmScratch {
  std::vector<float> storage;
  float* data = nullptr;
  const void* from = nullptr;  // the weight and tile it holds
  int64_t tile = -1;
  // Room for n floats, not cleared.
  float* Reset(size_t n) {
    if (storage.size() < n + 16) storage.resize(n + 16);
    data = storage.data() + (16 - (reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float)) % 16) % 16;
    return data;
  }
};

// Where the rows of one weight matrix are: row j's chunk c (8 columns from 8c) starts at
// Row(j) + c * chunk_stride; the last partial chunk is zero-padded in memory only when tiled.
template <typename T>
struct Rows {
  const T* base;
  int64_t cols;
  int64_t chunk_stride;  // elements between consecutive chunks of one row
  bool tiled;
  int64_t first_row = 0;  // the row `base` starts at (a tile of the matrix held on its own)
  const T* Row(int64_t j) const {
    j -= first_row;
    if (!tiled) return base + j * cols;
    return base + (j / kTileRows) * kTileRows * RoundUp(cols, kTileCols) + (j % kTileRows) * kTileCols;
  }
};

template <typename T>
Rows<T> RowsOf(const WeightRef& w) {
  const bool tiled = w.layout == WeightLayout::kTiled8;
  return Rows<T>{static_cast<const T*>(w.data), w.cols, tiled ? kTileRows * kTileCols : kTileCols, tiled};
}

// x_bf16: for the variants that round activations, the task's x as bf16 packed by PackRowsBf16;
// null for the exact variants.
void TileAvx2(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
void TileAvx512(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
// An avx512-bf16 item covers kBf16ItemRows weight rows (it.tile counts those).
void TileAvx512Bf16(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
// The avx512-bf16 fused gate/up GEMM and SiLU (GemmTask::swiglu, weights in kTiled8): item tile j
// is output columns [8j, 8j + 8), from gate tile j and up tile swiglu / 8 + j.
void TileAvx512Bf16SwiGlu(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
// An AMX item covers kAmxItemRows weight rows (two B tiles, four kTiled8 tiles: it.tile counts
// in 32s) and one block of at most kAmxRowBlock x rows (two A tiles).
void TileAmx(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
// The same kernel with the tile instructions computed in software (their documented
// semantics), for tests on CPUs without AMX (needs AVX-512 for the repacking).
void TileAmxEmulated(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);

// The fused SwiGLU items of a task with GemmTask::swiglu (gemm_amx.cc): it.tile j covers gate
// rows [16 j, 16 j + 16) and the matching up rows; y [m, swiglu] gets silu(gate) * up.
void TileAmxSwiGlu(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
void TileAmxSwiGluEmulated(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s);
inline constexpr int64_t kSwiGluItemColumns = 16;  // output columns per fused item: one B tile

// out[c] = silu(gate[c]) * up[c] for c < n: SiluMul's arithmetic (fast_ops.cc), one compiled
// copy, so that a fused kernel's result has its bits.
void SiluMulRow(const float* gate, const float* up, int64_t n, float* out);
// The same on 16 AVX-512 lanes, the same bits (gemm_amx.cc; only on CPUs with AVX-512).
void SiluMulRow16(const float* gate, const float* up, int64_t n, float* out);

// Rounds x [m, k] to bf16 (round to nearest even) into out [m, RoundUp(k, 8)], zero-padded.
void RoundRowsToBf16(const float* x, int64_t m, int64_t k, uint16_t* out);

// The same rounding, packed for the bf16 kernels: blocks of kBf16RowBlock rows, each
// [RoundUp(k, 8) / 8 chunks][kBf16RowBlock rows][8], zero-padded past m and k, so that one chunk
// of a block's rows is one contiguous run (work items start at multiples of the block).
// Writes rows [i0, i1) of the RoundUp(m, kBf16RowBlock) padded ones (the planner spreads them
// over threads). In gemm_bf16.cc, compiled for AVX512-BF16: only where the CPU has it.
inline constexpr int64_t kBf16RowBlock = 12;
// Weight rows an avx512-bf16 GEMM item takes: two tiles, each x row's broadcast serving both.
inline constexpr int64_t kBf16ItemRows = 2 * kTileRows;
static_assert(kRowChunk % kBf16RowBlock == 0, "work items must start at a block");
inline int64_t PackedBf16Elems(int64_t m, int64_t k) {
  return RoundUp(m, kBf16RowBlock) * RoundUp(k, kTileCols);
}
void PackRowsBf16(const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out);

// The same rounding for AMX A tiles, RoundUp(m, 32) rows and RoundUp(k, 32) columns,
// zero-padded, each tile's 16 rows x 32 columns contiguous (1 KiB): tile (b, kt) of row block b
// (rows 16b..16b+15) and K step kt starts at element (b * k_tiles + kt) * 512. Rows of the
// matrix k * 2 bytes apart would put a tile's 16 rows in one L1 set whenever k is a multiple of
// 2048. Writes rows [i0, i1) (multiples of 16). In gemm_amx.cc; needs AVX-512.
inline constexpr int64_t kAmxTileK = 32, kAmxRowBlock = 32, kAmxItemRows = 32;
inline constexpr int64_t kAmxRowChunk = kAmxRowBlock;  // an item is one x block (gemm_amx.cc checks)
// The weight bytes of one group of AMX items (gemm.cc's planner): a group's B tiles stay in L2
// while every x block passes them.
inline constexpr int64_t kAmxGroupBytes = int64_t{1} << 20;
// The same for the avx512-bf16 kernel's 8-row tiles (gemm.cc, RunGemms). Measured on a Zen 5
// (kernels_bench, prefill shapes, three rounds): 1 MiB 1.01-1.08x over no groups; 64 and 256 KiB
// within 2% of none.
inline constexpr int64_t kBf16GroupBytes = int64_t{1} << 20;
inline int64_t PaddedAmxElems(int64_t m, int64_t k) { return RoundUp(m, kAmxRowBlock) * RoundUp(k, kAmxTileK); }
void PadRowsAmx(const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out);

}  // namespace moeserve::cpu_fast
