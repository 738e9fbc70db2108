// MoE transformer forward.
#include "models/moe_model.h"

#include "core/clock.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

KvLayout KvLayoutFor(const ModelConfig& c, int64_t num_blocks, int64_t block_size, DType dtype) {
  KvLayout l;
  l.num_blocks = num_blocks;
  l.num_layers = c.num_hidden_layers;
  l.block_size = block_size;
  l.kv_heads = c.num_key_value_heads;
  l.head_dim = c.head_dim;
  l.dtype = dtype;
  return l;
}

MoeModel::MoeModel(const ModelWeights* weights, Backend* backend, ModelShard shard)
    : weights_(weights), backend_(backend), shard_(std::move(shard)) {
  if (shard_.layer_end < 0) shard_.layer_end = config().num_hidden_layers;
}

absl::Status MoeModel::Validate(const ForwardInput& in, const KvLayout& layout) const {
  if (weights_->released()) {
    return absl::FailedPreconditionError("forward: these weights were released (the copy the ranks were sharded from)");
  }
  const ModelConfig& c = config();
  const int64_t t = in.num_tokens();
  if (t == 0 && !expert_parallel()) return absl::InvalidArgumentError("forward: no tokens");
  if (static_cast<int64_t>(in.positions.size()) != t || static_cast<int64_t>(in.token_seq.size()) != t ||
      static_cast<int64_t>(in.slots.size()) != t) {
    return absl::InvalidArgumentError("forward: token_ids, positions, token_seq and slots differ in length");
  }
  if (static_cast<int64_t>(in.block_tables.size()) != in.num_seqs * in.max_blocks_per_seq) {
    return absl::InvalidArgumentError("forward: block_tables is not num_seqs x max_blocks_per_seq");
  }
  if (shard_.layer_begin < 0 || shard_.layer_begin >= shard_.layer_end || shard_.layer_end > c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("forward: layers [", shard_.layer_begin, ", ", shard_.layer_end,
                                                   ") are not a stage of ", c.num_hidden_layers, " layers"));
  }
  if (expert_parallel() && static_cast<int64_t>(shard_.expert_owner.size()) != c.num_local_experts) {
    return absl::InvalidArgumentError("forward: expert_owner must name the rank of every expert");
  }
  if (layout.num_layers != shard_.layer_end - shard_.layer_begin || layout.kv_heads != c.num_key_value_heads ||
      layout.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("forward: KV layout does not match the model config");
  }
  for (int64_t i = 0; i < t; ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", in.token_ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    if (in.positions[i] < 0 || in.positions[i] >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("position ", in.positions[i], " at index ", i,
                                                     " is outside [0, max_position_embeddings=",
                                                     c.max_position_embeddings, ")"));
    }
    if (in.token_seq[i] < 0 || in.token_seq[i] >= in.num_seqs) {
      return absl::InvalidArgumentError(absl::StrCat("token_seq ", in.token_seq[i], " out of range"));
    }
    const int64_t needed_blocks = in.positions[i] / layout.block_size + 1;
    if (needed_blocks > in.max_blocks_per_seq) {
      return absl::InvalidArgumentError(absl::StrCat("position ", in.positions[i], " needs ", needed_blocks,
                                                     " blocks but the block table has ", in.max_blocks_per_seq));
    }
    if (in.slots[i] < 0 || in.slots[i] >= layout.num_blocks * layout.block_size) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", in.slots[i], " outside the KV cache"));
    }
  }
  for (int32_t b : in.block_tables) {
    if (b < 0 || b >= layout.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block id ", b, " outside the KV cache of ",
                                                     layout.num_blocks, " blocks"));
    }
  }
  for (int32_t r : in.logit_rows) {
    if (r < 0 || r >= t) return absl::InvalidArgumentError(absl::StrCat("logit row ", r, " out of range"));
  }
  if (!in.sample.empty() && in.sample.size() != in.logit_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sample: ", in.sample.size(), " specs for ", in.logit_rows.size(),
                                                   " logit rows"));
  }
  for (const SampleSpec& s : in.sample) {
    if (!(s.temperature >= 0.0f) || !(s.top_p > 0.0f && s.top_p <= 1.0f) || s.top_k < 0 || !(s.u >= 0.0 && s.u < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("sample spec out of range: temperature ", s.temperature,
                                                     " (>= 0), top_p ", s.top_p, " ((0, 1]), top_k ", s.top_k,
                                                     " (>= 0), u ", s.u, " ([0, 1))"));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeModel::EnsureWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows) {
  absl::Status s = GrowWorkspace(tokens, table_elems, logit_rows);
  // A half-grown workspace would keep device memory that the next, smaller step may need.
  if (!s.ok()) ws_ = Workspace();
  return s;
}

absl::Status MoeModel::GrowWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows) {
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
    const int64_t inter = std::max(c.intermediate_size, c.shared_expert_intermediate_size);
    const size_t f = sizeof(float);
    RETURN_IF_ERROR(grow(ws_.x, n * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.xn, n * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.q, n * c.q_dim() * f));
    RETURN_IF_ERROR(grow(ws_.k, n * c.kv_dim() * f));
    RETURN_IF_ERROR(grow(ws_.v, n * c.kv_dim() * f));
    RETURN_IF_ERROR(grow(ws_.attn, n * c.q_dim() * f));
    RETURN_IF_ERROR(grow(ws_.router_logits, n * c.num_local_experts * f));
    RETURN_IF_ERROR(grow(ws_.topk_ids, n * k * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.topk_w, n * k * f));
    RETURN_IF_ERROR(grow(ws_.sorted_x, n * k * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.gate_up, n * k * 2 * inter * f));
    RETURN_IF_ERROR(grow(ws_.act, n * k * inter * f));
    RETURN_IF_ERROR(grow(ws_.expert_out, n * k * c.hidden_size * f));
    RETURN_IF_ERROR(grow(ws_.combine_rows, n * k * sizeof(int32_t)));
    RETURN_IF_ERROR(grow(ws_.gather_rows, n * k * sizeof(int32_t)));
    if (expert_parallel()) RETURN_IF_ERROR(grow(ws_.ep_send_ids, n * k * sizeof(int32_t)));
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
  return absl::OkStatus();
}

absl::Status MoeModel::EnsureExpertRows(int64_t rows) {
  if (rows <= ws_.ep_capacity_rows) return absl::OkStatus();
  const ModelConfig& c = config();
  const int64_t n = std::max<int64_t>(rows, 2 * ws_.ep_capacity_rows);
  ws_.ep_capacity_rows = 0;  // until every buffer below has grown
  const size_t f = sizeof(float), i32 = sizeof(int32_t);
  DeviceBuffer* bufs[] = {&ws_.ep_recv, &ws_.ep_recv_ids, &ws_.ep_perm, &ws_.ep_unperm,
                          &ws_.ep_in,   &ws_.ep_gate_up,  &ws_.ep_act,  &ws_.ep_out};
  const size_t row_bytes[] = {c.hidden_size * f, i32, i32, i32, c.hidden_size * f, 2 * c.intermediate_size * f,
                              c.intermediate_size * f, c.hidden_size * f};
  for (DeviceBuffer* b : bufs) *b = DeviceBuffer();
  for (size_t i = 0; i < std::size(bufs); ++i) {
    auto grown = backend_->Allocate(std::max<size_t>(n * row_bytes[i], 64));
    if (!grown.ok()) {
      for (DeviceBuffer* b : bufs) *b = DeviceBuffer();
      return grown.status();
    }
    *bufs[i] = std::move(*grown);
  }
  ws_.ep_capacity_rows = n;
  return absl::OkStatus();
}

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
  auto key = [&](int32_t i) { return int64_t{shard_.expert_owner[host_ids_[i]]} * e_count + host_ids_[i]; };
  std::stable_sort(ep_order_.begin(), ep_order_.end(), [&](int32_t x, int32_t y) { return key(x) < key(y); });
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
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.gather_rows.data(), host_gather_.data(), a * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ep_send_ids.data(), ep_send_experts_.data(), a * sizeof(int32_t)));
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
  RETURN_IF_ERROR(ep.AllToAll(ws_.ep_send_ids.data(), scaled(send_rows, sizeof(int32_t)), ws_.ep_recv_ids.data(),
                              scaled(recv_rows, sizeof(int32_t))));
  RETURN_IF_ERROR(ep.AllToAll(send, scaled(send_rows, row_bytes), ws_.ep_recv.data(), scaled(recv_rows, row_bytes)));
  ep_recv_experts_.resize(r_total);
  if (r_total > 0) {
    RETURN_IF_ERROR(backend_->CopyToHost(ep_recv_experts_.data(), ws_.ep_recv_ids.data(), r_total * sizeof(int32_t)));
  }

  // Run this rank's experts on what it received, grouped by expert (stable).
  ep_offsets_.assign(e_count + 1, 0);
  for (int32_t e : ep_recv_experts_) {
    if (e < 0 || e >= e_count || shard_.expert_owner[e] != me) {
      return absl::InternalError(absl::StrCat("expert parallel: rank ", me, " received a row for expert ", e,
                                              ", which it does not hold"));
    }
    ++ep_offsets_[e + 1];
  }
  for (int64_t e = 0; e < e_count; ++e) {
    if (stats != nullptr) {
      if (static_cast<int64_t>(stats->expert_rows.size()) != e_count) stats->expert_rows.assign(e_count, 0);
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
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ep_perm.data(), perm.data(), r_total * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ep_unperm.data(), sorted_of.data(), r_total * sizeof(int32_t)));
    backend_->GatherRows(ws_.ep_recv.as<float>(), ws_.ep_perm.as<int32_t>(), r_total, h, ws_.ep_in.as<float>());
    backend_->GroupedGemm(ws_.ep_in.as<float>(), lw.w13, ep_offsets_, ws_.ep_gate_up.as<float>());
    backend_->SiluMul(ws_.ep_gate_up.as<float>(), r_total, inter, ws_.ep_act.as<float>());
    backend_->GroupedGemm(ws_.ep_act.as<float>(), lw.w2, ep_offsets_, ws_.ep_out.as<float>());
    backend_->GatherRows(ws_.ep_out.as<float>(), ws_.ep_unperm.as<int32_t>(), r_total, h, back);
  }
  // Results go back the way they came (into send order), then combine as on one rank.
  RETURN_IF_ERROR(backend_->Synchronize());
  float* results = ws_.expert_out.as<float>();
  RETURN_IF_ERROR(ep.AllToAll(back, scaled(recv_rows, row_bytes), results, scaled(send_rows, row_bytes)));
  if (stats != nullptr) {
    const CommStats after = ep.stats();
    stats->comm_seconds += after.seconds - before.seconds;
    stats->comm_bytes += after.bytes_sent - before.bytes_sent;
    stats->expert_assignments += a;
  }
  if (t == 0) return absl::OkStatus();
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.combine_rows.data(), host_combine_.data(), a * sizeof(int32_t)));
  backend_->ScatterCombine(results, ws_.combine_rows.as<int32_t>(), ws_.topk_w.as<float>(), t, k, h,
                           ws_.x.as<float>(), /*accumulate=*/true);
  return absl::OkStatus();
}

absl::Status MoeModel::MoeLayer(const LayerWeights& lw, int64_t t, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size, e_count = c.num_local_experts, k = c.num_experts_per_tok;
  const int64_t inter = c.intermediate_size;
  float* xn = ws_.xn.as<float>();
  host_ids_.resize(t * k);
  if (t > 0) {
    backend_->Gemm(xn, t, lw.router, ws_.router_logits.as<float>());
    backend_->RouterTopK(ws_.router_logits.as<float>(), t, e_count, k, c.norm_topk_prob,
                         ws_.topk_ids.as<int32_t>(), ws_.topk_w.as<float>());
    RETURN_IF_ERROR(backend_->CopyToHost(host_ids_.data(), ws_.topk_ids.data(), t * k * sizeof(int32_t)));
  }
  if (expert_parallel()) {
    RETURN_IF_ERROR(ExpertParallel(lw, t, stats));
    return SharedExpert(lw, t);
  }

  // Plan the dispatch on the host: sort the (token, slot) assignments by expert.
  offsets_.assign(e_count + 1, 0);
  for (int32_t e : host_ids_) ++offsets_[e + 1];
  for (int64_t e = 0; e < e_count; ++e) {
    offsets_[e + 1] += offsets_[e];
    if (stats != nullptr && offsets_[e + 1] > offsets_[e]) ++stats->experts_hit;
  }
  host_gather_.resize(t * k);
  host_combine_.resize(t * k);
  std::vector<int64_t> cursor(offsets_.begin(), offsets_.end() - 1);
  for (int64_t i = 0; i < t * k; ++i) {
    const int64_t row = cursor[host_ids_[i]]++;
    host_gather_[row] = static_cast<int32_t>(i / k);  // source token of sorted row
    host_combine_[i] = static_cast<int32_t>(row);     // sorted row of assignment i
  }
  if (stats != nullptr) stats->expert_assignments += t * k;
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.gather_rows.data(), host_gather_.data(), t * k * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.combine_rows.data(), host_combine_.data(), t * k * sizeof(int32_t)));

  float* sorted_x = ws_.sorted_x.as<float>();
  float* gate_up = ws_.gate_up.as<float>();
  float* act = ws_.act.as<float>();
  float* expert_out = ws_.expert_out.as<float>();
  backend_->GatherRows(xn, ws_.gather_rows.as<int32_t>(), t * k, h, sorted_x);
  backend_->GroupedGemm(sorted_x, lw.w13, offsets_, gate_up);  // [t*k, 2*inter]
  backend_->SiluMul(gate_up, t * k, inter, act);               // [t*k, inter]
  backend_->GroupedGemm(act, lw.w2, offsets_, expert_out);     // [t*k, hidden]
  backend_->ScatterCombine(expert_out, ws_.combine_rows.as<int32_t>(), ws_.topk_w.as<float>(), t, k, h,
                           ws_.x.as<float>(), /*accumulate=*/true);
  return SharedExpert(lw, t);
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

// What the families add between the projections and RoPE: Qwen2-MoE's q/k/v biases, Qwen3-MoE's
// RMSNorm of each head of q and k, OLMoE's RMSNorm of the whole q and k projections.
void MoeModel::AttentionExtras(const LayerWeights& lw, int64_t t) {
  const ModelConfig& c = config();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* q = ws_.q.as<float>();
  float* k = ws_.k.as<float>();
  if (lw.q_bias != nullptr) {
    backend_->AddBias(q, lw.q_bias, t, c.q_dim());
    backend_->AddBias(k, lw.k_bias, t, c.kv_dim());
    backend_->AddBias(ws_.v.as<float>(), lw.v_bias, t, c.kv_dim());
  }
  if (c.qk_norm == QkNorm::kPerHead) {
    backend_->RmsNorm(q, lw.q_norm, t * c.num_attention_heads, c.head_dim, eps, q);
    backend_->RmsNorm(k, lw.k_norm, t * c.num_key_value_heads, c.head_dim, eps, k);
  } else if (c.qk_norm == QkNorm::kWhole) {
    backend_->RmsNorm(q, lw.q_norm, t, c.q_dim(), eps, q);
    backend_->RmsNorm(k, lw.k_norm, t, c.kv_dim(), eps, k);
  }
}

absl::Status MoeModel::Forward(const ForwardInput& in, const KvLayout& layout, void* kv_cache,
                               std::vector<float>* logits, ForwardStats* stats, std::vector<int32_t>* sampled) {
  return ForwardShard(in, layout, kv_cache, nullptr, nullptr, logits, stats, sampled);
}

absl::Status MoeModel::ForwardShard(const ForwardInput& in, const KvLayout& layout, void* kv_cache,
                                    const float* hidden_in, const float** hidden_out,
                                    std::vector<float>* logits, ForwardStats* stats,
                                    std::vector<int32_t>* sampled) {
  RETURN_IF_ERROR(Validate(in, layout));
  const ModelConfig& c = config();
  const bool first = shard_.layer_begin == 0, last = shard_.layer_end == c.num_hidden_layers;
  if (!first && hidden_in == nullptr && in.num_tokens() > 0) {
    return absl::InvalidArgumentError("forward: a stage after the first needs the previous stage's hidden states");
  }
  if (!last && hidden_out == nullptr) return absl::InvalidArgumentError("forward: a stage before the last needs hidden_out");
  const int64_t t = in.num_tokens();
  const int64_t h = c.hidden_size;
  const int64_t r = static_cast<int64_t>(in.logit_rows.size());
  RETURN_IF_ERROR(EnsureWorkspace(std::max<int64_t>(t, 1), std::max<int64_t>(in.block_tables.size(), 1), r));
  if (stats != nullptr) {
    *stats = ForwardStats();
    stats->tokens = t;
  }
  if (t > 0) {
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ids.data(), in.token_ids.data(), t * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.positions.data(), in.positions.data(), t * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.token_seq.data(), in.token_seq.data(), t * sizeof(int32_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.slots.data(), in.slots.data(), t * sizeof(int64_t)));
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.block_tables.data(), in.block_tables.data(),
                                           in.block_tables.size() * sizeof(int32_t)));
  }

  AttentionBatch batch;
  batch.token_seq = ws_.token_seq.as<int32_t>();
  batch.token_pos = ws_.positions.as<int32_t>();
  batch.block_tables = ws_.block_tables.as<int32_t>();
  batch.num_tokens = t;
  batch.num_seqs = in.num_seqs;
  batch.max_blocks_per_seq = in.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  float* x = ws_.x.as<float>();
  float* xn = ws_.xn.as<float>();
  Stopwatch phase;
  auto lap = [&](double ForwardStats::*field) {
    if (stats != nullptr) stats->*field += phase.Seconds();
    phase.Reset();
  };
  if (t > 0) {
    if (first) {
      backend_->Embedding(ws_.ids.as<int32_t>(), t, weights_->embed(), x);  // [t, hidden]
    } else {
      RETURN_IF_ERROR(backend_->CopyOnDevice(x, hidden_in, t * h * sizeof(float)));
    }
  }
  lap(&ForwardStats::head_seconds);
  for (int64_t l = shard_.layer_begin; l < shard_.layer_end; ++l) {
    const LayerWeights& lw = weights_->layer(l);
    const int64_t kv_layer = l - shard_.layer_begin;  // the stage's cache holds its layers only
    const float eps = static_cast<float>(c.rms_norm_eps);
    if (t > 0) {
      backend_->RmsNorm(x, lw.attn_norm, t, h, eps, xn);
      backend_->Gemm(xn, t, lw.q, ws_.q.as<float>());  // [t, heads, head_dim]
      backend_->Gemm(xn, t, lw.k, ws_.k.as<float>());  // [t, kv_heads, head_dim]
      backend_->Gemm(xn, t, lw.v, ws_.v.as<float>());
      AttentionExtras(lw, t);
      backend_->Rope(ws_.q.as<float>(), ws_.k.as<float>(), ws_.positions.as<int32_t>(), t,
                     c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     static_cast<float>(c.rope_theta));
      backend_->WriteKv(ws_.k.as<float>(), ws_.v.as<float>(), ws_.slots.as<int64_t>(), t, layout, kv_layer,
                        kv_cache);
      backend_->PagedAttention(ws_.q.as<float>(), batch, layout, kv_layer, kv_cache, c.num_attention_heads, scale,
                               ws_.attn.as<float>());
      backend_->Gemm(ws_.attn.as<float>(), t, lw.o, x, /*accumulate=*/true);  // residual
      backend_->RmsNorm(x, lw.mlp_norm, t, h, eps, xn);
    }
    lap(&ForwardStats::attention_seconds);
    RETURN_IF_ERROR(MoeLayer(lw, t, stats));
    lap(&ForwardStats::moe_seconds);
  }
  if (!last) {
    *hidden_out = x;
    if (logits != nullptr) logits->clear();
    return backend_->Synchronize();
  }
  if (sampled != nullptr) sampled->clear();
  if (r == 0) {
    logits->clear();
    return backend_->Synchronize();
  }
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.logit_rows.data(), in.logit_rows.data(), r * sizeof(int32_t)));
  float* fx = ws_.final_x.as<float>();
  backend_->GatherRows(x, ws_.logit_rows.as<int32_t>(), r, h, fx);
  backend_->RmsNorm(fx, weights_->final_norm(), r, h, static_cast<float>(c.rms_norm_eps), fx);
  backend_->Gemm(fx, r, weights_->lm_head(), ws_.logits.as<float>());  // [r, vocab]
  if (!in.sample.empty()) {
    if (sampled == nullptr) return absl::InvalidArgumentError("forward: sampling specs but nowhere to put the tokens");
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.sample_specs.data(), in.sample.data(), r * sizeof(SampleSpec)));
    backend_->SampleRows(ws_.logits.as<float>(), r, c.vocab_size, ws_.sample_specs.as<SampleSpec>(),
                         ws_.sampled.as<int32_t>());
    sampled->resize(static_cast<size_t>(r));
    RETURN_IF_ERROR(backend_->CopyToHost(sampled->data(), ws_.sampled.data(), r * sizeof(int32_t)));
  }
  if (in.logits_to_host) {
    logits->resize(static_cast<size_t>(r * c.vocab_size));
    RETURN_IF_ERROR(backend_->CopyToHost(logits->data(), ws_.logits.data(), logits->size() * sizeof(float)));
  } else {
    logits->clear();
  }
  absl::Status s = backend_->Synchronize();
  lap(&ForwardStats::head_seconds);
  return s;
}

}  // namespace moeserve
