// The avx512-bf16 GEMM kernels: vdpbf16ps on bf16 activations (rounded once per task by
// gemm.cc) and bf16 weights, 64 FLOP per instruction, no widening. A register holds chunk c of
// four weight rows (32 bf16: the tiled layout stores them side by side), x's 8-column chunk is
// broadcast to its four 128-bit lanes, so lane p of a row accumulates the column pairs
// (8c + 2p, 8c + 2p + 1) in order; the row's 4 lanes are then summed ((p0 + p1) + (p2 + p3)).
// The same operations whatever the number of x rows: batch-invariant.
//
// Compiled for AVX512-BF16 by the target pragma below (after every include) and only called
// where cpu_isa.h found it.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/status.h"
#include "kernels/cpu/exp16.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/round16.h"

#pragma GCC push_options
// GCC 12 warns of the undefined pass-through operand inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

// kBf16RowBlock (12) x rows x 2 quads = 24 accumulators of AVX-512's 32 registers.

// Where the kernel reads quad h (rows 4h .. 4h + 3) of chunk c: one run of 32 elements at
// tile + c * 64 + h * 32 in a tiled layout; otherwise four rows' own chunks, zero-padded past
// `cols`.
struct QuadSource {
  const uint16_t* tile = nullptr;
  const uint16_t* row[kTileRows];
  int64_t cols = 0;
  __m512bh Load(int64_t c, int h) const {
    if (tile != nullptr) {
      return reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(tile + c * kTileRows * kTileCols + h * 4 * kTileCols));
    }
    const int64_t left = cols - c * kTileCols;
    const __mmask8 mask = left >= kTileCols ? 0xff : static_cast<__mmask8>((1u << left) - 1);
    __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi16(mask, row[4 * h] + c * kTileCols));
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, row[4 * h + 1] + c * kTileCols), 1);
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, row[4 * h + 2] + c * kTileCols), 2);
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, row[4 * h + 3] + c * kTileCols), 3);
    return reinterpret_cast<__m512bh>(v);
  }
};

// The row sums of two x rows' accumulators: a and b hold weight rows 0-3 and 4-7 of one x row
// (128-bit lane L: row L or 4 + L, as four partial sums p0..p3), c and d the next x row's. Each
// row's sum is ((p0 + p1) + (p2 + p3)), the order the kernel has always used, and lane 4L + q of
// the result holds x row q / 2's weight row L + 4 (q % 2): two shuffles and an add per pair of
// registers instead of a horizontal sum per register and a scalar store per output.
inline __m512 SumTwoRows(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));  // p0+p1, p2+p3
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x88), _mm512_shuffle_ps(c, d, 0xdd));
  return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x88), _mm512_shuffle_ps(ab, cd, 0xdd));
}

// SumTwoRows' lanes in output order: lanes 0-7 the first x row's weight rows 0-7, 8-15 the
// second's.
struct RowOrder {
  alignas(64) int32_t idx[16];
};
constexpr RowOrder MakeRowOrder() {
  RowOrder o{};
  for (int j = 0; j < 16; ++j) o.idx[j] = 4 * (j % 4) + (j / 8) * 2 + (j % 8) / 4;
  return o;
}

// Where row `row`, columns [col, col + 8) of a [rows, k] matrix lie in PackRowsBf16's layout
// (the next 8 columns kBf16RowBlock x kTileCols elements on).
template <typename T>
inline T* PackedAt(T* out, int64_t k, int64_t row, int64_t col) {
  const int64_t block_elems = RoundUp(k, kTileCols) * kBf16RowBlock;
  return out + (row / kBf16RowBlock) * block_elems + (col / kTileCols) * kBf16RowBlock * kTileCols +
         (row % kBf16RowBlock) * kTileCols;
}

// Stores (or adds to) the first `cols` of 8 sums at y.
inline void StoreRow(__m256 v, float* y, __mmask8 cols, bool accumulate) {
  if (accumulate) v = _mm256_add_ps(_mm256_maskz_loadu_ps(cols, y), v);
  _mm256_mask_storeu_ps(y, cols, v);
}

// Row i's 8-column chunk of a packed block's chunk xc, in each 128-bit lane.
inline __m512bh BroadcastRow(const uint16_t* xc, int i) {
  return reinterpret_cast<__m512bh>(
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xc + i * kTileCols))));
}

constexpr int64_t kChunkBytes = kTileRows * kTileCols * sizeof(uint16_t);  // one 8 x 8 chunk, two lines

// Which chunks of a weight stream a row block fetches ahead (no result depends on it): chunk c at
// address `stream` where c % every == phase. An item's first block fetches its own tile ahead,
// each chunk; its later blocks, whose weights are in cache already, share the next tile's chunks
// (the tile the same thread's next item takes within a row pass; a tile's first block otherwise
// waited on DRAM while the later ones computed alone). Addresses are integers: the stream may
// run past the weights' end, where a fetch does nothing.
struct FetchPlan {
  uintptr_t stream = 0;  // 0: none
  int64_t every = 1, phase = 0;
};

// A FetchPlan walked chunk by chunk, in order.
class Fetcher {
 public:
  explicit Fetcher(const FetchPlan& f) : f_(f), due_(f.phase) {}
  void At(int64_t c) {
    if (f_.stream == 0 || c != due_) return;
    const uintptr_t at = f_.stream + static_cast<uintptr_t>(c * kChunkBytes);
    _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(at + 64), _MM_HINT_T0);
    due_ += f_.every;
  }

 private:
  FetchPlan f_;
  int64_t due_;
};

// Block b (of `blocks`, rows from the item's first) of an item of m rows over the tile at `tile`:
// its FetchPlan. The first block fetches kPrefetchBytes ahead, or three times that for an item
// of 6 rows or more, which computes long enough on each chunk that 2 KiB ahead arrived late
// (`medium` at batch 64, whose experts take ~8 rows: steps 1.06-1.15x; at batch 8, 0.98x; batch
// 1 unchanged). Later blocks fetch the same tile of the next item, `span` chunks on.
inline FetchPlan PlanFetch(const void* tile, int64_t span, int64_t b, int64_t blocks, int64_t m) {
  const uintptr_t t = reinterpret_cast<uintptr_t>(tile);
  if (b == 0) return {t + static_cast<uintptr_t>((m >= 6 ? 3 : 1) * kPrefetchBytes), 1, 0};
  return {t + static_cast<uintptr_t>(span * kChunkBytes), blocks - 1, b - 1};
}

// Stores (or adds) M x rows' sums of one tile (acc[i][h]: weight rows 4h .. 4h + 3 of x row i),
// the first `store_cols` of its 8 weight rows, x row i at y + i * y_stride.
template <int M>
inline __attribute__((always_inline)) void StoreTile(const __m512 (&acc)[M][2], float* y, int64_t y_stride,
                                                     int store_cols, bool accumulate) {
  static constexpr RowOrder kOrder = MakeRowOrder();
  const __m512i order = _mm512_load_si512(kOrder.idx);
  const __mmask8 cols = static_cast<__mmask8>((1u << store_cols) - 1);
#pragma GCC unroll 6
  for (int i = 0; i < M; i += 2) {
    const int j = i + 1 < M ? i + 1 : i;  // an odd last row is summed twice, stored once
    const __m512 s = _mm512_permutexvar_ps(order, SumTwoRows(acc[i][0], acc[i][1], acc[j][0], acc[j][1]));
    StoreRow(_mm512_castps512_ps256(s), y + i * y_stride, cols, accumulate);
    if (i + 1 < M) StoreRow(_mm512_extractf32x8_ps(s, 1), y + (i + 1) * y_stride, cols, accumulate);
  }
}

// M x rows of a packed block (PackRowsBf16: chunk c of row i at x + c * 96 + i * 8, rows offset
// into it) against T tiles: acc[t][i][h] holds tile t's rows 4h .. 4h + 3 for x row i, each
// tile's stream fetched by its own plan. Each x row's broadcast serves every tile's quads: with
// two tiles, four products a broadcast (the broadcast from memory runs at 0.68 of a load's rate
// into vdpbf16ps on the Zen 5, and the loop at 1.09x so). A sum's chain is the same whatever T:
// the same bits. Every loop over acc is fully unrolled, so the T x M x 2 <= 24 accumulators stay
// in registers.
template <int M, int T>
inline __attribute__((always_inline)) void TileSums(const uint16_t* x, const QuadSource* const (&w)[T],
                                                    int64_t chunks, const FetchPlan* const (&pf)[T],
                                                    __m512 (&acc)[T][M][2]) {
#pragma GCC unroll 2
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) acc[t][i][0] = acc[t][i][1] = _mm512_setzero_ps();
  }
  auto fetch = [&]<size_t... I>(std::index_sequence<I...>) {
    return std::array<Fetcher, T>{Fetcher(*pf[I])...};
  }(std::make_index_sequence<T>{});
  for (int64_t c = 0; c < chunks; ++c) {
    __m512bh q[T][2];
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) fetch[t].At(c);
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) q[t][0] = w[t]->Load(c, 0), q[t][1] = w[t]->Load(c, 1);
    const uint16_t* xc = x + c * kBf16RowBlock * kTileCols;
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) {
      const __m512bh xv = BroadcastRow(xc, i);
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) {
        acc[t][i][0] = _mm512_dpbf16_ps(acc[t][i][0], xv, q[t][0]);
        acc[t][i][1] = _mm512_dpbf16_ps(acc[t][i][1], xv, q[t][1]);
      }
    }
  }
}

// M <= 12 x rows against the 8 rows of a tile, its first `store_cols` stored.
template <int M>
void KernelMx8(const uint16_t* x, const QuadSource& w, int64_t chunks, float* y, int64_t y_stride, int store_cols,
               bool accumulate, const FetchPlan& pf) {
  __m512 acc[1][M][2];
  TileSums<M, 1>(x, {&w}, chunks, {&pf}, acc);
  StoreTile<M>(acc[0], y, y_stride, store_cols, accumulate);
}

// M <= 6 x rows against two tiles (16 weight rows), the second's first `store_b` rows stored, 8
// columns after the first's.
template <int M>
void KernelMx16(const uint16_t* x, const QuadSource& a, const QuadSource& b, int64_t chunks, float* y,
                int64_t y_stride, int store_b, bool accumulate, const FetchPlan& pa, const FetchPlan& pb) {
  __m512 acc[2][M][2];
  TileSums<M, 2>(x, {&a, &b}, chunks, {&pa, &pb}, acc);
  StoreTile<M>(acc[0], y, y_stride, kTileRows, accumulate);
  StoreTile<M>(acc[1], y + kTileRows, y_stride, store_b, accumulate);
}

// The fused gate/up and SiLU for M <= 6 x rows of a packed block (rows offset into it): gate
// and up tiles side by side, 4 M accumulators. Each gate and up value is the same chain of
// vdpbf16ps as KernelMx8 computes for it and the same row sum, then silu(gate) * up per lane
// (SiluTimes16: SiluMul's bits); the two x rows of a register are written as fp32 (y) or
// rounded into the packed output (PackRowsBf16's bits), 8 columns at `col`.
// The two weight streams are fetched ahead as KernelMx8's is (pg, pu).
template <int M>
void SwiGluKernel(const uint16_t* x, const QuadSource& g, const QuadSource& u, int64_t chunks, const GemmTask& t,
                  int64_t row, int64_t col, const FetchPlan& pg, const FetchPlan& pu) {
  __m512 acc[2][M][2];  // gate, up
  TileSums<M, 2>(x, {&g, &u}, chunks, {&pg, &pu}, acc);
  const auto& ag = acc[0];
  const auto& au = acc[1];
  static constexpr RowOrder kOrder = MakeRowOrder();
  const __m512i order = _mm512_load_si512(kOrder.idx);
#pragma GCC unroll 3
  for (int i = 0; i < M; i += 2) {
    const int j = i + 1 < M ? i + 1 : i;  // an odd last row is computed twice, written once
    const __m512 gate = _mm512_permutexvar_ps(order, SumTwoRows(ag[i][0], ag[i][1], ag[j][0], ag[j][1]));
    const __m512 up = _mm512_permutexvar_ps(order, SumTwoRows(au[i][0], au[i][1], au[j][0], au[j][1]));
    const __m512 act = SiluTimes16(gate, up);
    const int rows = i + 1 < M ? 2 : 1;
    if (t.y_packed == nullptr) {
      _mm256_storeu_ps(t.y + (row + i) * t.swiglu + col, _mm512_castps512_ps256(act));
      if (rows == 2) _mm256_storeu_ps(t.y + (row + i + 1) * t.swiglu + col, _mm512_extractf32x8_ps(act, 1));
      continue;
    }
    const __m256i bf = RoundSixteen(act);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(PackedAt(t.y_packed, t.swiglu, row + i, col)),
                     _mm256_castsi256_si128(bf));
    if (rows == 2) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(PackedAt(t.y_packed, t.swiglu, row + i + 1, col)),
                       _mm256_extracti128_si256(bf, 1));
    }
  }
}

template <int... Ms>
void SwiGluDispatch(int m, std::integer_sequence<int, Ms...>, const uint16_t* x, const QuadSource& g,
                    const QuadSource& u, int64_t chunks, const GemmTask& t, int64_t row, int64_t col,
                    const FetchPlan& pg, const FetchPlan& pu) {
  ((m == Ms + 1 ? SwiGluKernel<Ms + 1>(x, g, u, chunks, t, row, col, pg, pu) : void()), ...);
}

template <int... Ms>
void DispatchTwo(int m, std::integer_sequence<int, Ms...>, const uint16_t* x, const QuadSource& a,
                 const QuadSource& b, int64_t chunks, float* y, int64_t y_stride, int store_b, bool acc,
                 const FetchPlan& pa, const FetchPlan& pb) {
  ((m == Ms + 1 ? KernelMx16<Ms + 1>(x, a, b, chunks, y, y_stride, store_b, acc, pa, pb) : void()), ...);
}

template <int... Ms>
void Dispatch(int m, std::integer_sequence<int, Ms...>, const uint16_t* x, const QuadSource& w, int64_t chunks,
              float* y, int64_t y_stride, int store, bool acc, const FetchPlan& pf) {
  ((m == Ms + 1 ? KernelMx8<Ms + 1>(x, w, chunks, y, y_stride, store, acc, pf) : void()), ...);
}

// Row i of PackRowsBf16's layout from `row` (k floats), or zeros where row is null (padding).
void PackRowBf16(const float* row, int64_t k, int64_t i, uint16_t* out) {
  static constexpr float kNone[16] = {};  // what a padding row's masked loads point at (never read)
  const int64_t chunks = RoundUp(k, kTileCols) / kTileCols;
  uint16_t* dst = PackedAt(out, k, i, 0);
  for (int64_t c = 0; c < chunks; c += 2) {  // two 8-column chunks per rounding
    const int64_t left = row != nullptr ? k - c * kTileCols : 0;  // a padding row is all zero
    const __m256i r = RoundSixteen(row != nullptr ? row + c * kTileCols : kNone, left);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c * kBf16RowBlock * kTileCols), _mm256_castsi256_si128(r));
    if (c + 1 < chunks) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + 1) * kBf16RowBlock * kTileCols),
                       _mm256_extracti128_si256(r, 1));
    }
  }
}

}  // namespace

void PackRowsBf16(const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out) {
  for (int64_t i = i0; i < i1; ++i) PackRowBf16(i < m ? x + i * k : nullptr, k, i, out);
}

void TileAvx512Bf16SwiGlu(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* /*s*/) {
  const Rows<uint16_t> w = RowsOf<uint16_t>(t.w);
  MS_CHECK(w.tiled && t.swiglu % kTileRows == 0);  // SwiGluFusable
  const int64_t col = it.tile * kTileRows, chunks = RoundUp(t.w.cols, kTileCols) / kTileCols;
  QuadSource gate, up;
  gate.tile = w.Row(col);
  up.tile = w.Row(t.swiglu + col);
  // Six x rows at a time: 24 accumulators; items start at multiples of the 12-row block.
  constexpr int kRows = kBf16RowBlock / 2;
  const int64_t blocks = (it.m1 - it.m0 + kRows - 1) / kRows;
  for (int64_t i = it.m0; i < it.m1;) {
    const int m = static_cast<int>(std::min<int64_t>(it.m1 - i, kRows));
    const uint16_t* xb = PackedAt(x_bf16, t.w.cols, i, 0);
    const int64_t b = (i - it.m0) / kRows;
    const int64_t rows = it.m1 - it.m0;
    SwiGluDispatch(m, std::make_integer_sequence<int, kRows>{}, xb, gate, up, chunks, t, i, col,
                   PlanFetch(gate.tile, chunks, b, blocks, rows), PlanFetch(up.tile, chunks, b, blocks, rows));
    i += m;
  }
  // The item that ends the rows writes its columns of the padding rows, so every element of the
  // packed output is written once.
  if (t.y_packed != nullptr && it.m1 == t.m) {
    for (int64_t r = t.m; r < RoundUp(t.m, kBf16RowBlock); ++r) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(PackedAt(t.y_packed, t.swiglu, r, col)), _mm_setzero_si128());
    }
  }
}

namespace {

// One 8-row tile of an item (rows from r0), 12 x rows a block (KernelMx8): an item of few x rows
// (its tiles one after the other), a matrix's last tile, or weights not stored tiled.
void OneTile(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, int64_t r0) {
  const Rows<uint16_t> w = RowsOf<uint16_t>(t.w);
  const int64_t rows = t.w.rows, cols = t.w.cols;
  const int64_t nrows = std::min<int64_t>(kTileRows, rows - r0), chunks = RoundUp(cols, kTileCols) / kTileCols;
  QuadSource src;
  src.cols = cols;
  if (w.tiled) {
    src.tile = w.Row(r0);
  } else {
    for (int64_t j = 0; j < kTileRows; ++j) src.row[j] = w.Row(r0 + std::min<int64_t>(j, nrows - 1));
  }
  // Along a tiled layout the next tile follows in memory (the item's second, then the next item's
  // first: the tiles this thread takes next): fetch it while this one computes.
  const int64_t blocks = (it.m1 - it.m0 + kBf16RowBlock - 1) / kBf16RowBlock;
  for (int64_t i = it.m0; i < it.m1;) {
    // Items start at multiples of the row block, so row i opens block i / 12 (PackRowsBf16).
    const int m = static_cast<int>(std::min<int64_t>(it.m1 - i, kBf16RowBlock));
    const uint16_t* xb = PackedAt(x_bf16, cols, i, 0);
    const FetchPlan fetch = w.tiled ? PlanFetch(src.tile, chunks, (i - it.m0) / kBf16RowBlock, blocks, it.m1 - it.m0)
                                  : FetchPlan{};
    Dispatch(m, std::make_integer_sequence<int, kBf16RowBlock>{}, xb, src, chunks, t.y + i * rows + r0, rows,
             static_cast<int>(nrows), t.accumulate, fetch);
    i += m;
  }
}

// Two tiles of an item stored tiled (rows r0 .. r0 + 16, the second may be short), 6 x rows a
// block (KernelMx16). Each tile's stream is fetched as KernelMx8's is, later blocks fetching the
// same tile of the next item (two tiles on).
void TwoTiles(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, int64_t r0) {
  const Rows<uint16_t> w = RowsOf<uint16_t>(t.w);
  const int64_t rows = t.w.rows, cols = t.w.cols, chunks = RoundUp(cols, kTileCols) / kTileCols;
  QuadSource a, b;
  a.tile = w.Row(r0);
  b.tile = w.Row(r0 + kTileRows);
  const int store_b = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0 - kTileRows));
  constexpr int kRows = kBf16RowBlock / 2;
  const int64_t n = it.m1 - it.m0, blocks = (n + kRows - 1) / kRows, span = 2 * chunks;
  for (int64_t i = it.m0; i < it.m1;) {
    const int m = static_cast<int>(std::min<int64_t>(it.m1 - i, kRows));
    const int64_t block = (i - it.m0) / kRows;
    DispatchTwo(m, std::make_integer_sequence<int, kRows>{}, PackedAt(x_bf16, cols, i, 0), a, b, chunks,
                t.y + i * rows + r0, rows, store_b, t.accumulate, PlanFetch(a.tile, span, block, blocks, n),
                PlanFetch(b.tile, span, block, blocks, n));
    i += m;
  }
}

}  // namespace

// Items of fewer x rows run their tiles one after the other, 12 rows a block: two tiles at once
// take 6-row blocks, so twice the passes over the weights, which costs where they stream from
// DRAM (kernels_bench on the Zen 5: batch 1 0.92-0.95x, 16 rows of an 8192 x 4096 weight 0.95x);
// from 32 rows on the products dominate. Either way, the same bits.
constexpr int64_t kTwoTileMinRows = 32;

void TileAvx512Bf16(const GemmTask& t, const uint16_t* x_bf16, const GemmItem& it, GemmScratch* /*s*/) {
  const int64_t r0 = it.tile * kBf16ItemRows, rows = t.w.rows;
  if (RowsOf<uint16_t>(t.w).tiled && r0 + kTileRows < rows && it.m1 - it.m0 >= kTwoTileMinRows) {
    return TwoTiles(t, x_bf16, it, r0);
  }
  for (int64_t r = r0; r < std::min(rows, r0 + kBf16ItemRows); r += kTileRows) OneTile(t, x_bf16, it, r);
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
