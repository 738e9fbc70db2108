// Weight layout conversion.
#include "kernels/weight_layout.h"

#include <algorithm>
#include <cstring>

namespace moeserve {

int64_t WeightStorageElems(WeightLayout layout, int64_t rows, int64_t cols) {
  if (layout == WeightLayout::kRowMajor) return rows * cols;
  if (layout == WeightLayout::kAmxTiles) return RoundUp(rows, kAmxGroupRows) * RoundUp(cols, kAmxGroupCols);
  return RoundUp(rows, kTileRows) * RoundUp(cols, kTileCols);
}

namespace {

// Calls copy(row_major_index, amx_index, elements) for every column pair of a kAmxTiles matrix,
// row by row. A group's 16 rows of one half write the same tiles (1 KiB apart per K step), which
// stay in cache while those rows pass, and only a row's start is indexed from scratch (every
// element's index doubled a model's load time).
template <typename Copy>
void ForEachAmxPair(int64_t rows, int64_t cols, Copy copy) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tile0 = WeightIndex(WeightLayout::kAmxTiles, rows, cols, r, 0);
    for (int64_t c = 0; c < cols; c += 2) {
      // Column c sits in K step c / 32 (two tiles, 1024 elements, per step), pair (c % 32) / 2.
      const int64_t at = tile0 + (c / kAmxGroupCols) * 1024 + ((c % kAmxGroupCols) / 2) * 32;
      copy(r * cols + c, at, c + 1 < cols ? 2 : 1);
    }
  }
}

// Copies one pair (or a last lone column) of EB-byte elements; the fixed sizes compile to one
// load and one store.
template <size_t EB>
void CopyPair(uint8_t* to, const uint8_t* from, int64_t n) {
  if (n == 2) {
    std::memcpy(to, from, 2 * EB);
  } else {
    std::memcpy(to, from, EB);
  }
}

template <size_t EB>
void ConvertAmx(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst, bool pack) {
  if (pack) {
    ForEachAmxPair(rows, cols, [&](int64_t linear, int64_t at, int64_t n) { CopyPair<EB>(dst + at * EB, src + linear * EB, n); });
  } else {
    ForEachAmxPair(rows, cols, [&](int64_t linear, int64_t at, int64_t n) { CopyPair<EB>(dst + linear * EB, src + at * EB, n); });
  }
}

// Copies a row's contiguous runs (WeightRowRun) between row-major and `layout`, one direction or
// the other.
void Convert(WeightLayout layout, const void* src, int64_t rows, int64_t cols, size_t eb, void* dst,
             bool pack) {
  if (layout == WeightLayout::kRowMajor) {
    std::memcpy(dst, src, static_cast<size_t>(rows * cols) * eb);
    return;
  }
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (pack) std::memset(d, 0, static_cast<size_t>(WeightStorageElems(layout, rows, cols)) * eb);
  if (layout == WeightLayout::kAmxTiles && eb == 2) return ConvertAmx<2>(s, rows, cols, d, pack);
  if (layout == WeightLayout::kAmxTiles && eb == 4) return ConvertAmx<4>(s, rows, cols, d, pack);
  const int64_t step = WeightRowRun(layout, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += step) {
      const size_t run = static_cast<size_t>(std::min<int64_t>(step, cols - c)) * eb;
      const size_t tiled = static_cast<size_t>(WeightIndex(layout, rows, cols, r, c)) * eb;
      const size_t linear = static_cast<size_t>(r * cols + c) * eb;
      if (pack) {
        std::memcpy(d + tiled, s + linear, run);
      } else {
        std::memcpy(d + linear, s + tiled, run);
      }
    }
  }
}

}  // namespace

void PackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols, size_t elem_bytes,
                void* dst) {
  Convert(layout, src, rows, cols, elem_bytes, dst, /*pack=*/true);
}

void UnpackWeight(WeightLayout layout, const void* src, int64_t rows, int64_t cols,
                  size_t elem_bytes, void* dst) {
  Convert(layout, src, rows, cols, elem_bytes, dst, /*pack=*/false);
}

}  // namespace moeserve
