// DeepSeek tensor names and the weights derived from them.
#include "models/deepseek_weights.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

namespace tn = tensor_names;

std::string Attn(int64_t l, const char* w) { return tn::Layer(l, absl::StrCat("self_attn.", w)); }

// The rotary rows in DeepSeek's interleaved order (x0, x1), (x2, x3)... as halves: even rows
// first, then odd ones (transformers' apply_rotary_pos_emb_interleave computes the same).
int64_t RopeRow(int64_t i, int64_t dr, bool interleaved) {
  if (!interleaved) return i;
  return i < dr / 2 ? 2 * i : 2 * (i - dr / 2) + 1;
}

}  // namespace

void AddMlaTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const MlaConfig& m = c.mla;
  if (m.q_lora_rank > 0) {
    out->push_back({Attn(l, "q_a_proj.weight"), {m.q_lora_rank, h}});
    out->push_back({Attn(l, "q_a_layernorm.weight"), {m.q_lora_rank}});
    out->push_back({Attn(l, "q_b_proj.weight"), {heads * m.qk_head_dim(), m.q_lora_rank}});
  } else {
    out->push_back({Attn(l, "q_proj.weight"), {heads * m.qk_head_dim(), h}});
  }
  out->push_back({Attn(l, "kv_a_proj_with_mqa.weight"), {m.kv_lora_rank + m.qk_rope_head_dim, h}});
  out->push_back({Attn(l, "kv_a_layernorm.weight"), {m.kv_lora_rank}});
  out->push_back({Attn(l, "kv_b_proj.weight"), {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}});
  out->push_back({Attn(l, "o_proj.weight"), {h, heads * m.v_head_dim}});
}

void AddDeepseekMlpTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out) {
  const int64_t h = c.hidden_size;
  if (c.dense_layer(l)) return AddDenseMlpTensors(c, l, out);
  out->push_back({tn::Router(c, l), {c.num_local_experts, h}});
  if (c.router.correction_bias) out->push_back({tn::Layer(l, "mlp.gate.e_score_correction_bias"), {c.num_local_experts}});
  for (int64_t e = 0; e < c.num_local_experts; ++e) {
    out->push_back({tn::Expert(c, l, e, "w1"), {c.intermediate_size, h}});
    out->push_back({tn::Expert(c, l, e, "w2"), {h, c.intermediate_size}});
    out->push_back({tn::Expert(c, l, e, "w3"), {c.intermediate_size, h}});
  }
  if (c.has_shared_expert()) {
    const int64_t s = c.shared_expert_intermediate_size;
    out->push_back({tn::Layer(l, "mlp.shared_experts.gate_proj.weight"), {s, h}});
    out->push_back({tn::Layer(l, "mlp.shared_experts.up_proj.weight"), {s, h}});
    out->push_back({tn::Layer(l, "mlp.shared_experts.down_proj.weight"), {h, s}});
  }
}

bool IsMtpTensor(const ModelConfig& c, const std::string& name) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!c.deepseek_moe() || !absl::StartsWith(name, kPrefix)) return false;
  const absl::string_view rest = absl::string_view(name).substr(kPrefix.size());
  const size_t dot = rest.find('.');
  int64_t layer = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &layer)) return false;
  return layer >= c.num_hidden_layers && layer < c.num_hidden_layers + c.num_nextn_predict_layers;
}

absl::Status LoadMlaAttention(const ModelConfig& c, int64_t l, DType dtype, Uploader& up, LayerWeights* lw) {
  const MlaConfig& m = c.mla;
  const int64_t heads = c.num_attention_heads, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  const int64_t qkd = m.qk_head_dim(), r = m.kv_lora_rank, dv = m.v_head_dim;
  auto same = [](int64_t i) { return i; };
  auto rope = [&](int64_t i) { return RopeRow(i, dr, m.rope_interleave); };
  std::string q_name = Attn(l, "q_proj.weight");
  if (m.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(lw->q_a, up.Matrix({Attn(l, "q_a_proj.weight")}, dtype));
    ASSIGN_OR_RETURN(lw->q_a_norm, up.Vector(Attn(l, "q_a_layernorm.weight")));
    q_name = Attn(l, "q_b_proj.weight");
  }
  const bool quantize = dtype == DType::kF8E4M3;
  ASSIGN_OR_RETURN(const HostMatrix q, up.ReadHost(q_name, quantize));
  HostMatrix q_nope, q_rope;
  for (int64_t h = 0; h < heads; ++h) {
    RETURN_IF_ERROR(q_nope.Append(q.PickRows(h * qkd, dn, same), q_name));
    RETURN_IF_ERROR(q_rope.Append(q.PickRows(h * qkd + dn, dr, rope), q_name));
  }
  ASSIGN_OR_RETURN(lw->q_nope, up.Derived(q_name + "#nope", q_nope, dtype));
  ASSIGN_OR_RETURN(lw->q_rope, up.Derived(q_name + "#rope", q_rope, dtype));

  const std::string kv_a_name = Attn(l, "kv_a_proj_with_mqa.weight");
  ASSIGN_OR_RETURN(const HostMatrix kv_a, up.ReadHost(kv_a_name, quantize));
  ASSIGN_OR_RETURN(lw->kv_a, up.Derived(kv_a_name + "#latent", kv_a.PickRows(0, r, same), dtype));
  ASSIGN_OR_RETURN(lw->k_rope, up.Derived(kv_a_name + "#rope", kv_a.PickRows(r, dr, rope), dtype));
  ASSIGN_OR_RETURN(lw->kv_a_norm, up.Vector(Attn(l, "kv_a_layernorm.weight")));

  const std::string kv_b_name = Attn(l, "kv_b_proj.weight");
  ASSIGN_OR_RETURN(const HostMatrix kv_b, up.ReadHost(kv_b_name, quantize));  // [heads * (dn + dv), r]
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * (dn + dv);
    ASSIGN_OR_RETURN(const HostMatrix k_t, kv_b.TransposedRows(base, dn, kv_b_name));  // [r, dn]
    ASSIGN_OR_RETURN(WeightRef kt, up.Derived(absl::StrCat(kv_b_name, "#k_up_t.", h), k_t, dtype));
    ASSIGN_OR_RETURN(WeightRef vu, up.Derived(absl::StrCat(kv_b_name, "#v_up.", h), kv_b.PickRows(base + dn, dv, same), dtype));
    lw->k_up_t.push_back(kt);
    lw->v_up.push_back(vu);
  }
  ASSIGN_OR_RETURN(lw->o, up.Matrix({Attn(l, "o_proj.weight")}, dtype));
  return absl::OkStatus();
}

absl::Status LoadDeepseekMlp(const ModelConfig& c, int64_t l, DType dtype, const std::vector<bool>& held,
                             Uploader& up, LayerWeights* lw) {
  if (c.dense_layer(l)) return LoadDenseMlp(l, dtype, up, lw);
  ASSIGN_OR_RETURN(lw->router, up.Matrix({tn::Router(c, l)}, DType::kF32));
  if (c.router.correction_bias) {
    ASSIGN_OR_RETURN(lw->router_bias, up.Vector(tn::Layer(l, "mlp.gate.e_score_correction_bias")));
  }
  RETURN_IF_ERROR(LoadRoutedExperts(c, l, dtype, held, up, lw));
  if (c.has_shared_expert()) {
    ASSIGN_OR_RETURN(lw->shared_w13, up.Matrix({tn::Layer(l, "mlp.shared_experts.gate_proj.weight"),
                                                tn::Layer(l, "mlp.shared_experts.up_proj.weight")},
                                               dtype));
    ASSIGN_OR_RETURN(lw->shared_w2, up.Matrix({tn::Layer(l, "mlp.shared_experts.down_proj.weight")}, dtype));
  }
  return absl::OkStatus();
}

}  // namespace moeserve
