// The Mixtral-style MoE transformer forward, written only against Backend.
//
// One call runs one engine step: any mix of prefill chunks and decode tokens from several
// sequences, each reading and writing its KV through its block table:
//   embed -> per layer [RMSNorm -> q,k,v -> RoPE -> write KV -> paged attention -> o_proj
//   (+residual) -> RMSNorm -> router top-k -> gather by expert -> grouped w13 GEMM -> SiLU*up
//   -> grouped w2 GEMM -> weighted combine (+residual) (+ gated shared expert)]
//   -> final RMSNorm on the rows that want logits -> lm_head.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "models/model_weights.h"
#include "parallel/communicator.h"
#include "parallel/expert_dispatch.h"

namespace moeserve {

// Host-side description of one step (built once per step by the engine).
struct ForwardInput {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T] position of each token in its sequence
  std::vector<int32_t> token_seq;     // [T] index of each token's sequence in this step
  std::vector<int64_t> slots;         // [T] KV slot = block * block_size + offset
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], padded with 0
  int64_t num_seqs = 0;
  int64_t max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;    // tokens whose next-token logits are wanted
  // Sampling on the device: one spec per logit row (empty: none); the tokens come back instead
  // of, or with, the logits. Without logits_to_host only the tokens cross the host link.
  std::vector<SampleSpec> sample;
  // Edits of the logit rows before sampling (penalties, logit_bias, min_tokens), row-ordered;
  // the logprobs that go to the host are of the unedited logits, as vLLM reports them.
  std::vector<LogitEdit> logit_edits;
  bool logits_to_host = true;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

// The part of the model one rank of a parallel layout runs. The default is the whole model.
//   - Pipeline stage: layers [layer_begin, layer_end); the KV layout passed to Forward holds
//     only these layers. The first stage embeds token ids, the others take the previous
//     stage's hidden states; the last stage computes logits, the others hand hidden states on.
//   - Expert parallelism: with an `ep` group of more than one rank, this rank computes only the
//     experts it holds (ep->rank() among expert_holders[layer][e]); each MoE layer sends every token's hidden
//     state to the ranks holding its top-k experts (all-to-all with per-peer counts), runs its
//     experts on what it received, and sends the results back to be combined. Attention stays
//     data-parallel: each rank brings its own sequences, and may bring none.
struct ModelShard {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: through the last layer
  Communicator* ep = nullptr;
  // [layer - layer_begin][expert]: the EP ranks holding each routed expert of each of its layers
  // (parallel/placement.h's ExpertHolderTable rows).
  std::vector<std::vector<std::vector<int32_t>>> expert_holders;
  // EP ranks per scale-up domain (0: one domain): where a replicated expert's rows go
  // (ExpertDispatch), and which bytes ForwardStats counts as leaving the domain.
  int64_t ep_domain_size = 0;
};

// What one forward did, for instrumentation and the roofline.
struct ForwardStats {
  int64_t tokens = 0;
  int64_t experts_hit = 0;       // distinct (layer, expert) pairs that received tokens
  int64_t expert_assignments = 0;  // tokens * top-k * layers
  // Host wall time per phase. Exact on a synchronous backend (the CPU); an asynchronous one
  // would need a synchronisation at each boundary, which Forward does not add.
  double attention_seconds = 0;  // norms, QKV/O projections, RoPE, KV writes, paged attention
  double moe_seconds = 0;        // router, experts, shared expert, combine
  double head_seconds = 0;       // embedding, final norm, lm_head, logits copy
  // Expert parallelism: rows this rank's experts computed, per expert summed over layers, and
  // the communication inside the MoE layers.
  std::vector<int64_t> expert_rows;  // [experts], this rank's experts only (others 0)
  // The tokens routed to each (layer, expert), [model layers x experts] (dense layers and other
  // stages' layers 0; under EP this rank's experts only, so the ranks' sum is the layer's
  // routing): what `bench --expert-load-out` records, and the per-layer EP imbalance.
  std::vector<int64_t> layer_expert_rows;
  double comm_seconds = 0;
  int64_t comm_bytes = 0;            // sent to other ranks
  int64_t comm_bytes_outside = 0;    // ... of which to ranks of other scale-up domains
  // Entry and exit of each expert-parallel collective, in call order (ExpertDispatchStats::spans).
  std::vector<double> collective_spans;
};

// The KV layout of `config` with `num_blocks` blocks of `block_size` tokens.
KvLayout KvLayoutFor(const ModelConfig& config, int64_t num_blocks, int64_t block_size, DType dtype);

class MoeModel {
 public:
  MoeModel(const ModelWeights* weights, Backend* backend, ModelShard shard = {});

  const ModelConfig& config() const { return weights_->config(); }

  // Checks `in` against the config and the cache layout (ids in the vocabulary, positions
  // inside the context, slots and block ids inside the cache, logit rows in range).
  absl::Status Validate(const ForwardInput& in, const KvLayout& layout) const;

  // Runs the step; writes logits [logit_rows, vocab] to host memory (unless !logits_to_host:
  // then empty) and, with in.sample, the sampled token of each logit row to `sampled`.
  absl::Status Forward(const ForwardInput& in, const KvLayout& layout, void* kv_cache,
                       std::vector<float>* logits, ForwardStats* stats = nullptr,
                       std::vector<int32_t>* sampled = nullptr);
  // Runs this rank's shard of the step. `hidden_in` (device memory of this backend, [tokens,
  // hidden]) replaces the embedding on a stage after the first; a stage before the last points
  // `hidden_out` at its output hidden states on the device (valid until the next call, the
  // compute stream synchronised) instead of computing logits. With expert parallelism `in`
  // may hold no tokens: the rank still takes part in every layer's all-to-all.
  absl::Status ForwardShard(const ForwardInput& in, const KvLayout& layout, void* kv_cache, const float* hidden_in,
                            const float** hidden_out, std::vector<float>* logits, ForwardStats* stats = nullptr,
                            std::vector<int32_t>* sampled = nullptr);
  const ModelShard& shard() const { return shard_; }
  int64_t layer_begin() const { return shard_.layer_begin; }
  int64_t layer_end() const { return shard_.layer_end; }
  // Expert parallelism: the rows sent to the experts travel as bf16 (ExpertDispatch::set_bf16_rows;
  // the layout decides, for all its ranks at once).
  void SetBf16Dispatch(bool on) {
    if (dispatch_ != nullptr) dispatch_->set_bf16_rows(on);
  }
  // Expert parallelism: a new placement (ModelShard::expert_holders of this rank's layers), taken
  // between steps, every rank of the group at once (ParallelExecutor::ReplaceExperts); the
  // weights must already hold this rank's experts under it.
  void SetExpertHolders(std::vector<std::vector<std::vector<int32_t>>> holders);

 private:
  // Device scratch buffers, grown on demand and reused across steps.
  struct Workspace {
    int64_t capacity_tokens = 0;
    DeviceBuffer x, xn, q, k, v, attn, router_logits, topk_ids, topk_w, sorted_x, gate_up, act,
        expert_out, combine_rows, gather_rows, shared_gate, ids, positions, token_seq, slots,
        block_tables, logit_rows, final_x, logits, sample_specs, sampled, logit_edits;
    DeviceBuffer route_offsets;  // [shard layers, experts + 1]: each layer's routing offsets
    // Multi-head latent attention: its activations, the step's head-major <-> token-major row
    // maps and per-head offsets (for the per-head GEMMs), and the rotary frequencies.
    DeviceBuffer mla_qa, mla_q_nope, mla_q_rope, mla_latent, mla_k_rope, mla_head_a, mla_head_b, mla_q_latent,
        mla_o_latent, mla_head_rows, mla_token_rows, mla_head_offsets, rope_inv_freq;
    int64_t block_table_capacity = 0;
    int64_t logit_capacity = 0;
  };
  // Grows the workspace for a step; on failure frees all of it (the next step starts afresh).
  absl::Status EnsureWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows, int64_t logit_edits);
  absl::Status GrowWorkspace(int64_t tokens, int64_t table_elems, int64_t logit_rows, int64_t logit_edits);
  absl::Status GrowMla(int64_t tokens);
  absl::Status MoeLayer(const LayerWeights& lw, int64_t layer, int64_t tokens, ForwardStats* stats);
  // The step's token ids, positions, sequences, slots and block tables onto the device.
  absl::Status UploadStep(const ForwardInput& in);
  // Grouped-query attention with RoPE over the paged cache, added to the residual.
  void StandardAttention(const LayerWeights& lw, int64_t tokens, const AttentionBatch& batch, const KvLayout& layout,
                         int64_t kv_layer, void* kv_cache);
  // The last stage's head: the logit rows, to the host if asked, edited and sampled if asked.
  absl::Status Head(const ForwardInput& in, std::vector<float>* logits, std::vector<int32_t>* sampled);
  // Multi-head latent attention (DeepSeek) in the absorbed form, added to the residual.
  void MlaAttention(const LayerWeights& lw, int64_t tokens, const AttentionBatch& batch, const KvLayout& layout,
                    int64_t kv_layer, void* kv_cache);
  // The rotary frequencies on the device (for RopeScaled: MLA and GLM), computed once.
  absl::Status EnsureRopeTable();
  // Uploads the step's head-major row maps for MlaAttention's per-head GEMMs.
  absl::Status PrepareMlaStep(int64_t tokens);
  // Routes the step's tokens: softmax top-k, or DeepSeek's grouped router.
  void Route(const LayerWeights& lw, int64_t tokens);
  // Where layer `layer`'s routing offsets live on the device this step.
  int64_t* RouteOffsets(int64_t layer);
  // Experts hit this step, from every layer's routing offsets in one copy after the step's
  // compute (a single-rank forward plans routing on the device; EP counts on the host).
  absl::Status RoutingStats(int64_t tokens, ForwardStats* stats);
  // The gated shared expert, if the config has one (added to the residual).
  void AttentionExtras(const LayerWeights& lw, int64_t t);
  absl::Status SharedExpert(const LayerWeights& lw, int64_t tokens);
  // x += down(silu(gate x) * up x) for the rows of xn (a shared expert or a dense layer),
  // scaled by sigmoid(gate_w . xn) when `gate` is given.
  void Mlp(const WeightRef& w13, const WeightRef& w2, int64_t inter, int64_t tokens, const WeightRef* gate);
  bool expert_parallel() const { return shard_.ep != nullptr && shard_.ep->size() > 1; }
  // The dispatch over the EP group for shard_'s holders (keeping the wire's dtype).
  void MakeDispatch();

  const ModelWeights* weights_;
  Backend* backend_;
  ModelShard shard_;
  Workspace ws_;
  // Expert parallelism: the dispatch over the EP group.
  std::unique_ptr<ExpertDispatch> dispatch_;
};

}  // namespace moeserve
