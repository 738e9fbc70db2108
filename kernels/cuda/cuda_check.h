// Turns CUDA runtime and cuBLAS return codes into absl::Status with file and line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moeserve::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", expr, " failed: ", cudaGetErrorString(e)));
}

inline absl::Status CublasStatus(cublasStatus_t e, const char* expr, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", expr, " failed: ", cublasGetStatusString(e)));
}

}  // namespace moeserve::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                 \
    ::absl::Status _s = ::moeserve::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_s.ok()) return _s;                                                           \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                   \
    ::absl::Status _s = ::moeserve::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_s.ok()) return _s;                                                             \
  } while (0)
