// The FP8 GEMM's row kernels (gemm_fp8.cc drives them): y[i, j] for up to kFp8Rows rows of x
// against one weight row, or one row of x against kFp8Rows weight rows. One arithmetic, two
// instruction sets with the same bits: per 128-column group, two 8-lane FMA chains over the
// even and the odd 8-column chunks of w / 256, each scaled by 256 x scale into its own 8-lane
// total (the AVX-512 kernel keeps each pair as the halves of one 16-lane register); at the end
// the two totals are added and reduced by vec8.h's tree, and the columns past the last multiple
// of 8 of each group, in a scalar FMA chain, added after. Whatever the blocking, each (i, j)
// takes these operations in this order.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace moeserve::cpu_fast {

constexpr int kFp8Rows = 4;

struct Fp8Row {
  const uint8_t* bytes;  // the row's FP8 values
  const float* wide;     // the same divided by 256 as fp32 (widened once for many rows of x), or null
  const float* scales;   // one per 128 columns
  int64_t cols;
};

// out[k * rows + r] = w[k] . x[r * ldx, ...] for k < n and r < rows: n is 1 (rows 1..kFp8Rows)
// or kFp8Rows (rows 1); the AVX-512 kernel also takes n 2 with rows kFp8Rows.
void Fp8DotsAvx2(const Fp8Row* w, int n, const float* x, int64_t ldx, int rows, float* out);
void Fp8DotsAvx512(const Fp8Row* w, int n, const float* x, int64_t ldx, int rows, float* out);
// Widens a row's FP8 values to fp32 / 256 (what the kernels multiply).
void WidenFp8Row(const uint8_t* bytes, int64_t cols, float* out);
// The scalar FMA chain of a group's last columns (fewer than 8): sum of w / 256 x x, in order.
float Fp8TailDot(const uint8_t* w, const float* x, int64_t n);

// Weight rows per work item of the FP8 GEMMs.
constexpr int64_t kFp8RowGrain = 16;
// A grouped FP8 GEMM's work items: (group, first weight row of a chunk of kFp8RowGrain) over
// every group that has rows of x, so that all groups run in one parallel loop.
std::vector<std::pair<int64_t, int64_t>> Fp8GroupItems(std::span<const WeightRef> w, std::span<const int64_t> offsets);

}  // namespace moeserve::cpu_fast
