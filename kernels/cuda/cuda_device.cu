// CUDA device discovery and library checks.
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"

namespace moeserve::cuda {

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out.push_back(DeviceInfo{i, prop.name, prop.major, prop.minor, prop.totalGlobalMem,
                             prop.multiProcessorCount});
  }
  return out;
}

std::string LibraryVersions() {
  int nccl = 0;
  ncclGetVersion(&nccl);
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  return absl::StrCat("cuBLAS ", CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ".", CUBLAS_VER_PATCH,
                      ", NCCL ", nccl / 10000, ".", (nccl / 100) % 100, ".", nccl % 100,
                      ", CUDA runtime ", runtime / 1000, ".", (runtime % 1000) / 10);
}

absl::Status CheckCublas(int ordinal) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cublasHandle_t handle;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  CUBLAS_RETURN_IF_ERROR(cublasDestroy(handle));
  return absl::OkStatus();
}

}  // namespace moeserve::cuda
