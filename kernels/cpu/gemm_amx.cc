// The amx GEMM kernel: tdpbf16ps on AMX tiles, bf16 activations (rounded once per task by
// PadRowsAmx below, each A tile's 16 x 32 values contiguous, 64-byte aligned) against bf16
// weights. A work item covers 32 weight rows (two B tiles of 16 output columns each). Weights
// stored as kAmxTiles (what the backend uploads for this variant) are those B tiles already, in
// K order; weights in the other layouts are repacked on the fly into the same VNNI order (row p:
// the column pair (2p, 2p + 1) of all 16 weight rows), 32 columns of K per tile, zero-padded past
// K and past the matrix's rows. A block of 32 x rows (two A tiles) against the two B tiles keeps
// four accumulators, so each K step loads four tiles for four tdpbf16ps (the 2x2 blocking the
// TMUL needs to stay busy). Each output element is one tdpbf16ps accumulation over K in
// 32-column steps, whatever the number of x rows: batch-invariant.
// A block of x rows configures its A and C tiles with as many rows as it has (up to 16 each),
// so a decode step's few rows load and multiply only themselves, not a padded 32-row block:
// the rows of a tile are computed independently, so this changes no result.
//
// First run on AMX hardware on 2026-11-26 (docs/performance-log.md). The variant is used only after
// its self-check passed in a child process (kernel_select.cc), so a fault cannot take the server
// down and a wrong result is never served.
//
// Compiled for AMX by the target pragma below (after every include).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/status.h"
#include "kernels/cpu/exp16.h"
#include "kernels/cpu/gemm_amx_tiles.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/round16.h"

#pragma GCC push_options
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

using amx_gemm::EmulatedTiles;
using amx_gemm::HardwareTiles;
using amx_gemm::kTileK;
using amx_gemm::kTileM;
using amx_gemm::kTileN;
constexpr int64_t kBTile = kTileK / 2 * kTileN;  // dwords of one packed B tile
static_assert(kAmxItemRows == 2 * kTileN, "an item is two B tiles wide");
static_assert(kAmxItemRows == kAmxGroupRows && kTileK == kAmxGroupCols, "an item is one kAmxTiles group");

// The B tile for weight rows [r0, r0 + 16) and K columns [k0, k0 + 32): row p holds, for each of
// the 16 weight rows n, the dword (w[n][k0 + 2p], w[n][k0 + 2p + 1]). Rows past the matrix and
// columns past K are zero.
void PackB(const Rows<uint16_t>& w, int64_t rows, int64_t cols, int64_t r0, int64_t k0, uint32_t* out) {
  std::memset(out, 0, kTileK / 2 * kTileN * sizeof(uint32_t));
  for (int64_t n = 0; n < kTileN && r0 + n < rows; ++n) {
    const uint16_t* row = w.Row(r0 + n);
    for (int64_t p = 0; p < kTileK / 2; ++p) {
      const int64_t c = k0 + 2 * p;
      if (c >= cols) break;
      const int64_t chunk = c / kTileCols, lane = c % kTileCols;  // a pair never straddles a chunk
      const uint16_t* src = row + chunk * w.chunk_stride + lane;
      const uint32_t lo = src[0], hi = c + 1 < cols ? src[1] : 0;
      out[p * kTileN + n] = lo | (hi << 16);
    }
  }
}

// The same from the tiled layout, with permutes: chunk c of an 8-row tile is 32 dwords
// (row r, pair p at 4r + p); two permutes gather each pair's 8 rows, two 128-bit shuffles join
// the two tiles' halves into B rows.
void PackBTiled(const uint16_t* tile0, const uint16_t* tile1, int64_t chunks, int64_t kt, uint32_t* out) {
  // Lane j of the first gather: pair j / 8, row j % 8; of the second: pair 2 + j / 8.
  alignas(64) static constexpr int32_t kLo[16] = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29};
  alignas(64) static constexpr int32_t kHi[16] = {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi);
  for (int64_t q = 0; q < kTileK / kTileCols; ++q) {  // the 4 chunks of this K tile
    const int64_t c = kt * (kTileK / kTileCols) + q;
    __m512i x0 = _mm512_setzero_si512(), y0 = x0, x1 = x0, y1 = x0;
    if (c < chunks) {
      const uint16_t* a = tile0 + c * kTileRows * kTileCols;
      const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 32);
      x0 = _mm512_permutex2var_epi32(a0, lo, a1);
      y0 = _mm512_permutex2var_epi32(a0, hi, a1);
      if (tile1 != nullptr) {
        const uint16_t* b = tile1 + c * kTileRows * kTileCols;
        const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 32);
        x1 = _mm512_permutex2var_epi32(b0, lo, b1);
        y1 = _mm512_permutex2var_epi32(b0, hi, b1);
      }
    }
    uint32_t* o = out + q * 4 * kTileN;  // B rows 4q .. 4q + 3
    _mm512_storeu_si512(o, _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_storeu_si512(o + kTileN, _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm512_storeu_si512(o + 2 * kTileN, _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_storeu_si512(o + 3 * kTileN, _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

// Packs the B tiles of weight rows [r0, r0 + 16), all of K, into b (tile kt at b + kt * 2 *
// kBTile: the item's two halves interleave by K step). Rows past the matrix are zero.
void PackHalf(const Rows<uint16_t>& w, int64_t rows, int64_t cols, int64_t r0, uint32_t* b) {
  const int64_t ktiles = RoundUp(cols, kTileK) / kTileK, chunks = RoundUp(cols, kTileCols) / kTileCols;
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    uint32_t* bt = b + kt * 2 * kBTile;
    if (r0 >= rows) {
      std::memset(bt, 0, kBTile * sizeof(uint32_t));
    } else if (w.tiled) {
      PackBTiled(w.Row(r0), r0 + kTileRows < rows ? w.Row(r0 + kTileRows) : nullptr, chunks, kt, bt);
    } else {
      PackB(w, rows, cols, r0, kt * kTileK, bt);
    }
  }
}

// Adds or writes the block of x rows [i, i + block) from its C tiles (as Store wrote them) into y.
void WriteBlock(const GemmTask& t, const float* c, int64_t i, int64_t block, int64_t r0) {
  const int64_t rows = t.w.rows;
  for (int64_t r = i; r < i + block; ++r) {
    const int64_t a = (r - i) / kTileM, row = (r - i) % kTileM;
    for (int64_t h = 0; h < 2; ++h) {  // one B tile's 16 columns at a time: contiguous runs
      const int64_t n = std::min<int64_t>(kTileN, rows - r0 - h * kTileN);
      if (n <= 0) break;  // the item's second B tile lies past the matrix
      const float* cr = c + (2 * a + h) * kTileM * kTileN + row * kTileN;
      float* yr = t.y + r * rows + r0 + h * kTileN;
      if (t.accumulate) {
        for (int64_t j = 0; j < n; ++j) yr[j] += cr[j];
      } else {
        for (int64_t j = 0; j < n; ++j) yr[j] = cr[j];
      }
    }
  }
}

// The B tiles of item `it` (its 32 weight rows, all of K; tile pair kt at kt * 2 * kBTile): the
// weights themselves when they are stored as AMX tiles, else repacked into the scratch.
const uint32_t* ItemB(const GemmTask& t, const GemmItem& it, int64_t ktiles, GemmScratch* scratch) {
  if (t.w.layout == WeightLayout::kAmxTiles) {
    return static_cast<const uint32_t*>(t.w.data) + it.tile * ktiles * 2 * kBTile;
  }
  const Rows<uint16_t> w = RowsOf<uint16_t>(t.w);
  const int64_t r0 = it.tile * kAmxItemRows;
  uint32_t* packed = reinterpret_cast<uint32_t*>(scratch->Reset(static_cast<size_t>(ktiles * 2 * kBTile)));
  PackHalf(w, t.w.rows, t.w.cols, r0, packed);
  PackHalf(w, t.w.rows, t.w.cols, r0 + kTileN, packed + kBTile);
  return packed;
}

// An item fetches its B tiles ahead, a K step's two tiles (2 KiB) this many steps: from DRAM in a
// decode step, from L2 within a prefill's group (fetching only a group's first x block's was no
// faster, kernels_bench, five interleaved runs). The hardware prefetchers alone left a decode
// step at 0.6-0.8 of the read bandwidth; 2 steps ahead, 0.8-1.07 (medium preset, batch 1, three
// interleaved rounds on the Sapphire Rapids VM).
constexpr int64_t kPrefetchSteps = 2;
void PrefetchB(const uint32_t* b) {
  const char* p = reinterpret_cast<const char*>(b);
  for (int64_t line = 0; line < kBTile * 4 / 64; ++line) _mm_prefetch(p + 64 * line, _MM_HINT_T0);
}

// The accumulators C[a][b] of x rows [i, i + rows0 + rows1) (A tiles from the padded x) against
// B tiles b0 and b1, each K step's tiles 2 * kBTile dwords after the last, fetched
// kPrefetchSteps steps ahead.
template <typename Tiles>
void MultiplyBlock(const uint16_t* x_bf16, int64_t ktiles, int64_t i, int rows0, int rows1, const uint32_t* b0,
                   const uint32_t* b1) {
  constexpr long kATileRow = kTileK * sizeof(uint16_t);  // an A tile's rows are contiguous
  const int64_t a_block = ktiles * kTileM * kTileK;       // elements per 16-row block of x
  const uint16_t* a0 = x_bf16 + (i / kTileM) * a_block;
  const uint16_t* a1 = a0 + a_block;  // the padded x buffer has whole 32-row blocks
  Tiles::Begin(rows0, rows1);
  Tiles::Zero(rows0, rows1);
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    if (kt + kPrefetchSteps < ktiles) {
      PrefetchB(b0 + (kt + kPrefetchSteps) * 2 * kBTile);
      PrefetchB(b1 + (kt + kPrefetchSteps) * 2 * kBTile);
    }
    const int64_t at = kt * kTileM * kTileK;
    Tiles::Step(a0 + at, a1 + at, b0 + kt * 2 * kBTile, b1 + kt * 2 * kBTile, kATileRow, rows0, rows1);
  }
}

// The rows of an item's x block: one or two A tiles.
struct Block {
  int64_t i, rows;
  int rows0, rows1;
};
Block BlockOf(const GemmItem& it) {
  const int64_t rows = it.m1 - it.m0;
  MS_CHECK(rows > 0 && rows <= kAmxRowBlock);  // the planner's items: one x block each
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, kTileM));
  return {it.m0, rows, rows0, static_cast<int>(rows - rows0)};
}

template <typename Tiles>
void Run(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* scratch) {
  const int64_t ktiles = RoundUp(t.w.cols, kTileK) / kTileK;
  const uint32_t* b = ItemB(t, it, ktiles, scratch);
  const int64_t r0 = it.tile * kAmxItemRows;
  const Block x = BlockOf(it);
  MultiplyBlock<Tiles>(x_bf16, ktiles, x.i, x.rows0, x.rows1, b, b + kBTile);
  // C goes straight into y where the item's 32 columns are all in the matrix and y is written,
  // not added to (adding needs a pass over C).
  if (!t.accumulate && r0 + kAmxItemRows <= t.w.rows) {
    Tiles::StoreOut(t.y + x.i * t.w.rows + r0, t.w.rows, x.rows0, x.rows1);
    return;
  }
  alignas(64) float c[4 * kTileM * kTileN];  // C[a][b] at (2a + b) * 256, as Store writes it
  Tiles::Store(c, x.rows0, x.rows1);
  WriteBlock(t, c, x.i, x.rows, r0);
}

// Element (row, col) of a [rows, k] matrix in PadRowsAmx's layout (k_tiles 32-column tiles).
int64_t AmxTileIndex(int64_t row, int64_t col, int64_t k_tiles) {
  return (row / kTileM * k_tiles + col / kTileK) * kTileM * kTileK + row % kTileM * kTileK + col % kTileK;
}

// Writes `rows` rows of 16 activations (act, 16 floats apart) to rows [i, i + rows) and columns
// [c0, c0 + 16) of the fused task's output: fp32 into y, or rounded into y_packed's tiles.
void WriteActivations(const GemmTask& t, const float* act, int64_t i, int64_t rows, int64_t c0) {
  if (t.y_packed == nullptr) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(t.y + (i + r) * t.swiglu + c0, act + r * kTileN, kTileN * sizeof(float));
    return;
  }
  const int64_t k_tiles = t.swiglu / kTileK;
  for (int64_t r = 0; r < rows; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.y_packed + AmxTileIndex(i + r, c0, k_tiles)), RoundSixteen(act + r * kTileN, kTileN));
  }
}

// A fused SwiGLU item (GemmTask::swiglu): B tile 0 is gate rows [16 j, 16 j + 16) of the
// [gate; up] weight stored as AMX tiles, B tile 1 the matching up rows [inter + 16 j, ...), so a
// block's accumulators hold each row's gate and up values side by side, and its output is
// silu(gate) * up through SiluMulRow16 (what SiluMul computes, bit for bit), one call per A tile
// (its gate rows are one contiguous run, as are its up rows). The [m, 2 inter] product is never
// written (storing C into a 4 MB output took a third of a standalone loop of this kernel's time,
// 512 x 2048 x 512 on one core of the Sapphire Rapids VM). With y_packed the item that ends the
// rows also writes its columns of the padding rows (zero), so every element is written once.
template <typename Tiles>
void RunSwiGlu(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it) {
  const int64_t ktiles = RoundUp(t.w.cols, kTileK) / kTileK, inter = t.swiglu, c0 = kTileN * it.tile;
  const auto* w = static_cast<const uint32_t*>(t.w.data);
  auto half = [&](int64_t row) { return w + row / kAmxItemRows * ktiles * 2 * kBTile + row / kTileN % 2 * kBTile; };
  const uint32_t* gate = half(c0);
  const uint32_t* up = half(inter + c0);
  alignas(64) float c[4 * kTileM * kTileN];  // C[a][b] at (2a + b) * 256: b 0 gate, 1 up
  alignas(64) float act[kTileM * kTileN];
  const Block x = BlockOf(it);
  MultiplyBlock<Tiles>(x_bf16, ktiles, x.i, x.rows0, x.rows1, gate, up);
  Tiles::Store(c, x.rows0, x.rows1);
  for (int64_t a = 0; a < 2 && a * kTileM < x.rows; ++a) {
    const int64_t rows = a == 0 ? x.rows0 : x.rows1;
    const float* g = c + 2 * a * kTileM * kTileN;
    SiluMulRow16(g, g + kTileM * kTileN, rows * kTileN, act);
    WriteActivations(t, act, x.i + a * kTileM, rows, c0);
  }
  if (t.y_packed != nullptr && it.m1 == t.m) {
    const int64_t k_tiles = inter / kTileK;
    for (int64_t r = t.m; r < RoundUp(t.m, kAmxRowBlock); ++r) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.y_packed + AmxTileIndex(r, c0, k_tiles)), _mm256_setzero_si256());
    }
  }
}

}  // namespace

// See gemm_kernels.h: SiluMulRow's operations per lane on 16 lanes. The 8-lane build contracts
// its exp's last product and the `1 +` into one FMA, fma(y, 2^n, 1); here vscalefps and an add
// compute the same value, because y * 2^n is exact after the clamp (n in [-126, 127], y in
// [0.71, 1.42], and y >= 1.04 where n = -126, so the product is a normal number). The division and
// the product with up are IEEE at any width. The start-up self-check (kernel_select.cc) compares
// the fused kernel with GEMM then SiluMul bit for bit, so a compiler that changed this is caught.
void SiluMulRow16(const float* g, const float* u, int64_t n, float* o) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(o + i, SiluTimes16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  }
  if (i < n) SiluMulRow(g + i, u + i, n - i, o + i);
}

void PadRowsAmx(const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out) {
  const int64_t ktiles = RoundUp(k, kTileK) / kTileK;
  for (int64_t i = i0; i < i1; ++i) {
    uint16_t* tile_row = out + (i / kTileM) * ktiles * kTileM * kTileK + (i % kTileM) * kTileK;
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      uint16_t* o = tile_row + kt * kTileM * kTileK;
      for (int64_t half = 0; half < kTileK; half += 16) {
        const int64_t c = kt * kTileK + half, left = i < m ? k - c : 0;  // a padding row is all zero
        const float* src = left > 0 ? x + i * k + c : x;                  // masked lanes are not read
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + half), RoundSixteen(src, left));
      }
    }
  }
}

void TileAmx(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s) {
  Run<HardwareTiles>(t, x_bf16, it, s);
}

void TileAmxEmulated(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* s) {
  Run<EmulatedTiles>(t, x_bf16, it, s);
}

void TileAmxSwiGlu(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch*) {
  RunSwiGlu<HardwareTiles>(t, x_bf16, it);
}

void TileAmxSwiGluEmulated(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch*) {
  RunSwiGlu<EmulatedTiles>(t, x_bf16, it);
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
