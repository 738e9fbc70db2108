// The two inner loops of paged attention on vdpbf16ps (AVX512-BF16), for the kernel variants that
// round activations to bf16 (avx512-bf16, amx) over a bf16 KV cache: the queries and the
// probabilities are rounded to bf16 (round to nearest even), their products summed in fp32, as
// the GEMMs of those variants do with their activations, and their softmax. The avx512-bf16
// item (attention_bf16_item.cc) and the amx kernel (attention_amx.cc) drive them; only CPUs with
// AVX512-BF16 may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention_item.h"

namespace moeserve::cpu_fast {

inline constexpr int64_t kBf16KeyBlock = 16;  // keys of one register of scores, one per fp32 lane
inline constexpr int64_t kBf16MaxValueKeys = 64;  // keys of one AddWeightedBf16 call, at most

// The head dimensions these kernels take.
inline bool Bf16AttentionHeadDim(int64_t hd) { return hd == 32 || hd == 64 || hd == 128 || hd == 256; }

inline constexpr int64_t kBf16MaxKeyWidth = 256;  // dimensions of all heads one transposition takes

// out[g * rows * out_stride + r * out_stride + j] = scale * dot(q_gr, keys[j] + g * hd) for the
// 16 x `blocks` keys (blocks 1 or 2), the `heads` kv heads side by side in each key's row and
// their `rows` query rows each (q: heads x rows x hd bf16, row after row). Each score is four
// fp32 chains of vdpbf16ps over the head dimension's pairs (pair d in chain d % 4, in order),
// summed as (c0 + c1) + (c2 + c3): the same operations whatever the other rows, heads and blocks.
// The heads' rows are transposed together (kBf16MaxKeyWidth dimensions at a time), so that a key's
// whole row is read at once: reading one head's part of every row, then coming back for the
// next's, ran a decode over a long context from DRAM at 0.65 of the speed (the hardware's
// prefetchers did not follow; software prefetch did not help).
void ScoreKeysBf16(const uint16_t* q, int64_t rows, int64_t hd, int64_t heads, const uint16_t* const* keys,
                   int blocks, float scale, float* out, int64_t out_stride);

// The latent kernel's scores against whole rows of any width hd (a multiple of 32): out[r *
// out_stride + j] = scale x dot(q_r, keys[j]) for rows r < rows and keys j < n (a multiple of 4).
// Each score is one fp32 chain of vdpbf16ps per lane over the rows' 32-dimension blocks in order
// (lane l: pairs 16b + l of block b), its 16 lanes then summed by one fixed tree (l + 8, + 4,
// + 2, + 1): the same operations whatever the other rows and keys. `ahead`: n rows of keys further
// on, each line fetched beside the same line of `keys` (no result depends on it).
void ScoreLatentKeysBf16(const uint16_t* q, int64_t rows, int64_t hd, const uint16_t* const* keys, int64_t n,
                         float scale, float* out, int64_t out_stride, const uint16_t* const* ahead);

// The softmax of the bf16 variants' attention, 16 lanes at a time: sc[0, ctx) (unscaled scores)
// becomes scale x sc, then its softmax (vec8.h's exponential, the sum lane-wise over keys in order
// then one fixed tree over the 16 lanes); the probabilities of keys [0, whole) go to pb as bf16
// (round to nearest even; 0 past ctx), those of [whole, ctx) stay in sc as fp32, followed by
// zeros to the next multiple of 16 past whole. whole is a multiple of 32; sc has room for
// max(whole, ctx rounded up to 16) floats.
// Returns the largest scaled score and the sum of the exponentials (before the division).
SoftmaxStats SoftmaxBf16(float* sc, int64_t ctx, float scale, int64_t whole, uint16_t* pb);

// The keys' dimension pairs side by side: out[d * 16 + j] = (keys[j][first + 2d], keys[j][first +
// 2d + 1]) for the hd / 2 pairs d. Every 16 pairs (32 dimensions) are one AMX B tile of Q·Kᵀ.
void KeyPairsBf16(const uint16_t* const keys[kBf16KeyBlock], int64_t hd, uint32_t* out, int64_t first = 0);

// The AMX B tiles of P·V for 32 keys: tile c (dimensions [16c, 16c + 16)) at out + 256 c, its
// row p the pairs (values[2p][16c + n], values[2p + 1][16c + n]) for n < 16.
inline constexpr int64_t kAmxValueKeys = 32;
void ValuePairsBf16(const uint16_t* const values[kAmxValueKeys], int64_t hd, uint32_t* out);

// acc[r * hd + c] += sum over keys j < keys[r] of bf16(p[r * p_stride + j]) * values[j][c], for
// rows r < rows; keys[r] <= n <= kBf16MaxValueKeys, n even (values has n rows); keys taken in
// pairs, in order (one vdpbf16ps per pair and 16 dimensions; a row's odd last key is paired
// with zeros). A row reads no value past its own keys, so another row's longer context cannot
// reach it. hd is a size Bf16AttentionHeadDim takes, or a multiple of 128 (a latent's values),
// summed 128 dimensions at a time: the same operations per output element either way.
void AddWeightedBf16(const float* p, int64_t p_stride, int64_t rows, const int64_t* keys, int64_t n,
                     const uint16_t* const* values, int64_t hd, float* acc);

// The same with the probabilities already bf16 (SoftmaxBf16's pb), as pairs of consecutive keys,
// for `heads` kv heads side by side in each value's row (values[j] points at the first's):
// head g's row r takes pair j / 2 at pairs[(g * rows + r) * stride + j / 2], accumulates at
// acc[(g * rows + r) * hd ...] and stops at keys[r]. Each row's result the same bits as
// AddWeightedBf16 of the fp32 probabilities those were rounded from, one head at a time.
void AddWeightedPairsBf16(const uint32_t* pairs, int64_t stride, int64_t rows, int64_t heads, const int64_t* keys,
                          int64_t n, const uint16_t* const* values, int64_t hd, float* acc);

}  // namespace moeserve::cpu_fast
