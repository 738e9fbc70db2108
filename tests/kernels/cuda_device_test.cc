// kernels/cuda: the CUDA library links and answers; GPU checks skip cleanly without a device.
#include <gtest/gtest.h>

#include "kernels/cuda/cuda_device.h"

namespace moeserve {
namespace {

TEST(CudaDeviceTest, LibrariesReportVersions) {
  const std::string v = cuda::LibraryVersions();
  EXPECT_NE(v.find("cuBLAS"), std::string::npos) << v;
  EXPECT_NE(v.find("NCCL"), std::string::npos) << v;
}

TEST(CudaDeviceTest, CublasHandleOnEveryDevice) {
  const auto devices = cuda::ListDevices();
  if (devices.empty()) GTEST_SKIP() << "no CUDA device on this machine";
  for (const auto& d : devices) {
    EXPECT_GT(d.total_memory_bytes, 0u) << d.name;
    absl::Status s = cuda::CheckCublas(d.ordinal);
    EXPECT_TRUE(s.ok()) << d.name << ": " << s;
  }
}

}  // namespace
}  // namespace moeserve
