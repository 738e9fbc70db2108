// Weight layouts on the host side: the bytes a matrix of a layout takes, and conversion between
// layouts (done once, when weights are uploaded or moved between backends).
//
// kTiled8 stores a [rows, cols] matrix as ceil(rows / 8) tiles of 8 rows; a tile is
// [ceil(cols / 8)][8 rows][8 cols], zero-padded past the last row and column. A GEMM that
// streams a tile reads one contiguous run of memory while it computes 8 rows' dot products,
// 8 columns at a time, which is what keeps the hardware prefetchers ahead of a decode step.
//
// kAmxTiles stores it as ceil(rows / 32) groups of 32 rows; a group is, for each step of 32
// columns, two AMX B tiles (rows 0-15 of the group, then 16-31) of 16 column pairs x 16 rows x 2:
// element (r, c) of a group sits at pair (c % 32) / 2, row r % 16, half c % 2. The AMX kernel
// loads its B tiles straight from the weights (one contiguous KiB each, a group's K steps in
// order) instead of repacking them for every work item. Zero-padded past the last row and column.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace moeserve {

inline constexpr int64_t kTileRows = 8;  // rows per kTiled8 tile
inline constexpr int64_t kTileCols = 8;  // columns per chunk of a tile

inline constexpr int64_t kAmxGroupRows = 32;  // rows per kAmxTiles group (two B tiles)
inline constexpr int64_t kAmxGroupCols = 32;  // columns per K step of a group (64 bytes a tile row)

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

inline const char* WeightLayoutName(WeightLayout layout) {
  if (layout == WeightLayout::kRowMajor) return "row-major";
  return layout == WeightLayout::kAmxTiles ? "amx-tiles" : "tiled8";
}

// Elements (padding included) a matrix takes in `layout`.
int64_t WeightStorageElems(WeightLayout layout, int64_t rows, int64_t cols);

// Element index of (row, col) in `layout`.
inline int64_t WeightIndex(WeightLayout layout, int64_t rows, int64_t cols, int64_t row,
                           int64_t col) {
  if (layout == WeightLayout::kRowMajor) return row * cols + col;
  if (layout == WeightLayout::kAmxTiles) {
    const int64_t steps = RoundUp(cols, kAmxGroupCols) / kAmxGroupCols, half = (row % kAmxGroupRows) / 16;
    const int64_t tile = ((row / kAmxGroupRows) * steps + col / kAmxGroupCols) * 2 + half;
    return tile * 512 + ((col % kAmxGroupCols) / 2) * 32 + (row % 16) * 2 + col % 2;
  }
  const int64_t cols8 = RoundUp(cols, kTileCols);
  return (row / kTileRows) * kTileRows * cols8 + (col / kTileCols) * (kTileRows * kTileCols) +
         (row % kTileRows) * kTileCols + col % kTileCols;
}

// How many consecutive columns of a row are contiguous in `layout` from a column that is a
// multiple of it: the run a reader can copy at once.
inline int64_t WeightRowRun(WeightLayout layout, int64_t cols) {
  if (layout == WeightLayout::kRowMajor) return cols;
  return layout == WeightLayout::kAmxTiles ? 2 : kTileCols;
}

// Reorders `rows` x `cols` elements of `elem_bytes` each from row-major `src` into `layout` at
// `dst` (WeightStorageElems elements; padding zeroed), or back.
void PackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols, size_t elem_bytes,
                void* dst);
void UnpackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols,
                  size_t elem_bytes, void* dst);

}  // namespace moeserve
