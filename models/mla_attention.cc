// Multi-head latent attention (DeepSeek-V2/V3) in the absorbed form: the cache holds one
// latent and one rotary key per token; kv_b_proj's key part is folded into the query
// (q_latent = k_up_t[h] q_nope) and its value part applied to the output, so attention runs
// as `heads` query heads against a single shared row per token.
#include <array>
#include <vector>

#include "core/status.h"
#include "models/moe_model.h"
#include "models/rope_scaling.h"

namespace moeserve {
namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not the
// config's rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

}  // namespace

absl::Status MoeModel::EnsureRopeTable() {
  if (!ws_.rope_inv_freq.empty()) return absl::OkStatus();
  const ModelConfig& c = config();
  const std::vector<float> inv = RopeInvFreq(c, c.is_mla() ? c.mla.qk_rope_head_dim : c.rotary_dim());
  ASSIGN_OR_RETURN(ws_.rope_inv_freq, backend_->Allocate(inv.size() * sizeof(float)));
  return backend_->CopyToDevice(ws_.rope_inv_freq.data(), inv.data(), inv.size() * sizeof(float));
}

absl::Status MoeModel::PrepareMlaStep(int64_t t) {
  const ModelConfig& c = config();
  const int64_t heads = c.num_attention_heads;
  RETURN_IF_ERROR(EnsureRopeTable());
  // Row h * t + i of the head-major layout is token i's head h, row i * heads + h token-major.
  std::vector<int32_t> head_rows(t * heads), token_rows(t * heads);
  std::vector<int64_t> offsets(heads + 1);
  for (int64_t h = 0; h < heads; ++h) {
    offsets[h] = h * t;
    for (int64_t i = 0; i < t; ++i) {
      head_rows[h * t + i] = static_cast<int32_t>(i * heads + h);
      token_rows[i * heads + h] = static_cast<int32_t>(h * t + i);
    }
  }
  offsets[heads] = heads * t;
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.mla_head_rows.data(), head_rows.data(), head_rows.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.mla_token_rows.data(), token_rows.data(), token_rows.size() * sizeof(int32_t)));
  return backend_->CopyToDevice(ws_.mla_head_offsets.data(), offsets.data(), offsets.size() * sizeof(int64_t));
}

void MoeModel::MlaAttention(const LayerWeights& lw, int64_t t, const AttentionBatch& batch, const KvLayout& layout,
                            int64_t kv_layer, void* kv_cache) {
  const ModelConfig& c = config();
  const MlaConfig& m = c.mla;
  const int64_t heads = c.num_attention_heads, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  const int64_t r = m.kv_lora_rank, dv = m.v_head_dim;
  const float* xn = ws_.xn.as<float>();
  float* q_nope = ws_.mla_q_nope.as<float>();
  float* q_rope = ws_.mla_q_rope.as<float>();
  float* latent = ws_.mla_latent.as<float>();
  float* k_rope = ws_.mla_k_rope.as<float>();
  float* head_a = ws_.mla_head_a.as<float>();
  float* head_b = ws_.mla_head_b.as<float>();
  const int32_t* head_rows = ws_.mla_head_rows.as<int32_t>();
  const int32_t* token_rows = ws_.mla_token_rows.as<int32_t>();
  const int64_t* head_offsets = ws_.mla_head_offsets.as<int64_t>();
  const int32_t* positions = ws_.positions.as<int32_t>();
  // The projections of the same rows go to the backend together (Gemms: the CPU rounds them
  // once and runs them in one parallel region); each result is its own Gemm's.
  if (m.q_lora_rank > 0) {
    float* qa = ws_.mla_qa.as<float>();
    const std::array<WeightRef, 3> w = {lw.q_a, lw.kv_a, lw.k_rope};
    const std::array<float*, 3> y = {qa, latent, k_rope};  // [t, q_lora_rank], [t, r], [t, dr]
    backend_->Gemms(xn, t, w, y);
    backend_->RmsNorm(qa, lw.q_a_norm, t, m.q_lora_rank, kLatentNormEps, qa);
    const std::array<WeightRef, 2> wq = {lw.q_nope, lw.q_rope};
    const std::array<float*, 2> yq = {q_nope, q_rope};  // [t, heads, dn], [t, heads, dr]
    backend_->Gemms(qa, t, wq, yq);
  } else {
    const std::array<WeightRef, 4> w = {lw.q_nope, lw.q_rope, lw.kv_a, lw.k_rope};
    const std::array<float*, 4> y = {q_nope, q_rope, latent, k_rope};
    backend_->Gemms(xn, t, w, y);
  }
  backend_->RmsNorm(latent, lw.kv_a_norm, t, r, kLatentNormEps, latent);
  const float* inv_freq = ws_.rope_inv_freq.as<float>();
  const float factor = RopeAttentionFactor(c);
  backend_->RopeScaled(q_rope, positions, t, heads, dr, dr, inv_freq, factor);
  backend_->RopeScaled(k_rope, positions, t, 1, dr, dr, inv_freq, factor);
  backend_->WriteLatentKv(latent, k_rope, ws_.slots.as<int64_t>(), t, r, layout, kv_layer, kv_cache);
  // Each head's non-rotary query carried into the latent's space: [heads, t, dn] -> [heads, t, r].
  float* q_latent = ws_.mla_q_latent.as<float>();
  backend_->GatherRows(q_nope, head_rows, t * heads, dn, head_a);
  backend_->GroupedGemm(head_a, lw.k_up_t, head_offsets, t * heads, head_b);
  backend_->GatherRows(head_b, token_rows, t * heads, r, q_latent);
  float* o_latent = ws_.mla_o_latent.as<float>();
  backend_->PagedLatentAttention(q_latent, q_rope, batch, layout, kv_layer, kv_cache, heads, r,
                                 static_cast<float>(c.SoftmaxScale()), o_latent);
  // Each head's output latent expanded to its value width: [heads, t, r] -> [heads, t, dv].
  backend_->GatherRows(o_latent, head_rows, t * heads, r, head_a);
  backend_->GroupedGemm(head_a, lw.v_up, head_offsets, t * heads, head_b);
  float* attn = ws_.attn.as<float>();
  backend_->GatherRows(head_b, token_rows, t * heads, dv, attn);  // [t, heads * dv]
  backend_->Gemm(attn, t, lw.o, ws_.x.as<float>(), /*accumulate=*/true);
}

}  // namespace moeserve
