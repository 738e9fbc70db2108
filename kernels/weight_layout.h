// Weight layouts on the host side: the bytes a matrix of a layout takes, and conversion between
// layouts (done once, when weights are uploaded or moved between backends).
//
// kTiled8 stores a [rows, cols] matrix as ceil(rows / 8) tiles of 8 rows; a tile is
// [ceil(cols / 8)][8 rows][8 cols], zero-padded past the last row and column. A GEMM that
// streams a tile reads one contiguous run of memory while it computes 8 rows' dot products,
// 8 columns at a time, which is what keeps the hardware prefetchers ahead of a decode step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace moeserve {

inline constexpr int64_t kTileRows = 8;  // rows per kTiled8 tile
inline constexpr int64_t kTileCols = 8;  // columns per chunk of a tile

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Elements (padding included) a matrix takes in `layout`.
int64_t WeightStorageElems(WeightLayout layout, int64_t rows, int64_t cols);

// Element index of (row, col) in `layout`.
inline int64_t WeightIndex(WeightLayout layout, int64_t rows, int64_t cols, int64_t row,
                           int64_t col) {
  if (layout == WeightLayout::kRowMajor) return row * cols + col;
  const int64_t cols8 = RoundUp(cols, kTileCols);
  return (row / kTileRows) * kTileRows * cols8 + (col / kTileCols) * (kTileRows * kTileCols) +
         (row % kTileRows) * kTileCols + col % kTileCols;
}

// Reorders `rows` x `cols` elements of `elem_bytes` each from row-major `src` into `layout` at
// `dst` (WeightStorageElems elements; padding zeroed), or back.
void PackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols, size_t elem_bytes,
                void* dst);
void UnpackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols,
                  size_t elem_bytes, void* dst);

}  // namespace moeserve
