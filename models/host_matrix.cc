// Host matrices: FP8 reading, derivation and quantization.
#include "models/host_matrix.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/backend.h"

namespace moeserve {
namespace {

constexpr int64_t kBlock = kFp8ScaleCols;  // 128 x 128 blocks in checkpoints
int64_t Groups(int64_t n) { return (n + kBlock - 1) / kBlock; }

}  // namespace

int64_t HostMatrix::ScaleGroups() const { return Groups(cols); }

absl::StatusOr<HostMatrix> HostMatrix::TransposedRows(int64_t begin, int64_t count, const std::string& what) const {
  HostMatrix out;
  out.rows = cols;
  out.cols = count;
  out.fp8 = fp8;
  if (!fp8) {
    out.values.resize(static_cast<size_t>(cols * count));
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t j = 0; j < cols; ++j) out.values[j * count + i] = values[(begin + i) * cols + j];
    }
    return out;
  }
  const int64_t g = ScaleGroups(), out_g = Groups(count);
  out.bytes.resize(static_cast<size_t>(cols * count));
  out.scales.resize(static_cast<size_t>(cols * out_g));
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < cols; ++j) out.bytes[j * count + i] = bytes[(begin + i) * cols + j];
  }
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t og = 0; og < out_g; ++og) {
      const int64_t first = begin + og * kBlock, last = begin + std::min(count, (og + 1) * kBlock);
      const float s = scales[first * g + j / kBlock];
      for (int64_t r = first; r < last; ++r) {
        if (scales[r * g + j / kBlock] != s) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": rows ", first, "..", last - 1, " do not share one FP8 scale, so they cannot be transposed "
              "into one 128-column group (the slice is not aligned to the checkpoint's 128 x 128 blocks)"));
        }
      }
      out.scales[j * out_g + og] = s;
    }
  }
  return out;
}

absl::Status HostMatrix::Append(const HostMatrix& other, const std::string& what) {
  if (rows == 0) {
    *this = other;
    return absl::OkStatus();
  }
  if (other.cols != cols || other.fp8 != fp8) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot be stacked (columns or FP8-ness differ)"));
  }
  rows += other.rows;
  values.insert(values.end(), other.values.begin(), other.values.end());
  bytes.insert(bytes.end(), other.bytes.begin(), other.bytes.end());
  scales.insert(scales.end(), other.scales.begin(), other.scales.end());
  return absl::OkStatus();
}

absl::StatusOr<HostMatrix> ReadHostMatrix(const TensorView& w, const TensorView* scale) {
  HostMatrix m;
  m.rows = w.shape.size() == 2 ? w.shape[0] : 1;
  m.cols = w.shape.back();
  const bool fp8 = w.dtype == DType::kF8E4M3;
  if (fp8 && scale == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", w.name, "\" is FP8 but the checkpoint has no \"",
                                                   w.name, "_scale_inv\" for it"));
  }
  if (!fp8 && scale != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", scale->name, "\" scales \"", w.name, "\", which is ",
                                                   DTypeSafetensorsName(w.dtype), " rather than F8_E4M3"));
  }
  if (!fp8) {
    m.values.resize(static_cast<size_t>(w.numel()));
    ConvertToF32(w.data, w.dtype, m.values.size(), m.values.data());
    return m;
  }
  const int64_t br = Groups(m.rows), bc = Groups(m.cols);
  if (scale->shape != std::vector<int64_t>{br, bc}) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", scale->name, "\" has shape [",
                                                   absl::StrJoin(scale->shape, ", "), "]; the 128 x 128 blocks of \"",
                                                   w.name, "\" [", m.rows, ", ", m.cols, "] need [", br, ", ", bc, "]"));
  }
  std::vector<float> block(static_cast<size_t>(br * bc));
  ConvertToF32(scale->data, scale->dtype, block.size(), block.data());
  for (size_t i = 0; i < block.size(); ++i) {
    if (!std::isfinite(block[i]) || !(block[i] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", scale->name, "\": block ", i / bc, ",", i % bc,
                                                     " has scale ", block[i], " (must be finite and positive)"));
    }
  }
  m.fp8 = true;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  m.bytes.assign(src, src + w.numel());
  for (size_t i = 0; i < m.bytes.size(); ++i) {
    if ((m.bytes[i] & 0x7f) == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", w.name, "\": element ", i, " is an FP8 NaN"));
    }
  }
  m.scales.resize(static_cast<size_t>(m.rows * bc));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t g = 0; g < bc; ++g) m.scales[r * bc + g] = block[(r / kBlock) * bc + g];
  }
  return m;
}

HostMatrix QuantizeFp8(const HostMatrix& m) {
  MS_CHECK(!m.fp8);
  HostMatrix out;
  out.rows = m.rows;
  out.cols = m.cols;
  out.fp8 = true;
  const int64_t bc = Groups(m.cols);
  out.bytes.resize(static_cast<size_t>(m.rows * m.cols));
  out.scales.resize(static_cast<size_t>(m.rows * bc));
  for (int64_t br = 0; br * kBlock < m.rows; ++br) {
    for (int64_t g = 0; g < bc; ++g) {
      const int64_t r0 = br * kBlock, r1 = std::min(m.rows, r0 + kBlock);
      const int64_t c0 = g * kBlock, c1 = std::min(m.cols, c0 + kBlock);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(m.values[r * m.cols + c]));
      }
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      for (int64_t r = r0; r < r1; ++r) {
        out.scales[r * bc + g] = s;
        for (int64_t c = c0; c < c1; ++c) out.bytes[r * m.cols + c] = F32ToF8E4M3(m.values[r * m.cols + c] / s);
      }
    }
  }
  return out;
}

}  // namespace moeserve
