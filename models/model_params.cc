// A ModelConfig's parameter counts: attention (standard or latent), the whole model, and the
// parameters one token is computed with (its top-k experts of each MoE layer).
#include "models/model_config.h"

namespace moeserve {

int64_t ModelConfig::AttentionParams() const {
  const int64_t h = hidden_size;
  if (!is_mla()) {
    int64_t p = h * q_dim() * 2 + h * kv_dim() * 2;  // q, o, k, v
    if (qkv_bias) p += q_dim() + 2 * kv_dim();
    if (qk_norm == QkNorm::kPerHead) p += 2 * head_dim;
    if (qk_norm == QkNorm::kWhole) p += q_dim() + kv_dim();
    return p;
  }
  const MlaConfig& m = mla;
  const int64_t heads = num_attention_heads;
  const int64_t q = m.q_lora_rank > 0 ? h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim()
                                      : h * heads * m.qk_head_dim();
  return q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  // kv_a_proj_with_mqa, its norm
         + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)  // kv_b_proj
         + heads * m.v_head_dim * h;                                    // o_proj
}

int64_t ModelConfig::TotalParams() const {
  const int64_t h = hidden_size;
  int64_t moe_layer = num_local_experts * h + num_local_experts * ExpertParams();  // router, experts
  if (router.correction_bias) moe_layer += num_local_experts;
  if (has_shared_expert()) moe_layer += 3 * h * shared_expert_intermediate_size + (shared_expert_gated ? h : 0);
  const int64_t dense_layer = 3 * h * dense_intermediate_size;
  const int64_t per_layer = AttentionParams() + 2 * h;  // attention, two norms
  int64_t total = per_layer * num_hidden_layers + num_dense_layers() * dense_layer +
                  (num_hidden_layers - num_dense_layers()) * moe_layer + vocab_size * h + h;
  if (!tie_word_embeddings) total += vocab_size * h;
  return total;
}

int64_t ModelConfig::ActiveParams() const {
  return TotalParams() -
         (num_hidden_layers - num_dense_layers()) * (num_local_experts - num_experts_per_tok) * ExpertParams();
}

int64_t ModelConfig::num_dense_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += dense_layer(l);
  return n;
}

}  // namespace moeserve
