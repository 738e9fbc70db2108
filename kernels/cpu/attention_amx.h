// Paged attention's two products on AMX tiles (tdpbf16ps), for the amx variant over a bf16 KV
// cache: Q·Kᵀ against KeyPairsBf16's tiles and P·V against ValuePairsBf16's (attention_bf16.h).
// attention.cc drives them (packing, softmax, which keys each row takes). Each output element is
// one tdpbf16ps accumulation over its K steps in order; tile rows are independent, so a row's
// result never depends on the rows beside it. Only CPUs granted AMX tiles may call them.
#pragma once

#include <cstdint>

namespace moeserve::cpu_fast {

// out[r * out_stride + j] = dot(q_r, key j) for rows r < rows (1..32) and keys j < 16 blocks
// (blocks even): q is rows x hd bf16, row after row; kt holds each 16-key block's KeyPairsBf16,
// hd / 2 x 16 dwords, block after block. The sums are not scaled.
void ScoresAmx(const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks, float* out,
               int64_t out_stride);

// acc[r * hd + c] = sum over keys j < 32 steps of p[r * p_stride + j] * value j, dimension c, for
// rows r < rows (1..32): p bf16 (rows 64-byte aligned not needed), vt holds each 32-key step's
// ValuePairsBf16, hd / 16 tiles, step after step.
void WeightedSumAmx(const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt, int64_t steps, int64_t hd,
                    float* acc);

}  // namespace moeserve::cpu_fast
