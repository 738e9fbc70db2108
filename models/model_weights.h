// The model's weights on a device, loaded from any TensorSource (a checkpoint on disk or
// seeded weights in memory). Loading checks that every expected tensor is present with the
// shape the config implies, converts to the storage dtype, and fuses each expert's w1 and w3
// into one [2 * intermediate, hidden] matrix so a single GEMM yields gate and up.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "models/weight_uploader.h"

namespace moeserve {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  const float* mlp_norm = nullptr;   // [hidden]
  WeightRef q, k, v, o;
  const float* q_bias = nullptr;     // [q_dim] (Qwen2-MoE), else null
  const float* k_bias = nullptr;     // [kv_dim]
  const float* v_bias = nullptr;     // [kv_dim]
  const float* q_norm = nullptr;     // [head_dim] per head (Qwen3-MoE) or [q_dim] (OLMoE), else null
  const float* k_norm = nullptr;     // [head_dim] or [kv_dim]
  WeightRef router;                  // [experts, hidden], fp32
  std::vector<WeightRef> w13;        // per expert [2 * inter, hidden]
  std::vector<WeightRef> w2;         // per expert [hidden, inter]
  WeightRef shared_w13;              // [2 * shared_inter, hidden] when the config has one
  WeightRef shared_w2;               // [hidden, shared_inter]
  WeightRef shared_gate;             // [1, hidden], fp32; none when the shared expert is ungated
  // DeepSeek: the router's correction bias [experts] (V3). A dense layer (first_k_dense_replace)
  // holds its MLP in shared_w13 / shared_w2 and no router or experts.
  const float* router_bias = nullptr;
  // Multi-head latent attention (DeepSeek), derived at load (models/deepseek_weights.h); `o`
  // is o_proj and q/k/v stay empty.
  WeightRef q_a;                     // [q_lora, hidden] (none without q_lora_rank)
  const float* q_a_norm = nullptr;   // [q_lora]
  WeightRef q_nope, q_rope;          // [heads * nope | heads * rope, q_lora or hidden]
  WeightRef kv_a, k_rope;            // [kv_lora | rope, hidden]
  const float* kv_a_norm = nullptr;  // [kv_lora]
  std::vector<WeightRef> k_up_t;     // per head [kv_lora, nope]
  std::vector<WeightRef> v_up;       // per head [v_head, kv_lora]
};

// The part of the weights one rank of a parallel layout holds: a pipeline stage's layers (plus
// the embedding on the first stage, the final norm and lm_head on the last) and, of each of
// those layers' routed experts, only the ones it owns.
struct WeightShard {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;        // -1: through the last layer
  // [layer - layer_begin]: the routed experts held in each of the shard's layers; no rows: all.
  std::vector<std::vector<int32_t>> experts;
  // Only those routed experts are read: no attention, norm, router, shared expert, embedding or
  // head (what a re-placement of the experts reads, ParallelExecutor::ReplaceExperts).
  bool experts_only = false;
};


// Reads layer `l`'s routed experts that `held` marks (w1 and w3 stacked, w2); the others keep
// their shapes without data. Every family's MoE layer loads its experts this way.
absl::Status LoadRoutedExperts(const ModelConfig& c, int64_t l, DType dtype, const std::vector<bool>& held, Uploader& up,
                               LayerWeights* lw);
// Reads dense layer `l`'s MLP (mlp.gate_proj/up_proj stacked as shared_w13, down_proj as
// shared_w2): DeepSeek's and GLM's first layers, Qwen-MoE's mlp_only_layers.
absl::Status LoadDenseMlp(int64_t l, DType dtype, Uploader& up, LayerWeights* lw);

// Experts copied for a shard and not yet in use (ModelWeights::StageExperts).
struct StagedExperts {
  struct Copy {
    int64_t layer;
    size_t expert;
    WeightRef w13, w2;
  };
  int64_t layer_begin = 0;
  std::vector<std::vector<bool>> held;  // [layer - layer_begin][expert]: held once committed
  std::vector<Copy> copies;
  std::vector<DeviceBuffer> buffers;  // the copies' memory
  size_t bytes = 0;
};

class ModelWeights {
 public:
  // `dtype` is the storage dtype of the matrices (f32 or bf16); norms and router stay fp32.
  // With a shard, only its tensors are read (a rank of a parallel layout reads its layers and
  // experts straight from the checkpoint, whose files are mapped, so other tensors' pages are
  // never touched); the others keep their shapes but no data, and the digest covers what was
  // read. Every expected tensor must still be present in `source`.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const ModelConfig& config,
                                                            const TensorSource& source,
                                                            Backend* backend, DType dtype,
                                                            const WeightShard& only = WeightShard());

  // Copies the `shard` of `full` (whose buffers live on `from`) onto the device of `to`, within
  // that device's capacity. Weights outside the shard keep their shapes but no data.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Shard(const ModelWeights& full, Backend* from,
                                                             const WeightShard& shard, Backend* to);

  // Re-placing the routed experts of this shard while serving (EPLB), in two parts so that
  // several ranks switch together or not at all: StageExperts copies the experts `shard` holds
  // and this shard lacks onto `to`, each from the first of `sources` that holds it (another
  // rank's shard, or weights read for the purpose; its layers must be this shard's; a failure,
  // such as a full device or an expert no source holds, changes nothing); CommitExperts then
  // frees the experts `shard` drops and puts the copies in use (it cannot fail).
  struct ExpertOrigin {
    const ModelWeights* weights;
    Backend* backend;  // where weights' buffers live
  };
  absl::StatusOr<StagedExperts> StageExperts(std::span<const ExpertOrigin> sources, const WeightShard& shard,
                                             Backend* to) const;
  void CommitExperts(StagedExperts staged);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  const WeightRef& embed() const { return embed_; }
  const WeightRef& lm_head() const { return lm_head_; }
  const float* final_norm() const { return final_norm_; }
  const LayerWeights& layer(int64_t l) const { return layers_[l]; }
  // Tensors of multi-token-prediction layers the checkpoint holds and the forward skips.
  int64_t skipped_mtp_tensors() const { return skipped_mtp_tensors_; }
  // Device bytes of all weights, and of one routed expert (for the roofline).
  size_t total_bytes() const { return total_bytes_; }
  size_t expert_bytes() const;
  // XXH3-64 of every tensor as stored (names, shapes, dtypes and bytes), computed while
  // loading; a shard and a released copy keep the digest of the weights they came from. A
  // partial load covers what it read until MergeTensorDigests adds the other ranks' parts.
  uint64_t content_digest() const { return content_digest_; }
  // The digest of each stacked weight read, keyed by its tensor names (NUL-terminated).
  const std::map<std::string, uint64_t>& tensor_digests() const { return tensor_digests_; }
  // Adds digests of weights read elsewhere (other ranks) and recomputes content_digest: once
  // every rank's are in, it equals the digest of loading the whole checkpoint in one process.
  void MergeTensorDigests(const std::map<std::string, uint64_t>& more);
  static uint64_t CombineDigests(const std::map<std::string, uint64_t>& digests);

  // Frees every tensor, keeping the config, dtype and shapes (data pointers become null): for
  // the full copy a parallel layout was sharded from, once every rank holds its shard, so the
  // staging memory does not stay in use for the life of the server. Forward refuses afterwards.
  void ReleaseTensors();
  bool released() const { return released_; }

 private:
  ModelWeights() = default;
  // Whether `w` holds layer `layer`'s routed expert `expert` (its layers must be as many).
  static bool HoldsExpert(const ModelWeights& w, int64_t layer, size_t expert);
  // Load's path for a shard of experts only: their layers' routed experts, nothing else.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadExpertsOnly(const ModelConfig& config,
                                                                       const WeightShard& only,
                                                                       const std::vector<std::vector<bool>>& held,
                                                                       DType dtype, Uploader& up,
                                                                       std::unique_ptr<ModelWeights> w);
  ModelConfig config_;
  DType dtype_ = DType::kF32;
  WeightRef embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<DeviceBuffer> buffers_;
  size_t total_bytes_ = 0;
  uint64_t content_digest_ = 0;
  std::map<std::string, uint64_t> tensor_digests_;
  bool released_ = false;
  int64_t skipped_mtp_tensors_ = 0;
};

}  // namespace moeserve
