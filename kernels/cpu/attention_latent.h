// One work item of latent attention (MLA) on the CPU fast path: attention.cc plans the items
// (tiles x chunks of heads); the exact kernel's pieces (attention_exact.h) compute them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_exact.h"

namespace moeserve::cpu_fast {

// Tokens [t0, t0 + nt) of one sequence (positions ascending) and heads [h0, h0 + nh) of `heads`;
// its rows are (token, head) pairs, token-major. Every head reads the same cached row per token,
// [latent | rotary key] (head_dim values, the first latent_dim of them the latent).
struct LatentItem {
  const AttentionBatch* batch;
  const KvLayout* layout;
  const void* cache;
  int64_t layer, t0, nt, h0, nh, heads, latent_dim;
  int64_t nrows() const { return nt * nh; }
  int64_t ctx_of(int64_t row) const { return static_cast<int64_t>(batch->token_pos[t0 + row / nh]) + 1; }
  // The row's (token, head) index into the queries and outputs.
  int64_t pair(int64_t row) const { return (t0 + row / nh) * heads + h0 + row % nh; }
  const int32_t* table() const { return batch->block_tables + batch->token_seq[t0] * batch->max_blocks_per_seq; }
};

// The item's rows' queries [q_latent | q_rope] side by side at q (nrows x head_dim).
void LatentQueries(const LatentItem& it, const float* q_latent, const float* q_rope, std::vector<float>* q);

// The item's rows' results (`part`: nrows rows of latent_dim, its chunks folded together,
// attention_chunks.h) into their places in `out` ([token][head][latent_dim]).
void WriteLatentRows(const LatentItem& it, const float* part, float* out);

// The item's outputs (out: [token][head][latent_dim]): each row's query [q_latent | q_rope]
// scored against whole rows (8 keys at a time, two rows a key load), its softmax over its own
// keys, then the weighted sum of the rows' latents (32 keys at a time, the rows of a token
// sharing each latent load over a bf16 cache), a context past 512 keys in the fixed chunks folded
// in order (attention_chunks.h); the exact kernel's operations, in the same order for each
// (token, head) whatever its batch, tile or item. hd and latent_dim multiples of 8.
void AttendLatent(const LatentItem& it, const float* q_latent, const float* q_rope, float scale, float* out,
                  ExactScratch* s);

// Whether the bf16 latent kernel takes rows of hd values with a latent of latent_dim (< hd: a
// rotary key follows it): hd a multiple of 32 (a score's 32-dimension loads), the latent 32, 64 or
// a multiple of 128 (the weighted sum's blocks of at most 128 values). Others run AttendLatent.
bool Bf16LatentShape(int64_t hd, int64_t latent_dim);

// A thread's scratch for AttendLatentBf16, reused across its items.
struct LatentBf16Scratch {
  std::vector<float> q, scores, acc, parts;
  std::vector<uint16_t> qb, zeros;
  std::vector<uint32_t> pb;  // the probabilities as bf16 pairs
  std::vector<int64_t> keys;
};

// The same item on the bf16 variants' dot products (vdpbf16ps; AVX512-BF16 CPUs only), with the
// multi-head bf16 kernel's rounding (attention_bf16.h): queries rounded to bf16, each score a
// vdpbf16ps chain per lane over the whole [latent | rotary key] row, its lanes summed by a fixed
// tree (ScoreLatentKeysBf16), the softmax on 16 lanes
// writing bf16 probabilities, the weighted sum of the latents one vdpbf16ps per pair of keys and
// 16 values, in blocks of up to 128 values; a context past 512 keys in the multi-head kernel's
// fixed chunks, folded in order (attention_chunks.h). A row's operations depend only on its own context,
// so its bits never depend on its batch, tile or item. Shapes of Bf16LatentShape only.
void AttendLatentBf16(const LatentItem& it, const float* q_latent, const float* q_rope, float scale, float* out,
                      LatentBf16Scratch* s);

}  // namespace moeserve::cpu_fast
