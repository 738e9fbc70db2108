// Reference CPU loops for DeepSeek's ops (Backend::RopeScaled, RouterGroupedTopK,
// WriteLatentKv, PagedLatentAttention): double accumulation, the oracle for faster versions.
#pragma once

#include "kernels/backend.h"

namespace moeserve::cpu_ref {

void RopeScaled(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                int64_t rotary_dim, const float* inv_freq, float cos_sin_scale);
void RouterGroupedTopK(const float* logits, int64_t n, const Backend::GroupedRouting& spec, const float* bias,
                       int32_t* expert_ids, float* expert_weights);
void WriteLatentKv(const float* latent, const float* rope, const int64_t* slots, int64_t n, int64_t latent_dim,
                   const KvLayout& layout, int64_t layer, void* cache);
void PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                          const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                          int64_t latent_dim, float scale, float* out);

}  // namespace moeserve::cpu_ref
