// The CUDA backend's private state (cuda_backend.cc, cuda_experts.cc), not part of its interface.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace moeserve {

#define NOTE_CUDA(expr) Note(::moeserve::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__))
#define NOTE_CUBLAS(expr) Note(::moeserve::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__))

inline int ElemOf(DType d) {
  switch (d) {
    case DType::kBF16:
      return cuda::kElemBF16;
    case DType::kF16:
      return cuda::kElemF16;
    default:
      return cuda::kElemF32;
  }
}

struct CudaBackend::Impl {
  int device = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceBuffer scratch;  // activations rounded to the weight dtype for cublasGemmEx (in the arena)
  DeviceBuffer group_pointers;         // A, B and C pointer arrays of the grouped expert GEMM
  bool grouped_gemm_supported = true;  // until cuBLAS says otherwise for our types
  // Each expert weight list's pointer table on the device (the grouped GEMM kernel's), keyed by
  // the list's address; the host copy tells a stale entry from a current one.
  struct ExpertTable {
    std::vector<const void*> host;
    DeviceBuffer device;
  };
  std::unordered_map<const void*, ExpertTable> expert_tables;
  std::mutex mu;  // the sticky error
  absl::Status error;
  // The copy stream: its copies wait for compute_event (recorded on the compute stream at each
  // CopyAsync); ticket t's completion is ring[t % kRing]; the compute stream waits on barrier.
  static constexpr uint64_t kRing = 64;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t compute_event = nullptr, barrier_event = nullptr;
  cudaEvent_t ring[kRing] = {};
  std::mutex copy_mu;
  uint64_t issued = 0, completed = 0;
  ~Impl() {
    cudaSetDevice(device);
    if (copy_stream != nullptr) cudaStreamSynchronize(copy_stream);
    for (cudaEvent_t e : ring) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (compute_event != nullptr) cudaEventDestroy(compute_event);
    if (barrier_event != nullptr) cudaEventDestroy(barrier_event);
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace moeserve
