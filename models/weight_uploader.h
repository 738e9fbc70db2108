// Reads a checkpoint's tensors onto a device: checked against the shapes the config implies,
// converted to the storage dtype, stacked, stored in the backend's preferred layout, and hashed
// on the way (one digest per stored weight, keyed by its tensor names, so that ranks that read
// different parts of a checkpoint can put the whole model's digest together).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/safetensors.h"

namespace moeserve {

class Uploader {
 public:
  Uploader(const TensorSource& src, const std::map<std::string, std::vector<int64_t>>& shapes,
           Backend* backend, std::vector<DeviceBuffer>* buffers, size_t* total,
           std::map<std::string, uint64_t>* digests)
      : src_(src), shapes_(shapes), backend_(backend), buffers_(buffers), total_(total), digests_(digests) {}

  // The named tensor, with the shape the config needs.
  absl::StatusOr<const TensorView*> Get(const std::string& name);
  // Stacks the named matrices row-wise into one weight of `dtype`, stored in the backend's
  // preferred layout (a GEMM operand) or row-major (a vector read directly).
  absl::StatusOr<WeightRef> Matrix(const std::vector<std::string>& names, DType dtype, bool gemm_operand = true);
  absl::StatusOr<const float*> Vector(const std::string& name);
  // The named tensor as fp32 values, row-major (for weights derived on the host).
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name);
  // Stores a row-major [rows, cols] fp32 matrix derived on the host from checkpoint tensors as
  // a weight of `dtype`; `key` names it in the digests (the source tensors and the derivation).
  absl::StatusOr<WeightRef> Derived(const std::string& key, const std::vector<float>& values, int64_t rows,
                                    int64_t cols, DType dtype, bool gemm_operand = true);

 private:
  // Hashes, uploads and records host bytes of `dtype` as the weight `key`.
  absl::StatusOr<WeightRef> Store(const std::string& key, const std::vector<uint8_t>& host, int64_t rows,
                                  int64_t cols, DType dtype, bool gemm_operand);

  const TensorSource& src_;
  const std::map<std::string, std::vector<int64_t>>& shapes_;
  Backend* backend_;
  std::vector<DeviceBuffer>* buffers_;
  size_t* total_;
  std::map<std::string, uint64_t>* digests_;
};

// Allocates a weight on `backend` and copies the row-major host matrix into it in `layout`.
absl::StatusOr<DeviceBuffer> UploadWeight(Backend* backend, const void* row_major, DType dtype, int64_t rows,
                                          int64_t cols, WeightLayout layout);

}  // namespace moeserve
