// The model's device workspaces: sized for the largest step so far, grown (never shrunk) when a
// step needs more.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "models/moe_model.h"

namespace moeserve {

absl::Status MoeModel::EnsureWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows,
                                       int64_t logit_edits) {
  absl::Status s = GrowWorkspace(tokens, table_elems, logit_rows, logit_edits);
  // A half-grown workspace would keep device memory that the next, smaller step may need.
  if (!s.ok()) ws_ = Workspace();
  return s;
}

absl::Status MoeModel::GrowMla(int64_t n) {
  const MlaConfig& m = config().mla;
  const int64_t nh = n * config().num_attention_heads;
  const int64_t widest = std::max({m.qk_nope_head_dim, m.kv_lora_rank, m.v_head_dim});
  const size_t f = sizeof(float);
  for (auto [buf, elems] : {std::pair{&ws_.mla_qa, n * m.q_lora_rank}, {&ws_.mla_q_nope, nh * m.qk_nope_head_dim},
                            {&ws_.mla_q_rope, nh * m.qk_rope_head_dim}, {&ws_.mla_latent, n * m.kv_lora_rank},
                            {&ws_.mla_k_rope, n * m.qk_rope_head_dim}, {&ws_.mla_head_a, nh * widest},
                            {&ws_.mla_head_b, nh * widest}, {&ws_.mla_q_latent, nh * m.kv_lora_rank},
                            {&ws_.mla_o_latent, nh * m.kv_lora_rank}}) {
    *buf = DeviceBuffer();
    ASSIGN_OR_RETURN(*buf, backend_->Allocate(std::max<size_t>(elems * f, 64)));
  }
  ws_.mla_head_rows = DeviceBuffer();
  ws_.mla_token_rows = DeviceBuffer();
  ws_.mla_head_offsets = DeviceBuffer();
  ASSIGN_OR_RETURN(ws_.mla_head_rows, backend_->Allocate(nh * sizeof(int32_t)));
  ASSIGN_OR_RETURN(ws_.mla_token_rows, backend_->Allocate(nh * sizeof(int32_t)));
  ASSIGN_OR_RETURN(ws_.mla_head_offsets, backend_->Allocate((config().num_attention_heads + 1) * sizeof(int64_t)));
  return absl::OkStatus();
}

absl::Status MoeModel::GrowWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows,
                                     int64_t logit_edits) {
  const ModelConfig& c = config();
  auto grow = [&](DeviceBuffer& b, size_t bytes) -> absl::Status {
    if (b.bytes() >= bytes && !b.empty()) return absl::OkStatus();
    b = DeviceBuffer();
    ASSIGN_OR_RETURN(b, backend_->Allocate(std::max<size_t>(bytes, 64)));
    return absl::OkStatus();
  };
  if (tokens > ws_.capacity_tokens) {
    const int64_t n = std::max<int64_t>(tokens, 2 * ws_.capacity_tokens);
    const int64_t k = c.num_experts_per_tok;
    // The MLP rows per token: k routed experts' of intermediate_size, or one shared or dense MLP
    // (one at a time; they share the buffers).
    const int64_t widest = std::max({k * c.intermediate_size, c.shared_expert_intermediate_size, c.dense_intermediate_size});
    const size_t f = sizeof(float);
    RETURN_IF_ERROR(grow(ws_.x, n * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.xn, n * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.q, n * c.q_dim() * f));
    RETURN_IF_ERROR(grow(ws_.k, n * c.kv_dim() * f));
    RETURN_IF_ERROR(grow(ws_.v, n * c.kv_dim() * f));
    RETURN_IF_ERROR(grow(ws_.attn, n * std::max(c.q_dim(), c.num_attention_heads * c.mla.v_head_dim) * f));
    if (c.is_mla()) RETURN_IF_ERROR(GrowMla(n));
    RETURN_IF_ERROR(grow(ws_.router_logits, n * c.num_local_experts * f));
    RETURN_IF_ERROR(grow(ws_.topk_ids, n * k * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.topk_w, n * k * f));
    RETURN_IF_ERROR(grow(ws_.sorted_x, n * k * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.gate_up, n * 2 * widest * f));
    RETURN_IF_ERROR(grow(ws_.act, n * widest * f));
    RETURN_IF_ERROR(grow(ws_.expert_out, n * k * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.combine_rows, n * k * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.gather_rows, n * k * sizeof(int32_t)));
    const int64_t e1 = c.num_local_experts + 1;
    RETURN_IF_ERROR(grow(ws_.route_offsets, (shard_.layer_end - shard_.layer_begin) * e1 * sizeof(int64_t)));
    RETURN_IF_ERROR(grow(ws_.shared_gate, n * f));
    RETURN_IF_ERROR(grow(ws_.ids, n * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.positions, n * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.token_seq, n * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.slots, n * sizeof(int64_t)));
    ws_.capacity_tokens = n;
  }
  if (table_elems > ws_.block_table_capacity) {
    const int64_t n = std::max<int64_t>(table_elems, 2 * ws_.block_table_capacity);
    RETURN_IF_ERROR(grow(ws_.block_tables, n * sizeof(int32_t)));
    ws_.block_table_capacity = n;
  }
  if (logit_rows > ws_.logit_capacity) {
    const int64_t n = std::max<int64_t>(logit_rows, 2 * ws_.logit_capacity);
    RETURN_IF_ERROR(grow(ws_.logit_rows, n * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.final_x, n * c.hidden_size * sizeof(float)));
    RETURN_IF_ERROR(grow(ws_.logits, n * c.vocab_size * sizeof(float)));
    RETURN_IF_ERROR(grow(ws_.sample_specs, n * sizeof(SampleSpec)));
    RETURN_IF_ERROR(grow(ws_.sampled, n * sizeof(int32_t)));
    ws_.logit_capacity = n;
  }
  if (logit_edits > 0) RETURN_IF_ERROR(grow(ws_.logit_edits, 2 * logit_edits * sizeof(LogitEdit)));
  return absl::OkStatus();
}

}  // namespace moeserve
