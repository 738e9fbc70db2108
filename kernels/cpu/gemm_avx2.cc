// The exact GEMM kernels on AVX2 + FMA (8 fp32 lanes, vec8.h): the reference order of gemm.h.
// Compiled for the build's baseline (x86-64-v3), so they run on every CPU the project targets.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kLanes = 8;
static_assert(kLanes == kTileCols);

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

template <typename T>
void RunItem(const GemmTask& t, const GemmItem& it, GemmScratch* widened) {
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

void TileAvx2(const GemmTask& t, const uint16_t* /*x_bf16*/, const GemmItem& it, GemmScratch* s) {
  if (t.w.dtype == DType::kF32) {
    RunItem<float>(t, it, s);
  } else {
    RunItem<uint16_t>(t, it, s);
  }
}

}  // namespace moeserve::cpu_fast
