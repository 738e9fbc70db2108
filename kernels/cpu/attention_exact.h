// The exact kernel of paged attention on the CPU fast path (fp32 products over an fp32 or bf16
// cache, vec8.h's 8 lanes), and the pieces the latent (MLA) kernel shares with it. attention.cc
// plans the work items; a context past 512 keys is taken in chunks as the bf16 kernel's
// (attention_chunks.h), so a long context spreads over the threads.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {

inline constexpr int64_t kExactKeys = 8;  // keys per group, one per lane of a score vector
// Keys per pass of the weighted sum over V: its accumulators stay in registers over this many
// (a whole head of 64 dimensions is 8 of them), loaded and stored once per pass.
inline constexpr int64_t kExactValueKeys = 32;

// The fp32 rows of keys [k0, k0 + n) (K or V, kv heads [g, g + heads) side by side): pointers
// into an fp32 cache, or rows widened into `scratch` [n][heads * hd] from a bf16 one; keys at or
// past ctx read `zeros` (heads * hd of them). All heads of a key at once: a DRAM-resident bf16
// cache read one head's part of each row at a time ran at 0.7 of the speed.
void GatherKeys(const KvLayout& layout, const void* cache, const int32_t* table, int64_t layer, int kv, int64_t g,
                int64_t heads, int64_t k0, int64_t n, int64_t ctx, float* scratch, const float* zeros,
                const float** rows);

// scores[k] = dot(q, keys[k]) * scale for the 8 keys, as one vector: each an 8-lane FMA chain
// over the head dimension summed by one tree (Reduce8x8). Inlined into its loops over rows: as a
// call, its setup and return were a third of its time in a prefill chunk (head_dim 64).
[[gnu::always_inline]] inline V8 Scores(const float* q, const float* const keys[kExactKeys], int64_t hd, float scale) {
  V8 p[kExactKeys] = {Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero()};
  for (int64_t c = 0; c < hd; c += 8) {
    const V8 qc = Load(q + c);
    for (int64_t k = 0; k < kExactKeys; ++k) p[k] = Fma(qc, Load(keys[k] + c), p[k]);
  }
  return Mul(Reduce8x8(p), Set1(scale));
}

// out[0, hd) += sum over the first nk keys of probs[k] * values[k], a chain of FMAs over keys in
// order per element.
void AddWeightedRow(const float* probs, int64_t nk, const float* const* values, int64_t hd, float* out);

// Softmax in place over sc[0, ctx), leaving zeros up to the next multiple of 8; returns the
// largest score and the sum of the exponentials (the exponentials vec8.h's Exp, summed lane-wise
// over keys in order, then by Reduce's tree).
SoftmaxStats Softmax(float* sc, int64_t ctx);

struct ExactScratch {
  std::vector<float> scores, scratch, zeros, parts;
  const float* rows[kExactValueKeys];       // GatherKeys' rows
  const float* head_rows[kExactValueKeys];  // one kv head's part of them
};

// Keys [it.k_begin, it.ctx_max) of an item into `part` (attention_chunks.h's ChunkPartFloats
// layout): scores 8 keys at a time for every row of each kv head, the softmax, then the weighted
// sum over 32 keys at a time; each row stops at its own context.
void AttendExactChunk(const ItemRows& it, const float* q, float scale, float* part, ExactScratch* s);

// A whole item (it.k_begin 0): each chunk of its context in turn, then weighed together.
void AttendExact(const ItemRows& it, const float* q, float scale, float* out, ExactScratch* s);

}  // namespace moeserve::cpu_fast
