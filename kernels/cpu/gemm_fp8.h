// The FP8 GEMM's row kernels (gemm_fp8.cc drives them): y[i, j] for up to kFp8Rows rows of x
// against one weight row. One arithmetic, two instruction sets with the same bits: per
// 128-column group, two 8-lane FMA chains over alternate 8-column chunks of w / 256 (the AVX-512
// kernel keeps them as the two halves of one 16-lane chain), added, then scaled by
// 256 x scale into an 8-lane total, reduced by vec8.h's tree; columns past the last multiple
// of 8 of a group in a scalar FMA chain added after.
#pragma once

#include <cstdint>

namespace moeserve::cpu_fast {

constexpr int kFp8Rows = 4;

struct Fp8Row {
  const uint8_t* bytes;  // the row's FP8 values
  const float* wide;     // the same divided by 256 as fp32 (widened once for many rows of x), or null
  const float* scales;   // one per 128 columns
  int64_t cols;
};

// out[r] = row . x[r * ldx, ...] for r < rows (1..kFp8Rows).
void Fp8DotsAvx2(const Fp8Row& w, const float* x, int64_t ldx, int rows, float* out);
void Fp8DotsAvx512(const Fp8Row& w, const float* x, int64_t ldx, int rows, float* out);
// Widens a row's FP8 values to fp32 / 256 (what the kernels multiply).
void WidenFp8Row(const uint8_t* bytes, int64_t cols, float* out);

}  // namespace moeserve::cpu_fast
