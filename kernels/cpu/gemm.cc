// CPU GEMM kernels (see gemm.h).
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/vec8.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kLanes = 8;
static_assert(kLanes == kTileCols);

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
    return base + (j / kTileRows) * kTileRows * RoundUp(cols, kTileCols) +
           (j % kTileRows) * kTileCols;
  }
};

// The register-blocked kernels (1x8, 2x4, 3x4). Each computes whole dot products of x rows
// with w rows:
// rows by pointer (rows past the matrix point at a valid one and are not stored), chunk c of a
// w row at w[j] + c * cs. The last partial chunk is read through zero-padded copies (tiled
// weights are zero-padded in memory already). Written out register by register: the compiler
// then keeps every accumulator in a register (as arrays in loops, GCC spilled them).

// The last partial chunk of a row (its first `rem` elements at p), zero-padded.
template <typename T>
inline V8 LoadTail(const T* p, int64_t rem) {
  T t[kLanes] = {};
  std::memcpy(t, p, static_cast<size_t>(rem) * sizeof(T));
  return Load(t);
}

// 1 x row by 8 w rows (decode). `pf`: prefetched ahead along the tile, 64 * sizeof(T) bytes
// (the whole tile's chunk) per chunk.
template <typename T>
void Kernel1x8(const float* x, const T* const* w, int64_t cs, int64_t cols, bool w_padded, float* y,
               int store_cols, bool accumulate, const char* pf) {
  V8 a0 = Zero(), a1 = Zero(), a2 = Zero(), a3 = Zero(), a4 = Zero(), a5 = Zero(), a6 = Zero(),
     a7 = Zero();
  const T *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5], *w6 = w[6],
          *w7 = w[7];
  const int64_t full = cols / kLanes;
  constexpr int64_t kPfBytes = kTileRows * kTileCols * sizeof(T);
  for (int64_t c = 0; c < full; ++c) {
    if (pf != nullptr) {
      for (int64_t b = 0; b < kPfBytes; b += 64) Prefetch(pf + c * kPfBytes + b);
    }
    const V8 xv = Load(x + c * kLanes);
    const int64_t o = c * cs;
    a0 = Fma(xv, Load(w0 + o), a0);
    a1 = Fma(xv, Load(w1 + o), a1);
    a2 = Fma(xv, Load(w2 + o), a2);
    a3 = Fma(xv, Load(w3 + o), a3);
    a4 = Fma(xv, Load(w4 + o), a4);
    a5 = Fma(xv, Load(w5 + o), a5);
    a6 = Fma(xv, Load(w6 + o), a6);
    a7 = Fma(xv, Load(w7 + o), a7);
  }
  if (const int64_t rem = cols - full * kLanes; rem > 0) {
    const V8 xv = LoadTail(x + full * kLanes, rem);
    const int64_t o = full * cs;
    auto wl = [&](const T* p) { return w_padded ? Load(p + o) : LoadTail(p + o, rem); };
    a0 = Fma(xv, wl(w0), a0);
    a1 = Fma(xv, wl(w1), a1);
    a2 = Fma(xv, wl(w2), a2);
    a3 = Fma(xv, wl(w3), a3);
    a4 = Fma(xv, wl(w4), a4);
    a5 = Fma(xv, wl(w5), a5);
    a6 = Fma(xv, wl(w6), a6);
    a7 = Fma(xv, wl(w7), a7);
  }
  const V8 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int j = 0; j < store_cols; ++j) {
    const float s = Reduce(acc[j]);
    y[j] = accumulate ? y[j] + s : s;
  }
}

// 2 x rows by 4 w rows: 8 accumulators, 2 x chunks and a w chunk in 11 of AVX2's 16 registers,
// so each chunk is loaded once: 6 loads for 8 FMAs (compute-bound shapes).
template <typename T>
void Kernel2x4(const float* x0, const float* x1, const T* const* w, int64_t cs, int64_t cols,
               bool w_padded, float* y0, float* y1, int store_cols, bool accumulate,
               const char* pf) {
  V8 a00 = Zero(), a01 = Zero(), a02 = Zero(), a03 = Zero(), a10 = Zero(), a11 = Zero(),
     a12 = Zero(), a13 = Zero();
  const T *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  const int64_t full = cols / kLanes;
  constexpr int64_t kPfBytes = kTileRows * kTileCols * sizeof(T);
  for (int64_t c = 0; c < full; ++c) {
    if (pf != nullptr) {
      for (int64_t b = 0; b < kPfBytes; b += 64) Prefetch(pf + c * kPfBytes + b);
    }
    const V8 xa = Load(x0 + c * kLanes), xb = Load(x1 + c * kLanes);
    const int64_t o = c * cs;
    V8 wv = Load(w0 + o);
    a00 = Fma(xa, wv, a00);
    a10 = Fma(xb, wv, a10);
    wv = Load(w1 + o);
    a01 = Fma(xa, wv, a01);
    a11 = Fma(xb, wv, a11);
    wv = Load(w2 + o);
    a02 = Fma(xa, wv, a02);
    a12 = Fma(xb, wv, a12);
    wv = Load(w3 + o);
    a03 = Fma(xa, wv, a03);
    a13 = Fma(xb, wv, a13);
  }
  if (const int64_t rem = cols - full * kLanes; rem > 0) {
    const V8 xa = LoadTail(x0 + full * kLanes, rem), xb = LoadTail(x1 + full * kLanes, rem);
    const int64_t o = full * cs;
    auto wl = [&](const T* p) { return w_padded ? Load(p + o) : LoadTail(p + o, rem); };
    V8 wv = wl(w0);
    a00 = Fma(xa, wv, a00);
    a10 = Fma(xb, wv, a10);
    wv = wl(w1);
    a01 = Fma(xa, wv, a01);
    a11 = Fma(xb, wv, a11);
    wv = wl(w2);
    a02 = Fma(xa, wv, a02);
    a12 = Fma(xb, wv, a12);
    wv = wl(w3);
    a03 = Fma(xa, wv, a03);
    a13 = Fma(xb, wv, a13);
  }
  const V8 r0[4] = {a00, a01, a02, a03}, r1[4] = {a10, a11, a12, a13};
  for (int j = 0; j < store_cols; ++j) {
    const float s0 = Reduce(r0[j]);
    y0[j] = accumulate ? y0[j] + s0 : s0;
    if (y1 != nullptr) {
      const float s1 = Reduce(r1[j]);
      y1[j] = accumulate ? y1[j] + s1 : s1;
    }
  }
}

// 3 x rows by 4 w rows: 12 accumulators, 3 x chunks and the w chunk fill AVX2's 16 registers;
// 7 loads for 12 FMAs.
template <typename T>
void Kernel3x4(const float* x0, const float* x1, const float* x2, const T* const* w, int64_t cs,
               int64_t cols, bool w_padded, float* const* y, int store_rows, int store_cols,
               bool accumulate, const char* pf) {
  V8 a00 = Zero(), a01 = Zero(), a02 = Zero(), a03 = Zero(), a10 = Zero(), a11 = Zero(),
     a12 = Zero(), a13 = Zero(), a20 = Zero(), a21 = Zero(), a22 = Zero(), a23 = Zero();
  const T *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  const int64_t full = cols / kLanes;
  // One chunk: each w chunk is loaded into a register once (Pin keeps the compiler from folding
  // it into the FMAs as a memory operand three times) and used by the three x rows.
  auto step = [&](V8 xa, V8 xb, V8 xc, auto load_w) {
    V8 wv = load_w(w0);
    Pin(wv);
    a00 = Fma(xa, wv, a00);
    a10 = Fma(xb, wv, a10);
    a20 = Fma(xc, wv, a20);
    wv = load_w(w1);
    Pin(wv);
    a01 = Fma(xa, wv, a01);
    a11 = Fma(xb, wv, a11);
    a21 = Fma(xc, wv, a21);
    wv = load_w(w2);
    Pin(wv);
    a02 = Fma(xa, wv, a02);
    a12 = Fma(xb, wv, a12);
    a22 = Fma(xc, wv, a22);
    wv = load_w(w3);
    Pin(wv);
    a03 = Fma(xa, wv, a03);
    a13 = Fma(xb, wv, a13);
    a23 = Fma(xc, wv, a23);
  };
  constexpr int64_t kPfBytes = kTileRows * kTileCols * sizeof(T);
  for (int64_t c = 0; c < full; ++c) {
    if (pf != nullptr) {
      for (int64_t b = 0; b < kPfBytes; b += 64) Prefetch(pf + c * kPfBytes + b);
    }
    const int64_t o = c * cs;
    step(Load(x0 + c * kLanes), Load(x1 + c * kLanes), Load(x2 + c * kLanes),
         [&](const T* p) { return Load(p + o); });
  }
  if (const int64_t rem = cols - full * kLanes; rem > 0) {
    const int64_t o = full * cs;
    step(LoadTail(x0 + full * kLanes, rem), LoadTail(x1 + full * kLanes, rem),
         LoadTail(x2 + full * kLanes, rem),
         [&](const T* p) { return w_padded ? Load(p + o) : LoadTail(p + o, rem); });
  }
  const V8 r[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
  for (int i = 0; i < store_rows; ++i) {
    for (int j = 0; j < store_cols; ++j) {
      const float s = Reduce(r[i][j]);
      y[i][j] = accumulate ? y[i][j] + s : s;
    }
  }
}

// Rows [r0, r0 + 8) of w (those below `rows`) against x rows [m0, m1).
template <typename T>
void Tile(const float* x, int64_t m0, int64_t m1, const Rows<T>& w, int64_t rows, int64_t r0,
          float* y, bool accumulate, const char* prefetch) {
  const int64_t cols = w.cols, nrows = std::min<int64_t>(kTileRows, rows - r0);
  const T* wr[kTileRows];
  for (int64_t j = 0; j < kTileRows; ++j) wr[j] = w.Row(r0 + std::min<int64_t>(j, nrows - 1));
  const int lo = static_cast<int>(std::min<int64_t>(nrows, 4)), hi = static_cast<int>(nrows) - lo;
  for (int64_t i = m0; i < m1;) {
    if (m1 - i == 1) {
      Kernel1x8<T>(x + i * cols, wr, w.chunk_stride, cols, w.tiled, y + i * rows + r0,
                   static_cast<int>(nrows), accumulate, prefetch);
      i += 1;
      continue;
    }
    if (m1 - i >= 3) {
      const float *xa = x + i * cols, *xb = xa + cols, *xc = xb + cols;
      float* yr[3] = {y + i * rows + r0, y + (i + 1) * rows + r0, y + (i + 2) * rows + r0};
      Kernel3x4<T>(xa, xb, xc, wr, w.chunk_stride, cols, w.tiled, yr, 3, lo, accumulate,
                   i == m0 ? prefetch : nullptr);
      if (hi > 0) {
        float* yh[3] = {yr[0] + 4, yr[1] + 4, yr[2] + 4};
        Kernel3x4<T>(xa, xb, xc, wr + 4, w.chunk_stride, cols, w.tiled, yh, 3, hi, accumulate,
                     nullptr);
      }
      i += 3;
      continue;
    }
    const float *xa = x + i * cols, *xb = x + (i + 1) * cols;
    float *ya = y + i * rows + r0, *yb = y + (i + 1) * rows + r0;
    Kernel2x4<T>(xa, xb, wr, w.chunk_stride, cols, w.tiled, ya, yb, lo, accumulate,
                 i == m0 ? prefetch : nullptr);
    if (hi > 0)
      Kernel2x4<T>(xa, xb, wr + 4, w.chunk_stride, cols, w.tiled, ya + 4, yb + 4, hi, accumulate,
                   nullptr);
    i += 2;
  }
}

// Up to this many x rows a GEMM streams its stored weights directly; above, each tile is
// widened to fp32 once and reused by every x row (the same arithmetic either way).
constexpr int64_t kDirectMaxRows = 16;  // measured: direct is faster to ~16 rows, widened from ~32
// x rows per work item of a large GEMM (even: the kernel takes 2 rows at a time).
constexpr int64_t kRowChunk = 48;
// How far ahead of the tile being computed the stream is prefetched.
constexpr int64_t kPrefetchBytes = 2048;

struct Item {
  int32_t task;
  int64_t tile;
  int64_t m0, m1;
};

template <typename T>
Rows<T> RowsOf(const WeightRef& w) {
  const bool tiled = w.layout == WeightLayout::kTiled8;
  return Rows<T>{static_cast<const T*>(w.data), w.cols, tiled ? kTileRows * kTileCols : kLanes,
                 tiled};
}

// A thread's fp32 copy of the tile it works on (64-byte aligned: split loads cost).
struct Widened {
  std::vector<float> storage;
  float* data = nullptr;
  const void* from = nullptr;  // the weight and tile it holds
  int64_t tile = -1;
  // Room for n floats, not cleared: every element a kernel reads is written by the widening
  // (rows past the matrix are never read; see Tile).
  float* Reset(size_t n) {
    if (storage.size() < n + 16) storage.resize(n + 16);
    data = storage.data() +
           (16 - (reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float)) % 16) % 16;
    return data;
  }
};

template <typename T>
void RunItem(const GemmTask& t, const Item& it, Widened* widened) {
  const Rows<T> w = RowsOf<T>(t.w);
  const int64_t r0 = it.tile * kTileRows;
  if (t.m <= kDirectMaxRows || std::is_same_v<T, float>) {
    // Prefetch only along a tiled layout, where the next tile follows this one in memory.
    const char* pf = w.tiled ? reinterpret_cast<const char*>(w.Row(r0)) + kPrefetchBytes : nullptr;
    Tile<T>(t.x, it.m0, it.m1, w, t.w.rows, r0, t.y, t.accumulate, pf);
    return;
  }
  // Widen the 8-row tile to fp32, tiled, once per run of items on the same tile.
  const int64_t cols8 = RoundUp(t.w.cols, kTileCols);
  if (widened->from != t.w.data || widened->tile != it.tile) {
    widened->Reset(static_cast<size_t>(kTileRows * cols8));
    const int64_t nrows = std::min<int64_t>(kTileRows, t.w.rows - r0);
    const int64_t full = t.w.cols / kTileCols, rem = t.w.cols - full * kTileCols;
    for (int64_t j = 0; j < nrows; ++j) {
      const T* src = w.Row(r0 + j);
      float* dst = widened->data + j * kTileCols;
      for (int64_t c = 0; c < full; ++c)
        Store(dst + c * kTileRows * kTileCols, Load(src + c * w.chunk_stride));
      if (rem > 0) {
        T tail[kTileCols] = {};
        std::memcpy(tail, src + full * w.chunk_stride, static_cast<size_t>(rem) * sizeof(T));
        Store(dst + full * kTileRows * kTileCols, Load(tail));
      }
    }
    widened->from = t.w.data;
    widened->tile = it.tile;
  }
  // The widened tile is rows [r0, r0 + 8) of a tiled fp32 matrix with t.w.rows rows.
  const Rows<float> f{widened->data, t.w.cols, kTileRows * kTileCols, true, r0};
  // While this tile computes, the next one streams in (the widening above read this one cold).
  const char* next = w.tiled && r0 + kTileRows < t.w.rows
                         ? reinterpret_cast<const char*>(w.Row(r0 + kTileRows))
                         : nullptr;
  Tile<float>(t.x, it.m0, it.m1, f, t.w.rows, r0, t.y, t.accumulate, next);
}

}  // namespace

const char* GemmInstructionKind() {
#if MOESERVE_VEC8_AVX2
  return "f32-fma-256";
#else
  return "f32-scalar";
#endif
}

void RunGemms(ThreadPool& pool, std::span<const GemmTask> tasks) {
  std::vector<Item> items;
  double work = 0;
  for (size_t k = 0; k < tasks.size(); ++k) {
    const GemmTask& t = tasks[k];
    if (t.m == 0 || t.w.rows == 0) continue;
    MS_CHECK(t.w.dtype == DType::kF32 || t.w.dtype == DType::kBF16);
    const int64_t tiles = (t.w.rows + kTileRows - 1) / kTileRows;
    const int64_t chunk = t.m <= kDirectMaxRows ? t.m : kRowChunk;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      for (int64_t m0 = 0; m0 < t.m; m0 += chunk) {
        items.push_back({static_cast<int32_t>(k), tile, m0, std::min(t.m, m0 + chunk)});
      }
    }
    work += static_cast<double>(t.m) * t.w.rows * t.w.cols;
  }
  if (items.empty()) return;
  // Enough items per part that a part streams at least ~64 KiB of weights or does ~2 MFLOP.
  const double per_item = work / static_cast<double>(items.size());
  const int64_t grain =
      std::max<int64_t>(1, static_cast<int64_t>(32768.0 / std::max(1.0, per_item)));
  pool.ParallelFor(static_cast<int64_t>(items.size()), grain, [&](int64_t b, int64_t e) {
    Widened widened;
    for (int64_t n = b; n < e; ++n) {
      const Item& it = items[static_cast<size_t>(n)];
      const GemmTask& t = tasks[static_cast<size_t>(it.task)];
      if (t.w.dtype == DType::kF32) {
        RunItem<float>(t, it, &widened);
      } else {
        RunItem<uint16_t>(t, it, &widened);
      }
    }
  });
}

void BlasGemm(ThreadPool& pool, const GemmTask& t) {
  const int64_t n = t.w.rows, k = t.w.cols;
  if (t.m == 0 || n == 0) return;
  const float beta = t.accumulate ? 1.0f : 0.0f;
  constexpr int64_t kBlock = 64;  // rows of w per sgemm, a multiple of the tile height
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const size_t eb = DTypeSize(t.w.dtype);
  pool.ParallelFor(blocks, 1, [&](int64_t bb, int64_t be) {
    std::vector<float> block(static_cast<size_t>(kBlock * k));
    std::vector<uint8_t> row(static_cast<size_t>(k) * eb);
    for (int64_t b = bb; b < be; ++b) {
      const int64_t r0 = b * kBlock, rows = std::min(kBlock, n - r0);
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t c = 0; c < k;
             c += kTileCols) {  // runs of 8 columns are contiguous in both layouts
          const int64_t at = WeightIndex(t.w.layout, n, k, r0 + j, c);
          std::memcpy(row.data() + c * eb, static_cast<const uint8_t*>(t.w.data) + at * eb,
                      static_cast<size_t>(std::min<int64_t>(kTileCols, k - c)) * eb);
        }
        ConvertToF32(row.data(), t.w.dtype, static_cast<size_t>(k), block.data() + j * k);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t.m),
                  static_cast<int>(rows), static_cast<int>(k), 1.0f, t.x, static_cast<int>(k),
                  block.data(), static_cast<int>(k), beta, t.y + r0, static_cast<int>(n));
    }
  });
}

}  // namespace moeserve::cpu_fast
