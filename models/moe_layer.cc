// The MoE layer: routing, the routed experts on this rank (routing planned on the device) or
// across the EP group (parallel/expert_dispatch.h), the shared expert, and the combine.
#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "models/moe_model.h"

namespace moeserve {

absl::Status MoeModel::MoeLayer(const LayerWeights& lw, int64_t layer, int64_t t, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size, e_count = c.num_local_experts, k = c.num_experts_per_tok;
  const int64_t inter = c.intermediate_size;
  float* xn = ws_.xn.as<float>();
  if (c.dense_layer(layer)) {  // a dense MLP (DeepSeek's first layers, Qwen's mlp_only_layers): each rank its own tokens
    if (t > 0) Mlp(lw.shared_w13, lw.shared_w2, c.dense_intermediate_size, t, /*gate=*/nullptr);
    return absl::OkStatus();
  }
  if (t > 0) Route(lw, t);
  if (expert_parallel()) {
    // Planned on the device; only counts visit the host (parallel/expert_dispatch.h).
    ExpertDispatchStats ds;
    RETURN_IF_ERROR(dispatch_->Run(layer - shard_.layer_begin, xn, ws_.topk_ids.as<int32_t>(), ws_.topk_w.as<float>(), t, lw.w13, lw.w2, ws_.x.as<float>(),
                                   stats != nullptr ? &ds : nullptr));
    if (stats != nullptr) {
      if (stats->expert_rows.empty()) stats->expert_rows.assign(e_count, 0);
      if (stats->layer_expert_rows.empty()) stats->layer_expert_rows.assign(static_cast<size_t>(c.num_hidden_layers * e_count), 0);
      for (int64_t e = 0; e < e_count; ++e) {
        stats->expert_rows[e] += ds.expert_rows[e];
        stats->layer_expert_rows[static_cast<size_t>(layer * e_count + e)] = ds.expert_rows[e];
      }
      stats->experts_hit += ds.experts_hit;
      stats->expert_assignments += ds.assignments;
      stats->comm_seconds += ds.comm_seconds;
      stats->comm_bytes += ds.comm_bytes;
      stats->comm_bytes_outside += ds.comm_bytes_outside;
      stats->collective_spans.insert(stats->collective_spans.end(), ds.spans.begin(), ds.spans.end());
    }
    return SharedExpert(lw, t);
  }
  if (t == 0) return absl::OkStatus();
  if (stats != nullptr) stats->expert_assignments += t * k;
  // The dispatch is planned on the device and read there: no host round trip in the layer. The
  // offsets stay in this layer's slot for the step's statistics (RoutingStats).
  int64_t* offsets = RouteOffsets(layer);
  backend_->PlanRouting(ws_.topk_ids.as<int32_t>(), t, k, e_count, offsets, ws_.gather_rows.as<int32_t>(),
                        ws_.combine_rows.as<int32_t>());
  float* sorted_x = ws_.sorted_x.as<float>();
  float* gate_up = ws_.gate_up.as<float>();
  float* act = ws_.act.as<float>();
  float* expert_out = ws_.expert_out.as<float>();
  backend_->GatherRows(xn, ws_.gather_rows.as<int32_t>(), t * k, h, sorted_x);
  backend_->GroupedSwiGluMlp(sorted_x, lw.w13, lw.w2, offsets, t * k, inter, gate_up, act, expert_out);  // [t*k, hidden]
  backend_->ScatterCombine(expert_out, ws_.combine_rows.as<int32_t>(), ws_.topk_w.as<float>(), t, k,
                           h, ws_.x.as<float>(), /*accumulate=*/true);
  return SharedExpert(lw, t);
}

void MoeModel::Route(const LayerWeights& lw, int64_t t) {
  const ModelConfig& c = config();
  float* logits = ws_.router_logits.as<float>();
  backend_->Gemm(ws_.xn.as<float>(), t, lw.router, logits);
  if (!c.deepseek_moe()) {
    backend_->RouterTopK(logits, t, c.num_local_experts, c.num_experts_per_tok, c.norm_topk_prob,
                         ws_.topk_ids.as<int32_t>(), ws_.topk_w.as<float>());
    return;
  }
  Backend::GroupedRouting spec;
  spec.num_experts = c.num_local_experts;
  spec.top_k = c.num_experts_per_tok;
  spec.sigmoid = c.router.scoring == RouterScoring::kSigmoid;
  spec.n_group = c.router.group_limit == GroupLimit::kNone ? 1 : c.router.n_group;
  spec.topk_group = c.router.group_limit == GroupLimit::kNone ? 1 : c.router.topk_group;
  spec.group_top_two_sum = c.router.group_limit == GroupLimit::kTopTwoSum;
  spec.renormalize = c.norm_topk_prob;
  spec.scaling = static_cast<float>(c.router.routed_scaling_factor);
  backend_->RouterGroupedTopK(logits, t, spec, lw.router_bias, ws_.topk_ids.as<int32_t>(), ws_.topk_w.as<float>());
}

int64_t* MoeModel::RouteOffsets(int64_t layer) {
  return ws_.route_offsets.as<int64_t>() + (layer - shard_.layer_begin) * (config().num_local_experts + 1);
}

absl::Status MoeModel::RoutingStats(int64_t t, ForwardStats* stats) {
  if (stats == nullptr || t == 0 || expert_parallel()) return absl::OkStatus();  // EP counts its own
  const int64_t e_count = config().num_local_experts;
  const int64_t layers = shard_.layer_end - shard_.layer_begin;
  std::vector<int64_t> offsets(layers * (e_count + 1));
  RETURN_IF_ERROR(backend_->CopyToHost(offsets.data(), ws_.route_offsets.data(), offsets.size() * sizeof(int64_t)));
  stats->layer_expert_rows.assign(static_cast<size_t>(config().num_hidden_layers * e_count), 0);
  for (int64_t l = 0; l < layers; ++l) {
    if (config().dense_layer(shard_.layer_begin + l)) continue;  // no routing there
    const int64_t* o = offsets.data() + l * (e_count + 1);
    for (int64_t e = 0; e < e_count; ++e) {
      stats->experts_hit += o[e + 1] > o[e] ? 1 : 0;
      stats->layer_expert_rows[static_cast<size_t>((shard_.layer_begin + l) * e_count + e)] = o[e + 1] - o[e];
    }
  }
  return absl::OkStatus();
}

absl::Status MoeModel::SharedExpert(const LayerWeights& lw, int64_t t) {
  const ModelConfig& c = config();
  if (t > 0 && c.has_shared_expert()) {
    // Qwen2-MoE gates its shared expert by sigmoid(shared_expert_gate . x); DeepSeek's is ungated.
    Mlp(lw.shared_w13, lw.shared_w2, c.shared_expert_intermediate_size, t, c.shared_expert_gated ? &lw.shared_gate : nullptr);
  }
  return absl::OkStatus();
}

void MoeModel::Mlp(const WeightRef& w13, const WeightRef& w2, int64_t inter, int64_t t, const WeightRef* gate) {
  const int64_t h = config().hidden_size;
  float* xn = ws_.xn.as<float>();
  float* gate_up = ws_.gate_up.as<float>();
  float* act = ws_.act.as<float>();
  float* out = ws_.expert_out.as<float>();
  float* shared_gate = ws_.shared_gate.as<float>();
  if (gate != nullptr) {  // the shared expert's gate reads the same rows: one call with w13
    const std::array<WeightRef, 2> w = {w13, *gate};
    const std::array<float*, 2> y = {gate_up, shared_gate};  // [t, 2*inter], [t, 1]
    backend_->Gemms(xn, t, w, y);
  } else {
    backend_->Gemm(xn, t, w13, gate_up);
  }
  backend_->SiluMul(gate_up, t, inter, act);
  backend_->Gemm(act, t, w2, out);
  if (gate != nullptr) backend_->SigmoidScaleRows(out, shared_gate, t, h);
  backend_->Add(ws_.x.as<float>(), out, t * h);
}

}  // namespace moeserve
