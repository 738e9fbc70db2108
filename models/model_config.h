// ModelConfig: the hyperparameters of a Mixture-of-Experts transformer of one of the supported
// Hugging Face families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2 and -V3), read from its
// config.json with that family's key names and defaults, validated once; plus the built-in
// presets (Mixtral) and parameter counts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace moeserve {

// The first four families differ only in the attention's extras and the tensor names: Qwen2-MoE
// adds q/k/v biases and a shared expert, Qwen3-MoE an RMSNorm per head on q and k, OLMoE an
// RMSNorm over the whole q and k projections. DeepSeek-V2/V3 replace the attention with
// multi-head latent attention (MlaConfig) and the router with a grouped one (RouterConfig),
// and may start with dense MLP layers. GLM-4.5 (Glm4Moe) keeps grouped-query attention (q/k/v
// biases, optional per-head q/k norms, RoPE on part of each head) with DeepSeek-V3's MoE.
enum class ModelFamily { kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe, kDeepseekV2, kDeepseekV3, kGlm4Moe };
enum class QkNorm { kNone, kPerHead, kWhole };

// Multi-head latent attention (DeepSeek): each token caches one latent of kv_lora_rank values
// (after its RMSNorm) plus one shared rotary key of qk_rope_head_dim; kv_b_proj expands the
// latent into per-head keys (qk_nope_head_dim) and values (v_head_dim).
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: q_proj reads the hidden state directly (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;  // 0: not MLA
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // The rotary dimensions come in interleaved pairs (x0, x1), (x2, x3), ... (DeepSeek's
  // weights; transformers' rope_interleave), rather than Llama's halves.
  bool rope_interleave = true;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// YaRN rotary scaling (transformers' "yarn" rope type); factor 1 and !yarn: plain RoPE.
struct RopeScaling {
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;  // 0: not given
  double attention_factor = 0;            // 0: derived from factor and the mscales
  bool truncate = true;
};

// How a token's experts are chosen. Softmax then top-k is the first four families'; DeepSeek
// adds sigmoid scores, a per-expert bias used only for the choice, limits the choice to the
// best topk_group of n_group expert groups, and scales the weights.
enum class RouterScoring { kSoftmax, kSigmoid };
enum class GroupLimit {
  kNone,
  kMaxScore,   // a group's score is its best expert's (DeepSeek-V2 group_limited_greedy)
  kTopTwoSum,  // the sum of its two best biased scores (DeepSeek-V3 noaux_tc)
};
struct RouterConfig {
  RouterScoring scoring = RouterScoring::kSoftmax;
  GroupLimit group_limit = GroupLimit::kNone;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool correction_bias = false;  // e_score_correction_bias present (DeepSeek-V3)
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kMixtral;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per routed expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // defaults to hidden_size / num_attention_heads
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e6;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 4096;
  DType torch_dtype = DType::kBF16;
  bool tie_word_embeddings = false;
  // Mixtral renormalises the top-k router probabilities; Qwen2-MoE may not.
  bool norm_topk_prob = true;
  // Optional shared expert (Qwen2-MoE style): applied to every token, scaled by
  // sigmoid(shared_expert_gate . x). 0 means none.
  int64_t shared_expert_intermediate_size = 0;
  bool qkv_bias = false;        // Qwen2-MoE
  QkNorm qk_norm = QkNorm::kNone;  // Qwen3-MoE per head, OLMoE whole
  // DeepSeek: shared experts without a gate; multi-token-prediction layers in the checkpoint
  // that the forward does not use.
  bool shared_expert_gated = true;
  // Dense MLP layers (an MLP of dense_intermediate_size, no router): DeepSeek's and GLM's first
  // first_k_dense_replace; Qwen-MoE's mlp_only_layers and the layers decoder_sparse_step skips
  // (layer l is sparse only when (l + 1) % decoder_sparse_step == 0).
  int64_t first_k_dense_replace = 0;
  std::vector<int64_t> mlp_only_layers;  // sorted, unique
  int64_t decoder_sparse_step = 1;
  int64_t dense_intermediate_size = 0;
  int64_t num_nextn_predict_layers = 0;
  MlaConfig mla;
  RopeScaling rope_scaling;
  double partial_rotary_factor = 1.0;  // GLM: 0.5
  // quantization_config fp8: the checkpoint's linear weights are float8_e4m3fn with 128 x 128
  // block scales (weight_scale_inv); they stay FP8 in memory.
  bool fp8_checkpoint = false;
  RouterConfig router;

  // Checks every field; the error names the key and the limit.
  absl::Status Validate() const;

  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json_text);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // "MixtralForCausalLM", ... and "mixtral", ...
  const char* architecture() const;
  const char* model_type() const;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool is_deepseek() const { return family == ModelFamily::kDeepseekV2 || family == ModelFamily::kDeepseekV3; }
  // DeepSeek's MoE (grouped router, ungated shared experts, dense first layers): DeepSeek, GLM.
  bool deepseek_moe() const { return is_deepseek() || family == ModelFamily::kGlm4Moe; }
  // Dimensions of each head that RoPE rotates (the first ones; GLM rotates half).
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  // Values one token caches per layer: K and V of every KV head, or MLA's latent and rotary key.
  int64_t KvElemsPerToken() const { return is_mla() ? mla.kv_lora_rank + mla.qk_rope_head_dim : 2 * kv_dim(); }
  // Attention's softmax scale: 1/sqrt(query-key width), times YaRN's mscale(all_dim)^2 for MLA.
  double SoftmaxScale() const;
  bool dense_layer(int64_t layer) const {
    return layer < first_k_dense_replace || (decoder_sparse_step > 1 && (layer + 1) % decoder_sparse_step != 0) ||
           std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), layer);
  }
  int64_t num_dense_layers() const;
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  // Parameters of one routed expert (w1, w2, w3).
  int64_t ExpertParams() const { return 3 * hidden_size * intermediate_size; }
  int64_t TotalParams() const;
  // Parameters of one layer's attention (projections, biases, norms inside it).
  int64_t AttentionParams() const;
  // Parameters touched per token: everything but the routed experts a token is not sent to.
  int64_t ActiveParams() const;
};

// Names of the built-in presets: "tiny", "small", "medium".
std::vector<std::string> PresetNames();
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// "mixtral", "qwen2_moe", "qwen3_moe" or "olmoe" (config.json's model_type).
absl::StatusOr<ModelFamily> FamilyFromModelType(absl::string_view model_type);
// Turns a (preset) config into the same shape in `family`: its attention extras, routing
// default and, for Qwen2-MoE, a shared expert (twice the routed size when it has none).
ModelConfig WithFamily(ModelConfig c, ModelFamily family);

}  // namespace moeserve
