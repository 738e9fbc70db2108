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
