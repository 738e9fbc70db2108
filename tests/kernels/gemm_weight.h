// A GEMM weight for the kernel tests: random values rounded to a dtype and stored in a layout,
// beside the fp32 values it holds (gemm_variants_test.cc, gemm_layouts_test.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/weight_layout.h"
#include "tests/test_util.h"

namespace moeserve::testing {

// A weight as stored (dtype, layout) and the fp32 values it holds.
struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n, k] row-major, after rounding to the dtype
  WeightRef ref;
};

inline Weight MakeWeight(int64_t n, int64_t k, DType dt, WeightLayout layout, uint32_t seed) {
  Weight w;
  w.values = RandomFloats(static_cast<size_t>(n * k), seed, 0.1f);
  std::vector<uint8_t> row(w.values.size() * DTypeSize(dt));
  ConvertFromF32(w.values.data(), w.values.size(), dt, row.data());
  ConvertToF32(row.data(), dt, w.values.size(), w.values.data());
  w.bytes.resize(static_cast<size_t>(WeightStorageElems(layout, n, k)) * DTypeSize(dt));
  PackWeight(layout, row.data(), n, k, DTypeSize(dt), w.bytes.data());
  w.ref = WeightRef{w.bytes.data(), dt, n, k, layout};
  return w;
}

}  // namespace moeserve::testing
