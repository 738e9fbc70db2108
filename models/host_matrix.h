// A weight matrix on the host while it is read, derived and quantized: fp32 values, or FP8
// bytes with one scale per row and 128 columns (kernels/backend.h's WeightRef convention).
// Checkpoint FP8 tensors (float8_e4m3fn with a `weight_scale_inv` of 128 x 128 block scales)
// are read exactly as stored, never rounded through another type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/safetensors.h"

namespace moeserve {

struct HostMatrix {
  int64_t rows = 0, cols = 0;
  bool fp8 = false;
  std::vector<float> values;   // [rows, cols] unless fp8
  std::vector<uint8_t> bytes;  // [rows, cols] when fp8
  std::vector<float> scales;   // [rows, ScaleGroups()] when fp8

  int64_t ScaleGroups() const;
  // Rows [begin, begin + count), row i taken from begin + pick(i).
  template <typename Pick>
  HostMatrix PickRows(int64_t begin, int64_t count, Pick pick) const {
    HostMatrix out;
    out.rows = count;
    out.cols = cols;
    out.fp8 = fp8;
    const int64_t g = ScaleGroups();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = begin + pick(i);
      if (fp8) {
        out.bytes.insert(out.bytes.end(), bytes.begin() + r * cols, bytes.begin() + (r + 1) * cols);
        out.scales.insert(out.scales.end(), scales.begin() + r * g, scales.begin() + (r + 1) * g);
      } else {
        out.values.insert(out.values.end(), values.begin() + r * cols, values.begin() + (r + 1) * cols);
      }
    }
    return out;
  }
  // The transpose of rows [begin, begin + count). FP8: the rows of each 128-row group of the
  // result's columns must share their scales (as a checkpoint's 128 x 128 blocks do when
  // `begin` is aligned to them); otherwise an error naming `what`.
  absl::StatusOr<HostMatrix> TransposedRows(int64_t begin, int64_t count, const std::string& what) const;
  // Appends `other`'s rows (same columns, both FP8 or neither).
  absl::Status Append(const HostMatrix& other, const std::string& what);
};

// Reads `weight` as fp32, or, with its block scales `scale` (null when it has none), as FP8.
// Refuses FP8 without scales, scales on a non-FP8 weight, a scale tensor of the wrong shape, a
// scale that is NaN, infinite or not positive, and a NaN weight byte, naming the tensor.
absl::StatusOr<HostMatrix> ReadHostMatrix(const TensorView& weight, const TensorView* scale);

// Quantizes fp32 values to FP8 by 128 x 128 blocks (scale = the block's largest magnitude /
// 448), as DeepSeek's checkpoints are; an all-zero block gets scale 1.
HostMatrix QuantizeFp8(const HostMatrix& m);

}  // namespace moeserve
