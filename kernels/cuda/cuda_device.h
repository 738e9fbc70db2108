// CUDA device discovery and library versions (cuBLAS, NCCL). No CUDA headers here, so that
// tools and tests can ask whether a GPU is present without depending on the toolkit.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessors = 0;
};

// The visible GPUs; an empty list (not an error) when there is no driver or no device.
std::vector<DeviceInfo> ListDevices();

// "cuBLAS X.Y.Z, NCCL X.Y.Z, CUDA runtime X.Y" from the linked libraries.
std::string LibraryVersions();

// Creates and destroys a cuBLAS handle on `ordinal`, checking every call.
absl::Status CheckCublas(int ordinal);

}  // namespace moeserve::cuda
