// The CPU op tests' shared pieces (cpu_ops_test.cc, cpu_weight_layout_test.cc): the reference,
// exact fast and BLAS backends, and weights in either dtype. A named namespace: both files'
// TEST_F(CpuOpsTest, ...) must see one fixture type.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace moeserve::cpu_ops_test {

class CpuOpsTest : public ::testing::Test {
 protected:
  // The exact fast path (fp32 activations, avx2 or avx512): the variants that round activations
  // to bf16 are tested at their own bound in gemm_variants_test.cc.
  CpuBackend ref_{CpuBackendOptions{CpuPath::kReference, 1, 0}};
  CpuBackend fast_{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
  CpuBackend blas_{CpuBackendOptions{CpuPath::kFast, 2, 0, /*batch_invariant=*/false, CpuIsa::kAuto,
                                     CpuKernelNumerics::kExact}};
};

// Weight storage in either dtype, keeping the exact values both paths see.
struct HostWeight {
  std::vector<uint8_t> bytes;
  WeightRef ref;
};

inline HostWeight MakeWeight(int64_t rows, int64_t cols, DType dtype, uint32_t seed, float scale = 0.1f) {
  auto values = testing::RandomFloats(rows * cols, seed, scale);
  HostWeight w;
  w.bytes.resize(values.size() * DTypeSize(dtype));
  ConvertFromF32(values.data(), values.size(), dtype, w.bytes.data());
  w.ref = WeightRef{w.bytes.data(), dtype, rows, cols};
  return w;
}

}  // namespace moeserve::cpu_ops_test
