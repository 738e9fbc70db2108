// Per-step cost model.
#include "roofline/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "roofline/routing_skew.h"

namespace moeserve::roofline {

ModelCosts ModelCosts::From(const ModelConfig& c, const std::string& weight_dtype, const std::string& kv_dtype) {
  ModelCosts m;
  m.layers = c.num_hidden_layers;
  m.hidden = c.hidden_size;
  m.vocab = c.vocab_size;
  m.experts = c.num_local_experts;
  m.top_k = c.num_experts_per_tok;
  m.heads = c.num_attention_heads;
  m.head_dim = c.head_dim;
  m.moe_layers = c.num_hidden_layers - c.num_dense_layers();
  m.attention_macs_per_head = c.is_mla() ? 2.0 * c.mla.kv_lora_rank + c.mla.qk_rope_head_dim : 2.0 * c.head_dim;
  m.weight_dtype = weight_dtype;
  // FP8: a byte per weight and a 4-byte scale per 128 of a row; the lm_head stays bf16.
  m.weight_bytes_per_param = weight_dtype == "f32" ? 4.0 : weight_dtype == "fp8" ? 1.0 + 4.0 / 128 : 2.0;
  m.lm_head_bytes_per_param = weight_dtype == "fp8" ? 2.0 : m.weight_bytes_per_param;
  const double kv_elem = kv_dtype == "f32" ? 4.0 : 2.0;
  m.kv_bytes_per_token = static_cast<double>(c.num_hidden_layers * c.KvElemsPerToken()) * kv_elem;
  m.expert_params = static_cast<double>(c.ExpertParams());
  m.total_params = static_cast<double>(c.TotalParams());
  m.active_params = static_cast<double>(c.ActiveParams());
  m.lm_head_params = static_cast<double>(c.vocab_size * c.hidden_size);
  const double embedding = static_cast<double>(c.vocab_size * c.hidden_size);
  // Everything but routed experts; the embedding table is read by row, not whole, and with tied
  // embeddings the lm_head is that same table.
  const double untied_head = c.tie_word_embeddings ? 0.0 : m.lm_head_params;
  m.dense_params = m.total_params - m.experts * m.moe_layers * m.expert_params - embedding - untied_head + m.lm_head_params;
  m.replicated_params = m.total_params - m.experts * m.moe_layers * m.expert_params;
  // Per token: every dense weight but the lm_head (counted per logit row) and top-k experts.
  m.flops_per_token = 2.0 * (m.dense_params - m.lm_head_params + m.moe_layers * m.top_k * m.expert_params);
  return m;
}

double ModelCosts::DenseBytes() const {
  return (dense_params - lm_head_params) * weight_bytes_per_param + lm_head_params * lm_head_bytes_per_param;
}

const char* WeightDtypeName(const ModelConfig& c, DType stored) {
  if (c.fp8_checkpoint || stored == DType::kF8E4M3) return "fp8";
  return stored == DType::kF32 ? "f32" : "bf16";
}

int64_t StepShape::Tokens() const {
  int64_t t = 0;
  for (const SeqShape& s : seqs) t += s.new_tokens;
  return t;
}

StepShape StepShape::Decode(int64_t batch, int64_t context) {
  StepShape s;
  s.seqs.assign(static_cast<size_t>(batch), SeqShape{1, context, true});
  return s;
}

double ExpectedExpertsHit(int64_t experts, int64_t top_k, double tokens) {
  if (experts <= 0 || tokens <= 0) return 0.0;
  const double miss = 1.0 - static_cast<double>(top_k) / static_cast<double>(experts);
  return static_cast<double>(experts) * (1.0 - std::pow(std::max(miss, 0.0), tokens));
}

double ExpectedExpertRankImbalance(int64_t experts, int64_t top_k, int64_t ep, double tokens) {
  const int64_t per_rank = ep > 0 ? experts / ep : 0;
  if (ep <= 1 || per_rank <= 0 || tokens <= 0) return 1.0;
  const double p = ExpectedExpertsHit(experts, top_k, tokens) / static_cast<double>(experts);
  if (p <= 0 || p >= 1) return 1.0;
  // E[max of ep counts] = sum over x >= 0 of P(max > x) = 1 - F(x)^ep, F the binomial CDF.
  double cdf = 0, expected_max = 0;
  const double e = static_cast<double>(per_rank);
  for (int64_t x = 0; x < per_rank; ++x) {
    const double xd = static_cast<double>(x);
    cdf += std::exp(std::lgamma(e + 1) - std::lgamma(xd + 1) - std::lgamma(e - xd + 1) + xd * std::log(p) +
                    (e - xd) * std::log1p(-p));
    expected_max += 1.0 - std::pow(std::min(cdf, 1.0), static_cast<double>(ep));
  }
  return std::max(1.0, expected_max / (e * p));
}

double WeightSeconds(const ModelCosts& m, const HardwareProfile& hw, const ParallelLayout& layout, double tokens,
                     double experts_hit, bool any_logits, double bandwidth, double expert_imbalance) {
  if (bandwidth <= 0) bandwidth = hw.mem_bandwidth;
  double dense_bytes = m.DenseBytes();
  if (!any_logits) dense_bytes -= m.lm_head_params * m.lm_head_bytes_per_param;
  const double spread_bytes = (experts_hit * m.expert_params + tokens * m.hidden) * m.weight_bytes_per_param;
  const double share = std::min(1.0, std::max(expert_imbalance, 1.0) / static_cast<double>(layout.ep));
  return dense_bytes / bandwidth + spread_bytes * share / bandwidth;
}

namespace {

// Pipeline parallelism: `tokens` rows cross each of the pp - 1 stage boundaries once, over the
// scale-out network where the two stages sit in different domains. Each EP rank hands its own
// rows to the same rank of the next stage, all at once: the busiest rank's share sets the time.
void AddHandOffs(const ModelCosts& m, const HardwareProfile& hw, const ParallelLayout& layout, double tokens,
                 StepCost* c) {
  if (layout.pp <= 1 || hw.interconnect_bandwidth <= 0 || tokens <= 0) return;
  const double bytes = tokens * m.hidden * m.act_bytes;
  const double rank_bytes = std::ceil(tokens / static_cast<double>(layout.ep)) * m.hidden * m.act_bytes;
  const double out = static_cast<double>(layout.CrossDomainHandOffs());
  const double in = static_cast<double>(layout.pp - 1) - out;
  const double out_bw = hw.scale_out_bandwidth > 0 ? hw.scale_out_bandwidth : hw.interconnect_bandwidth;
  const double out_latency = std::max(hw.interconnect_latency, hw.scale_out_latency);
  c->comm_bytes += (in + out) * bytes;
  c->scale_out_bytes += out * bytes;
  c->comm_latency_seconds += in * hw.interconnect_latency + out * out_latency;
  c->comm_seconds += in * (rank_bytes / hw.interconnect_bandwidth + hw.interconnect_latency) +
                     out * (rank_bytes / out_bw + out_latency);
}

// The layout's traffic between devices, priced as α + bytes/β per link kind. `layer_bytes`: what
// a rank streams between two of its MoE layers' exchanges (a layer's weights and KV), after
// which each link's exchange pays its after-sweep latency where calibrate measured one.
void AddCommunication(const ModelCosts& m, const HardwareProfile& hw, const ParallelLayout& layout, double tokens,
                      double layer_bytes, StepCost* c) {
  const double ep = static_cast<double>(layout.ep);
  // Expert parallelism: each token's activation goes to its k experts and back, to every EP
  // rank alike; the share that leaves its device crosses the scale-up links (to ranks of its
  // domain) or the scale-out network (to other domains), all devices sending at once and both
  // links busy together, so the slower of the two sets the time.
  if (layout.ep > 1 && hw.interconnect_bandwidth > 0) {
    const double d = static_cast<double>(layout.EpDomain());
    // Rows out to their experts, then their results back.
    const double out_bytes = m.dispatch_act_bytes > 0 ? m.dispatch_act_bytes : m.act_bytes;
    const double routed = m.moe_layers * tokens * m.top_k * m.hidden * (out_bytes + m.act_bytes);
    const bool placed = layout.routed_inside >= 0 && layout.routed_outside >= 0;
    const double inside = routed * (placed ? layout.routed_inside : (d - 1) / ep);
    const double outside = routed * (placed ? layout.routed_outside : (ep - d) / ep);
    c->comm_bytes += inside + outside;
    c->scale_out_bytes += outside;
    double seconds = inside / (hw.interconnect_bandwidth * ep);
    double latency = hw.InterconnectLatencyAfter(layer_bytes);
    if (outside > 0) {
      const double out_bw = hw.scale_out_bandwidth > 0 ? hw.scale_out_bandwidth : hw.interconnect_bandwidth;
      seconds = std::max(seconds, outside / (out_bw * ep));
    }
    // A collective over several domains waits on the slower link's latency even where no routed
    // row crosses (copies of every expert in every domain): the counts always go to every peer.
    if (layout.ep > layout.EpDomain()) latency = std::max(latency, hw.ScaleOutLatencyAfter(layer_bytes));
    // Every collective call of a MoE layer's dispatch pays the slower link's per-call latency
    // whatever its bytes: what dominates at decode sizes. Where empty exchanges are free, the
    // rows out and back pay it only when some row changes rank (the counts always do).
    const double row_calls =
        hw.empty_exchanges_free ? 1.0 - NoRowLeavesItsRank(m.experts, m.top_k, layout.ep, tokens) : 1.0;
    const double calls = (1 + (kDispatchCallsPerMoeLayer - 1) * row_calls) * static_cast<double>(m.moe_layers);
    c->comm_latency_seconds += calls * latency;
    c->comm_seconds += seconds + calls * latency;
  }
  AddHandOffs(m, hw, layout, tokens, c);
}

}  // namespace

double NoRowLeavesItsRank(int64_t experts, int64_t top_k, int64_t ep, double tokens) {
  if (ep <= 1 || experts <= 0 || top_k <= 0) return 1;
  if (top_k > experts) return 0;  // no such routing; never a division by zero below
  // C(experts / ep, k) / C(experts, k): the k draws without replacement all land on the rank's own.
  const double own = static_cast<double>(experts) / static_cast<double>(ep);
  double p = 1;
  for (int64_t i = 0; i < top_k; ++i) p *= std::max(0.0, own - static_cast<double>(i)) / static_cast<double>(experts - i);
  return std::pow(p, tokens);
}

int64_t ParallelLayout::CrossDomainHandOffs() const {
  if (domain_size <= 0) return 0;
  int64_t out = 0;
  for (int64_t s = 1; s < pp; ++s) {
    bool crosses = false;  // rank e of stage s - 1 hands its rows to rank e of stage s
    for (int64_t e = 0; e < ep && !crosses; ++e) crosses = ((s - 1) * ep + e) / domain_size != (s * ep + e) / domain_size;
    out += crosses ? 1 : 0;
  }
  return out;
}

absl::Status CheckDomainSize(const ParallelLayout& l, const char* flag) {
  const int64_t d = l.domain_size;
  if (d == 0) return absl::OkStatus();
  if (d < 0 || d > l.devices() || (l.ep % d != 0 && d % l.ep != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be 0 (one domain) or a size in [1, ", l.devices(),
                                                   "] (ep x pp) that divides ep ", l.ep,
                                                   " or that ep divides, got ", d));
  }
  return absl::OkStatus();
}

StepCost PredictStep(const ModelCosts& m, const StepShape& shape, const HardwareProfile& hw,
                     const ParallelLayout& layout, const Efficiency& eff) {
  StepCost c;
  const double tokens = static_cast<double>(shape.Tokens());
  double logit_rows = 0, attended = 0;
  for (const SeqShape& s : shape.seqs) {
    if (s.logits) logit_rows += 1;
    // Each new token at position p attends p + 1 tokens: sum over the chunk.
    const double n = static_cast<double>(s.new_tokens), ctx = static_cast<double>(s.context);
    attended += n * ctx - n * (n - 1) / 2;
    c.kv_read_bytes += ctx * m.kv_bytes_per_token;  // each sequence's KV is streamed once
    c.kv_write_bytes += n * m.kv_bytes_per_token;
  }
  c.experts_hit = shape.experts_hit >= 0 ? shape.experts_hit
                                         : m.moe_layers * ExpectedExpertsHit(m.experts, m.top_k, tokens);
  // FLOPs: weights touched per token, attention over the context, the lm_head per sampled row.
  c.attention_flops = attended * 2.0 * m.layers * m.heads * m.attention_macs_per_head;
  c.flops = tokens * m.flops_per_token + c.attention_flops + logit_rows * 2.0 * m.lm_head_params;
  // Bytes: dense weights once, each expert that was hit once, embedding rows, then KV.
  double dense_bytes = m.DenseBytes();
  if (logit_rows == 0) dense_bytes -= m.lm_head_params * m.lm_head_bytes_per_param;
  c.weight_bytes = dense_bytes + (c.experts_hit * m.expert_params + tokens * m.hidden) * m.weight_bytes_per_param;

  // Per device: a 1/ep share of the FLOPs (the busiest rank's share of the attention) and of the
  // KV (weights: see WeightSeconds). Pipeline stages are summed here, as one micro-batch sees
  // them (a step's totals of work); PipelinedStepSeconds overlaps the micro-batches.
  const double ep = static_cast<double>(layout.ep);
  // A sequence lives on one EP rank (attention is data-parallel): the step waits for the busiest,
  // which holds ceil(n / ep) of the n sequences, their attention and their KV.
  const double n_seqs = static_cast<double>(shape.seqs.size());
  const double seq_share = shape.attention_rank_imbalance > 0 ? std::min(1.0, shape.attention_rank_imbalance / ep)
                           : n_seqs > 0                        ? std::ceil(n_seqs / ep) / n_seqs
                                                               : 1.0 / ep;
  c.attention_seconds = c.attention_flops * seq_share / hw.AttentionPeakFlops(m.weight_dtype);
  // The busiest EP rank's share of the expert FLOPs, the rest split evenly.
  c.expert_rows_imbalance =
      shape.expert_rows_imbalance > 0
          ? shape.expert_rows_imbalance
          : (layout.ep > 1 ? ExpectRouting(RecordedRouting::Uniform(m.experts, m.top_k, layout.ep), tokens).rows_imbalance
                           : 1.0);
  const double expert_flops = tokens * 2.0 * m.moe_layers * m.top_k * m.expert_params;
  const double rows_share = std::min(ep, std::max(1.0, c.expert_rows_imbalance));
  c.compute_seconds =
      (c.flops - c.attention_flops - expert_flops + expert_flops * rows_share) / (hw.PeakFlops(m.weight_dtype) * ep) +
      c.attention_seconds;
  // What a device cycles through from step to step: its weights (every expert it holds may be
  // hit by a later step) and its sequences' KV. Where that fits in the LLC, it streams from there.
  const double dense = m.replicated_params * m.weight_bytes_per_param;
  const double working_set = dense + (m.TotalWeightBytes() - dense) / ep + (c.kv_read_bytes + c.kv_write_bytes) * seq_share;
  const double bandwidth = hw.BandwidthFor(working_set);
  c.llc_resident = bandwidth != hw.mem_bandwidth;
  const double expert_imbalance = shape.expert_rank_imbalance > 0
                                      ? shape.expert_rank_imbalance
                                      : ExpectedExpertRankImbalance(m.experts, m.top_k, layout.ep, tokens);
  c.expert_rank_imbalance = expert_imbalance;
  c.weight_seconds = WeightSeconds(m, hw, layout, tokens, c.experts_hit, logit_rows > 0, bandwidth, expert_imbalance);
  c.kv_seconds = (c.kv_read_bytes + c.kv_write_bytes) * seq_share / bandwidth;
  c.memory_seconds = c.weight_seconds + c.kv_seconds;

  // A rank's bytes per layer: the dense weights, its share of the experts hit, its sequences' KV.
  const double expert_bytes = c.experts_hit * m.expert_params * m.weight_bytes_per_param;
  const double rank_bytes = c.weight_bytes - expert_bytes * (1 - std::min(1.0, std::max(expert_imbalance, 1.0) / ep)) +
                            (c.kv_read_bytes + c.kv_write_bytes) * seq_share;
  AddCommunication(m, hw, layout, tokens, rank_bytes / static_cast<double>(std::max<int64_t>(1, m.layers)), &c);
  c.transfer_bytes = shape.transfer_bytes;
  if (c.transfer_bytes > 0 && hw.host_link_bandwidth > 0) c.transfer_seconds = c.transfer_bytes / hw.host_link_bandwidth;

  c.compute_bound = c.compute_seconds >= c.memory_seconds;
  const double comm = layout.overlap_comm ? 0.0 : c.comm_seconds;
  c.bound_seconds = std::max(c.compute_seconds, c.memory_seconds) + comm + c.transfer_seconds;
  const double compute = (c.compute_seconds - c.attention_seconds) / eff.compute + c.attention_seconds / eff.attention;
  const double memory = c.memory_seconds / eff.memory;
  c.seconds = eff.overhead_seconds + std::max(compute, memory) + (1 - eff.overlap) * std::min(compute, memory) + comm +
              c.transfer_seconds;
  return c;
}

ModelCosts StageCosts(const ModelCosts& m, int64_t pp) {
  if (pp <= 1) return m;
  ModelCosts s = m;
  const double share = std::ceil(static_cast<double>(m.layers) / static_cast<double>(pp)) / static_cast<double>(m.layers);
  s.layers = (m.layers + pp - 1) / pp;
  s.moe_layers = (m.moe_layers + pp - 1) / pp;
  s.dense_params = (m.dense_params - m.lm_head_params) * share + m.lm_head_params;
  s.replicated_params = (m.replicated_params - m.lm_head_params) * share + m.lm_head_params;
  s.total_params = (m.total_params - m.lm_head_params) * share + m.lm_head_params;
  s.active_params = (m.active_params - m.lm_head_params) * share + m.lm_head_params;
  s.flops_per_token = m.flops_per_token * share;
  s.kv_bytes_per_token = m.kv_bytes_per_token * share;
  return s;
}

PipelinedSeconds PipelinedStepSeconds(const ModelCosts& m, const StepShape& shape, const HardwareProfile& hw,
                                      const ParallelLayout& layout, const Efficiency& eff) {
  if (layout.pp <= 1) {
    const StepCost c = PredictStep(m, shape, hw, layout, eff);
    return {c.bound_seconds, c.seconds};
  }
  const ModelCosts stage = StageCosts(m, layout.pp);
  ParallelLayout one_stage = layout;
  one_stage.pp = 1;
  const size_t n = shape.seqs.size();
  const int64_t micro = std::max<int64_t>(1, layout.micro_batches > 0 ? layout.micro_batches : layout.pp);
  std::vector<StepShape> mbs;
  double largest = 0;  // tokens of the largest micro-batch
  for (int64_t i = 0; i < micro; ++i) {
    StepShape mb = shape;
    mb.seqs.assign(shape.seqs.begin() + static_cast<long>(n * static_cast<size_t>(i) / static_cast<size_t>(micro)),
                   shape.seqs.begin() + static_cast<long>(n * static_cast<size_t>(i + 1) / static_cast<size_t>(micro)));
    if (mb.seqs.empty()) continue;
    largest = std::max(largest, static_cast<double>(mb.Tokens()));
    // The expectation for this micro-batch's tokens, or what the caller knows of it.
    mb.experts_hit = shape.micro_batch_experts_hit_per_layer >= 0
                         ? shape.micro_batch_experts_hit_per_layer * static_cast<double>(stage.moe_layers)
                         : -1;
    mb.transfer_bytes = 0;
    mbs.push_back(std::move(mb));
  }
  // The pipeline's slots: in slot s, stage g works on micro-batch s - g, every stage at once, and
  // the slot lasts as long as its slowest (the stages cost alike). In the fill and drain fewer
  // stages stream, and where ranks share a machine's memory each streams faster
  // (MemBandwidthWithActive).
  const int64_t count = static_cast<int64_t>(mbs.size());
  PipelinedSeconds total;
  HardwareProfile slot_hw = hw;  // one copy; each slot sets its bandwidth
  for (int64_t s = 0; s + 1 < count + layout.pp; ++s) {
    const int64_t first = std::max<int64_t>(0, s - layout.pp + 1), last = std::min<int64_t>(count - 1, s);
    slot_hw.mem_bandwidth = hw.MemBandwidthWithActive((last - first + 1) * layout.ep);
    PipelinedSeconds slot;
    for (int64_t i = first; i <= last; ++i) {
      const StepCost c = PredictStep(stage, mbs[static_cast<size_t>(i)], slot_hw, one_stage, eff);
      slot.bound_seconds = std::max(slot.bound_seconds, c.bound_seconds);
      slot.seconds = std::max(slot.seconds, c.seconds);
    }
    total.bound_seconds += slot.bound_seconds;
    total.seconds += slot.seconds;
  }
  // One micro-batch's pp - 1 hand-offs on the way (later hand-offs overlap the stages' work; the
  // largest micro-batch's rows price them, an upper bound where they differ). Hidden, as all
  // communication, under `overlap_comm`.
  StepCost hand;
  if (!layout.overlap_comm) AddHandOffs(m, hw, layout, largest, &hand);
  return {total.bound_seconds + hand.comm_seconds, total.seconds + hand.comm_seconds};
}

}  // namespace moeserve::roofline
