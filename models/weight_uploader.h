// Reads a checkpoint's tensors onto a device: checked against the shapes the config implies,
// converted to the storage dtype, stacked, stored in the backend's preferred layout, and hashed
// on the way (one digest per stored weight, keyed by its tensor names, so that ranks that read
// different parts of a checkpoint can put the whole model's digest together).
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/host_matrix.h"
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
  // The named tensor as a host matrix: FP8 with its scales when the checkpoint stores it so
  // (a companion "<name>_scale_inv"), else fp32 values, quantized to FP8 by 128 x 128 blocks
  // when `quantize_fp8` (as an FP8 checkpoint's writer does, before any derivation).
  absl::StatusOr<HostMatrix> ReadHost(const std::string& name, bool quantize_fp8);
  // Stacks the named matrices row-wise into one weight, stored in the backend's preferred
  // layout (a GEMM operand) or row-major (a vector read directly): FP8 when the checkpoint's
  // are, or each quantized when `dtype` is kF8E4M3 (GEMM operands only), else converted to
  // `dtype`.
  absl::StatusOr<WeightRef> Matrix(const std::vector<std::string>& names, DType dtype, bool gemm_operand = true);
  absl::StatusOr<const float*> Vector(const std::string& name);
  // Stores a matrix derived on the host from checkpoint tensors read by ReadHost (FP8 when
  // they were); `key` names it in the digests (the source tensors and the derivation).
  absl::StatusOr<WeightRef> Derived(const std::string& key, const HostMatrix& m, DType dtype);

 private:
  // Hashes, uploads and records the matrix as the weight `key`.
  absl::StatusOr<WeightRef> Store(const std::string& key, const HostMatrix& m, DType dtype, bool gemm_operand);
  absl::StatusOr<WeightRef> StoreFp8(const std::string& key, const HostMatrix& m);
  // The digest of the weight `key`: its shape and dtype, then its bytes part by part.
  void RecordDigest(const std::string& key, int64_t rows, int64_t cols, DType dtype,
                    std::initializer_list<std::pair<const void*, size_t>> parts);

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
