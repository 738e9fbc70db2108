// The per-step cost model: for a batch shape (new tokens and context per sequence, experts
// hit), the FLOPs and bytes a step must move and the time each takes at the hardware's peaks.
// The bound is max(compute, memory) plus communication and tier transfers that are not
// overlapped. docs/roofline.md derives it and states the assumptions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/model_config.h"
#include "roofline/hardware.h"

namespace moeserve::roofline {

// Sizes of a model that the cost model needs, derived once from its config.
struct ModelCosts {
  int64_t layers = 0, hidden = 0, vocab = 0, experts = 0, top_k = 0, heads = 0, head_dim = 0;
  int64_t moe_layers = 0;              // layers with routed experts (DeepSeek's first ones are dense)
  double attention_macs_per_head = 0;  // per query head and attended token: 2 x head_dim; MLA 2r + rope
  double weight_bytes_per_param = 2;  // 2 for bf16, 4 for f32, 1 + 4/128 for FP8 (its scales)
  double lm_head_bytes_per_param = 2;
  double kv_bytes_per_token = 0;      // K and V, all layers
  double act_bytes = 2;               // activations sent between devices (bf16; the engine's own are fp32)
  double dispatch_act_bytes = 0;      // the rows sent out to the experts, where less (0: act_bytes)
  double dense_params = 0;            // every weight but the routed experts and the embedding table
  double replicated_params = 0;       // every weight but the routed experts (held by each EP rank)
  double expert_params = 0;           // one routed expert (w1, w2, w3)
  double lm_head_params = 0;
  double flops_per_token = 0;         // 2 x params touched per token, lm_head excluded
  double total_params = 0, active_params = 0;
  std::string weight_dtype = "bf16";

  static ModelCosts From(const ModelConfig& config, const std::string& weight_dtype, const std::string& kv_dtype);
  double TotalWeightBytes() const { return total_params * weight_bytes_per_param; }
  // Bytes of the dense weights (lm_head included) as stored.
  double DenseBytes() const;
};

// The roofline's name for how weights are stored: "fp8" for an FP8 checkpoint or FP8 storage,
// else "f32" or "bf16".
const char* WeightDtypeName(const ModelConfig& c, DType stored);

// How the model is laid out over devices: experts spread over `ep` devices (dense parts
// replicated on each, as with data-parallel attention; tokens and sequences split evenly across
// them), layers split into `pp` stages that a step passes through one after another (so `pp`
// saves weight memory, not step latency; with `pp` micro-batches in flight it multiplies
// throughput).
struct ParallelLayout {
  int64_t ep = 1;
  int64_t pp = 1;
  // Devices per scale-up domain (0: all in one). Ranks are numbered stage * ep + EP rank and
  // fill the domains in order, as Open MPI maps them over a hostfile's slots: all-to-all traffic
  // between domains, and hand-offs between stages in different domains, cross the scale-out
  // network (HardwareProfile::scale_out_*). CheckDomainSize states which sizes have one price.
  int64_t domain_size = 0;
  int64_t devices() const { return ep * pp; }
  // EP ranks of one stage in one domain: the domain's size, at most ep.
  int64_t EpDomain() const { return domain_size > 0 ? std::min(domain_size, ep) : ep; }
  // Stage boundaries whose hand-off leaves a domain (of the pp - 1).
  int64_t CrossDomainHandOffs() const;
  bool overlap_comm = false;  // whether communication hides under compute/memory time
  int64_t micro_batches = 0;  // with pp > 1: micro-batches per step (0: pp), for PipelinedStepSeconds
  // Fractions of the routed rows that leave the sender's rank within its domain and across
  // domains, where the placement is known (parallel/routed_traffic.h: replicated experts keep
  // a domain's rows in it); < 0: one copy per expert, (EpDomain - 1) / ep and (ep - EpDomain) / ep.
  double routed_inside = -1, routed_outside = -1;
};

// A domain size with one price: 0, or one that divides ep or that ep divides (so each stage's EP
// group spans whole domains, or whole groups share one), at most the devices. The error names
// `flag` and the limits.
absl::Status CheckDomainSize(const ParallelLayout& layout, const char* flag);

struct SeqShape {
  int64_t new_tokens = 1;  // tokens computed this step (1 for a decode)
  int64_t context = 1;     // tokens attended after the step (cached + new)
  bool logits = true;      // whether the step samples a token for it (lm_head row)
};

struct StepShape {
  std::vector<SeqShape> seqs;
  // Distinct (layer, expert) pairs that received tokens; < 0: the expectation under uniform
  // routing, layers * E * (1 - (1 - k/E)^tokens).
  double experts_hit = -1;
  // PipelinedStepSeconds: the distinct experts one micro-batch hits per MoE layer, where known (a
  // recorded routing: routing_skew.h); < 0: the expectation under uniform routing for its tokens.
  double micro_batch_experts_hit_per_layer = -1;
  double transfer_bytes = 0;  // KV moved between tiers during the step (host link)
  // Expert parallelism, where the step was measured: the expert rows per EP rank, busiest over
  // mean (each MoE layer's busiest rank, summed over layers: runner/parallel_step.cc), and the
  // tokens per EP rank (its sequences'), max over mean. The step waits for the busiest rank.
  // 0: not measured; the experts' share is the expectation under uniform routing
  // (ExpectedExpertRankImbalance), and the busiest rank holds ceil(n / ep) of the n sequences.
  double expert_rank_imbalance = 0;
  double attention_rank_imbalance = 0;
  // The expert rows per EP rank, each MoE layer's busiest summed over layers, over the mean:
  // the expert FLOPs the step waits for. 0: the expectation under uniform routing
  // (routing_skew.h), whose random part alone makes the busiest rank wait at small batch.
  double expert_rows_imbalance = 0;

  int64_t Tokens() const;
  static StepShape Decode(int64_t batch, int64_t context);
};

// Efficiency factors of a calibrated model: achieved fractions of the peaks, and a fixed
// per-step overhead (launches, synchronisation, sampling).
// `overlap` is how much of the shorter of compute and memory time hides under the longer: 1
// is the ideal roofline (max), 0 means they add up (no overlap at all).
struct Efficiency {
  double compute = 1.0;            // weight GEMMs
  double attention = 1.0;          // attention FLOPs (QK^T, PV), often a different kernel
  double memory = 1.0;
  double overlap = 1.0;
  double overhead_seconds = 0.0;
};

// What moeserve's expert dispatch (parallel/expert_dispatch.cc, ExpertDispatch::Run) makes in
// every MoE layer: three collective calls (the per-(peer, expert) row counts, the rows, the
// results back). The counts are a few bytes per expert, not priced.
inline constexpr double kDispatchCallsPerMoeLayer = 3;

// The chance that none of `tokens` tokens sends a row to another EP rank: each token's top_k
// experts (uniform, distinct) all on its own rank's experts / ep. 1 for ep 1.
double NoRowLeavesItsRank(int64_t experts, int64_t top_k, int64_t ep, double tokens);

struct StepCost {
  double flops = 0;
  double attention_flops = 0;  // the part of flops spent on QK^T and PV
  double weight_bytes = 0, kv_read_bytes = 0, kv_write_bytes = 0, comm_bytes = 0, transfer_bytes = 0;
  double scale_out_bytes = 0;  // of comm_bytes, what crosses between scale-up domains
  double experts_hit = 0;
  double expert_rank_imbalance = 1;  // the busiest EP rank's expert weights over the mean (measured or expected)
  double expert_rows_imbalance = 1;  // its expert rows (FLOPs) over the mean (measured or expected)
  double compute_seconds = 0, weight_seconds = 0, kv_seconds = 0, memory_seconds = 0;
  double attention_seconds = 0;  // the part of compute_seconds spent on attention FLOPs (at its own peak)
  double comm_seconds = 0, transfer_seconds = 0;
  double comm_latency_seconds = 0;  // the part of comm_seconds that is per-call latency
  double bound_seconds = 0;  // max(compute, memory) + non-overlapped comm + transfers (at the peaks)
  double seconds = 0;        // the prediction with efficiencies and overhead applied
  bool compute_bound = false;
  bool llc_resident = false;  // the working set fits in the last-level cache (its bandwidth applied)
};

// Expected distinct experts of E hit by `tokens` tokens each choosing k (uniform routing).
double ExpectedExpertsHit(int64_t experts, int64_t top_k, double tokens);

// Expected max over mean, across `ep` ranks holding experts/ep experts each, of the experts a
// rank's share of `tokens` hits (each token choosing top_k of them uniformly): the busiest EP
// rank's share of the expert weights a decode step reads. Each expert is taken as hit
// independently, with the probability ExpectedExpertsHit implies, so a rank's count is binomial
// (within 3% of a simulation of top-k routing from 8 to 256 experts). 1 for ep 1 or no tokens.
double ExpectedExpertRankImbalance(int64_t experts, int64_t top_k, int64_t ep, double tokens);

// Per-device weight-read seconds of a step: each EP rank reads its own copy of the dense
// weights (the lm_head only when a row samples), and a 1/ep share of the experts hit and of
// the embedding rows of `tokens` (the busiest rank's: `expert_imbalance` / ep, where measured).
// `bandwidth`: bytes/s the weights stream at (0: the memory's; PredictStep passes the LLC's when
// the step's working set fits there).
double WeightSeconds(const ModelCosts& model, const HardwareProfile& hw, const ParallelLayout& layout, double tokens,
                     double experts_hit, bool any_logits, double bandwidth = 0, double expert_imbalance = 1);

StepCost PredictStep(const ModelCosts& model, const StepShape& shape, const HardwareProfile& hw,
                     const ParallelLayout& layout = {}, const Efficiency& eff = {});

// One stage of `pp`: 1/pp of the layers (rounded up: the slowest stage), their weights, FLOPs and
// KV, and the lm_head (the last stage's).
ModelCosts StageCosts(const ModelCosts& model, int64_t pp);

// A step through pipeline stages (layout.pp > 1) as they run it: the step's sequences cut into
// micro-batches (consecutive, as even as they go), each passing every stage in turn, the
// stages working on different micro-batches at once. The step lasts m + p - 1 slots, each as
// long as the slowest micro-batch in flight on a stage: (m + p - 1) stage-times for equal
// micro-batches, so a bubble of (p-1)/(m+p-1); and each micro-batch reads its stage's weights
// again. Where ranks share a machine's memory, the fill's and drain's slots stream at what their
// fewer active ranks pull (HardwareProfile::MemBandwidthWithActive). The fill also carries the first micro-batch over the p - 1 stage boundaries (each at
// its link: scale-out where the stages sit in different domains). `seconds` with `eff`
// (calibrated), `bound_seconds` at the peaks. pp 1: PredictStep's.
struct PipelinedSeconds {
  double bound_seconds = 0, seconds = 0;
};
PipelinedSeconds PipelinedStepSeconds(const ModelCosts& model, const StepShape& shape, const HardwareProfile& hw,
                                      const ParallelLayout& layout, const Efficiency& eff = {});

}  // namespace moeserve::roofline
