// The MoE layer: routing, the routed experts on this rank or across the EP group (all-to-all),
// the shared expert, and the combine.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "models/moe_model.h"

namespace moeserve {

// Every buffer handed to the communicator is device memory of this rank's backend (host
// memory on the CPU backend), so the same code runs over LocalCommunicator and over NCCL; only
// the routing plan (expert ids and counts, a few bytes per row) visits the host.
absl::Status MoeModel::ExpertParallel(const LayerWeights& lw, int64_t t, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size, e_count = c.num_local_experts, k = c.num_experts_per_tok;
  const int64_t inter = c.intermediate_size;
  Communicator& ep = *shard_.ep;
  const int n = ep.size(), me = ep.rank();
  const CommStats before = ep.stats();
  const int64_t a = t * k;  // (token, slot) assignments of this rank's tokens

  // Order the assignments by destination rank, then expert (stable: token order within).
  ep_order_.resize(a);
  for (int64_t i = 0; i < a; ++i) ep_order_[i] = static_cast<int32_t>(i);
  auto key = [&](int32_t i) {
    return int64_t{shard_.expert_owner[host_ids_[i]]} * e_count + host_ids_[i];
  };
  std::stable_sort(ep_order_.begin(), ep_order_.end(),
                   [&](int32_t x, int32_t y) { return key(x) < key(y); });
  std::vector<int64_t> send_rows(n, 0), recv_rows;
  host_combine_.resize(a);
  host_gather_.resize(a);
  ep_send_experts_.resize(a);
  for (int64_t j = 0; j < a; ++j) {
    const int32_t i = ep_order_[j];
    const int32_t e = host_ids_[i];
    ++send_rows[shard_.expert_owner[e]];
    ep_send_experts_[j] = e;
    host_gather_[j] = static_cast<int32_t>(i / k);  // send row j is token i / k's hidden state
    host_combine_[i] = static_cast<int32_t>(j);     // its result comes back as row j
  }
  // The send buffer: this rank's tokens, one row per assignment, in send order (on the device).
  float* send = ws_.sorted_x.as<float>();
  if (a > 0) {
    RETURN_IF_ERROR(
        backend_->CopyToDevice(ws_.gather_rows.data(), host_gather_.data(), a * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ep_send_ids.data(), ep_send_experts_.data(),
                                           a * sizeof(int32_t)));
    backend_->GatherRows(ws_.xn.as<float>(), ws_.gather_rows.as<int32_t>(), a, h, send);
  }
  // Dispatch: counts, then expert ids and hidden rows.
  RETURN_IF_ERROR(ep.AllToAllCounts(send_rows, &recv_rows));
  int64_t r_total = 0;
  for (int64_t r : recv_rows) r_total += r;
  auto scaled = [](const std::vector<int64_t>& rows, int64_t bytes) {
    std::vector<int64_t> out(rows.size());
    for (size_t p = 0; p < rows.size(); ++p) out[p] = rows[p] * bytes;
    return out;
  };
  RETURN_IF_ERROR(EnsureExpertRows(std::max<int64_t>(r_total, 1)));
  RETURN_IF_ERROR(backend_->Synchronize());  // the communicator reads what the compute stream wrote
  const int64_t row_bytes = h * static_cast<int64_t>(sizeof(float));
  RETURN_IF_ERROR(ep.AllToAll(ws_.ep_send_ids.data(), scaled(send_rows, sizeof(int32_t)),
                              ws_.ep_recv_ids.data(), scaled(recv_rows, sizeof(int32_t))));
  RETURN_IF_ERROR(ep.AllToAll(send, scaled(send_rows, row_bytes), ws_.ep_recv.data(),
                              scaled(recv_rows, row_bytes)));
  ep_recv_experts_.resize(r_total);
  if (r_total > 0) {
    RETURN_IF_ERROR(backend_->CopyToHost(ep_recv_experts_.data(), ws_.ep_recv_ids.data(),
                                         r_total * sizeof(int32_t)));
  }

  // Run this rank's experts on what it received, grouped by expert (stable).
  ep_offsets_.assign(e_count + 1, 0);
  for (int32_t e : ep_recv_experts_) {
    if (e < 0 || e >= e_count || shard_.expert_owner[e] != me) {
      return absl::InternalError(absl::StrCat("expert parallel: rank ", me,
                                              " received a row for expert ", e,
                                              ", which it does not hold"));
    }
    ++ep_offsets_[e + 1];
  }
  for (int64_t e = 0; e < e_count; ++e) {
    if (stats != nullptr) {
      if (static_cast<int64_t>(stats->expert_rows.size()) != e_count)
        stats->expert_rows.assign(e_count, 0);
      stats->expert_rows[e] += ep_offsets_[e + 1];
      if (ep_offsets_[e + 1] > 0) ++stats->experts_hit;
    }
    ep_offsets_[e + 1] += ep_offsets_[e];
  }
  // sorted_of[r]: the row of received row r in expert order; perm is its inverse.
  std::vector<int64_t> cursor(ep_offsets_.begin(), ep_offsets_.end() - 1);
  std::vector<int32_t> sorted_of(r_total), perm(r_total);
  for (int64_t r = 0; r < r_total; ++r) {
    sorted_of[r] = static_cast<int32_t>(cursor[ep_recv_experts_[r]]++);
    perm[sorted_of[r]] = static_cast<int32_t>(r);
  }
  float* back = ws_.ep_in.as<float>();  // free again once the first expert GEMM has read it
  if (r_total > 0) {
    RETURN_IF_ERROR(
        backend_->CopyToDevice(ws_.ep_perm.data(), perm.data(), r_total * sizeof(int32_t)));
    RETURN_IF_ERROR(
        backend_->CopyToDevice(ws_.ep_unperm.data(), sorted_of.data(), r_total * sizeof(int32_t)));
    backend_->GatherRows(ws_.ep_recv.as<float>(), ws_.ep_perm.as<int32_t>(), r_total, h,
                         ws_.ep_in.as<float>());
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ep_offsets.data(), ep_offsets_.data(),
                                           ep_offsets_.size() * sizeof(int64_t)));
    const int64_t* offsets = ws_.ep_offsets.as<int64_t>();
    backend_->GroupedGemm(ws_.ep_in.as<float>(), lw.w13, offsets, r_total, ws_.ep_gate_up.as<float>());
    backend_->SiluMul(ws_.ep_gate_up.as<float>(), r_total, inter, ws_.ep_act.as<float>());
    backend_->GroupedGemm(ws_.ep_act.as<float>(), lw.w2, offsets, r_total, ws_.ep_out.as<float>());
    backend_->GatherRows(ws_.ep_out.as<float>(), ws_.ep_unperm.as<int32_t>(), r_total, h, back);
  }
  // Results go back the way they came (into send order), then combine as on one rank.
  RETURN_IF_ERROR(backend_->Synchronize());
  float* results = ws_.expert_out.as<float>();
  RETURN_IF_ERROR(
      ep.AllToAll(back, scaled(recv_rows, row_bytes), results, scaled(send_rows, row_bytes)));
  if (stats != nullptr) {
    const CommStats after = ep.stats();
    stats->comm_seconds += after.seconds - before.seconds;
    stats->comm_bytes += after.bytes_sent - before.bytes_sent;
    stats->expert_assignments += a;
  }
  if (t == 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      backend_->CopyToDevice(ws_.combine_rows.data(), host_combine_.data(), a * sizeof(int32_t)));
  backend_->ScatterCombine(results, ws_.combine_rows.as<int32_t>(), ws_.topk_w.as<float>(), t, k, h,
                           ws_.x.as<float>(), /*accumulate=*/true);
  return absl::OkStatus();
}

absl::Status MoeModel::MoeLayer(const LayerWeights& lw, int64_t layer, int64_t t, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size, e_count = c.num_local_experts, k = c.num_experts_per_tok;
  const int64_t inter = c.intermediate_size;
  float* xn = ws_.xn.as<float>();
  if (t > 0) {
    backend_->Gemm(xn, t, lw.router, ws_.router_logits.as<float>());
    backend_->RouterTopK(ws_.router_logits.as<float>(), t, e_count, k, c.norm_topk_prob,
                         ws_.topk_ids.as<int32_t>(), ws_.topk_w.as<float>());
  }
  if (expert_parallel()) {
    // The all-to-all's per-peer counts are host arguments (MPI, NCCL): this plan needs the ids.
    host_ids_.resize(t * k);
    if (t > 0) {
      RETURN_IF_ERROR(
          backend_->CopyToHost(host_ids_.data(), ws_.topk_ids.data(), t * k * sizeof(int32_t)));
    }
    RETURN_IF_ERROR(ExpertParallel(lw, t, stats));
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
  backend_->GroupedGemm(sorted_x, lw.w13, offsets, t * k, gate_up);  // [t*k, 2*inter]
  backend_->SiluMul(gate_up, t * k, inter, act);                     // [t*k, inter]
  backend_->GroupedGemm(act, lw.w2, offsets, t * k, expert_out);     // [t*k, hidden]
  backend_->ScatterCombine(expert_out, ws_.combine_rows.as<int32_t>(), ws_.topk_w.as<float>(), t, k,
                           h, ws_.x.as<float>(), /*accumulate=*/true);
  return SharedExpert(lw, t);
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
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* o = offsets.data() + l * (e_count + 1);
    for (int64_t e = 0; e < e_count; ++e) stats->experts_hit += o[e + 1] > o[e] ? 1 : 0;
  }
  return absl::OkStatus();
}

absl::Status MoeModel::SharedExpert(const LayerWeights& lw, int64_t t) {
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size;
  float* xn = ws_.xn.as<float>();
  float* gate_up = ws_.gate_up.as<float>();
  float* act = ws_.act.as<float>();
  float* expert_out = ws_.expert_out.as<float>();
  if (t > 0 && c.has_shared_expert()) {
    const int64_t si = c.shared_expert_intermediate_size;
    backend_->Gemm(xn, t, lw.shared_w13, gate_up);  // [t, 2*si]
    backend_->SiluMul(gate_up, t, si, act);         // [t, si]
    backend_->Gemm(act, t, lw.shared_w2, expert_out);
    backend_->Gemm(xn, t, lw.shared_gate, ws_.shared_gate.as<float>());  // [t, 1]
    backend_->SigmoidScaleRows(expert_out, ws_.shared_gate.as<float>(), t, h);
    backend_->Add(ws_.x.as<float>(), expert_out, t * h);
  }
  return absl::OkStatus();
}

}  // namespace moeserve
