// Weight loading and validation.
#include "models/model_weights.h"

#include <xxhash.h>

#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/weight_layout.h"
#include "models/deepseek_weights.h"
#include "models/tensor_names.h"
#include "models/weight_shard.h"
#include "models/weight_uploader.h"

namespace moeserve {
namespace tn = tensor_names;

// Checks a shard against the config (its layers a range within the model, its experts real
// ones) and says which routed experts it holds.
absl::StatusOr<std::vector<std::vector<bool>>> HeldExperts(const ModelConfig& c, const WeightShard& shard) {
  const int64_t end = shard.layer_end < 0 ? c.num_hidden_layers : shard.layer_end;
  if (shard.layer_begin < 0 || shard.layer_begin >= end || end > c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weight shard: layers [", shard.layer_begin, ", ", end,
                                                   ") are not within ", c.num_hidden_layers, " layers"));
  }
  const int64_t layers = end - shard.layer_begin;
  if (!shard.experts.empty() && static_cast<int64_t>(shard.experts.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("weight shard: experts for ", shard.experts.size(), " layers, not its ",
                                                   layers));
  }
  std::vector<std::vector<bool>> held(static_cast<size_t>(layers), std::vector<bool>(c.num_local_experts, shard.experts.empty()));
  for (size_t l = 0; l < shard.experts.size(); ++l) {
    for (int32_t e : shard.experts[l]) {
      if (e < 0 || e >= c.num_local_experts) {
        return absl::InvalidArgumentError(absl::StrCat("weight shard: expert ", e, " of ", c.num_local_experts));
      }
      held[l][e] = true;
    }
  }
  return held;
}

absl::Status LoadRoutedExperts(const ModelConfig& c, int64_t l, DType dtype, const std::vector<bool>& held, Uploader& up,
                               LayerWeights* lw) {
  for (int64_t e = 0; e < c.num_local_experts; ++e) {
    WeightRef w13{nullptr, dtype, 2 * c.intermediate_size, c.hidden_size};
    WeightRef w2{nullptr, dtype, c.hidden_size, c.intermediate_size};
    if (held[e]) {
      ASSIGN_OR_RETURN(w13, up.Matrix({tn::Expert(c, l, e, "w1"), tn::Expert(c, l, e, "w3")}, dtype));
      ASSIGN_OR_RETURN(w2, up.Matrix({tn::Expert(c, l, e, "w2")}, dtype));
    }
    lw->w13.push_back(w13);
    lw->w2.push_back(w2);
  }
  return absl::OkStatus();
}

namespace {

// Grouped-query attention: q, k, v, o and the family's biases or q/k norms.
absl::Status LoadAttention(const ModelConfig& c, int64_t l, DType dtype, Uploader& up, LayerWeights* lw) {
  ASSIGN_OR_RETURN(lw->q, up.Matrix({tn::Layer(l, "self_attn.q_proj.weight")}, dtype));
  ASSIGN_OR_RETURN(lw->k, up.Matrix({tn::Layer(l, "self_attn.k_proj.weight")}, dtype));
  ASSIGN_OR_RETURN(lw->v, up.Matrix({tn::Layer(l, "self_attn.v_proj.weight")}, dtype));
  ASSIGN_OR_RETURN(lw->o, up.Matrix({tn::Layer(l, "self_attn.o_proj.weight")}, dtype));
  if (c.qkv_bias) {
    ASSIGN_OR_RETURN(lw->q_bias, up.Vector(tn::Layer(l, "self_attn.q_proj.bias")));
    ASSIGN_OR_RETURN(lw->k_bias, up.Vector(tn::Layer(l, "self_attn.k_proj.bias")));
    ASSIGN_OR_RETURN(lw->v_bias, up.Vector(tn::Layer(l, "self_attn.v_proj.bias")));
  }
  if (c.qk_norm != QkNorm::kNone) {
    ASSIGN_OR_RETURN(lw->q_norm, up.Vector(tn::Layer(l, "self_attn.q_norm.weight")));
    ASSIGN_OR_RETURN(lw->k_norm, up.Vector(tn::Layer(l, "self_attn.k_norm.weight")));
  }
  return absl::OkStatus();
}

// The router, the routed experts held (others keep their shapes), the gated shared expert.
absl::Status LoadMoe(const ModelConfig& c, int64_t l, DType dtype, const std::vector<bool>& held, Uploader& up,
                     LayerWeights* lw) {
  if (c.dense_layer(l)) return LoadDenseMlp(l, dtype, up, lw);
  ASSIGN_OR_RETURN(lw->router, up.Matrix({tn::Router(c, l)}, DType::kF32));
  RETURN_IF_ERROR(LoadRoutedExperts(c, l, dtype, held, up, lw));
  if (c.has_shared_expert()) {
    ASSIGN_OR_RETURN(lw->shared_w13, up.Matrix({tn::Layer(l, "mlp.shared_expert.gate_proj.weight"),
                                                tn::Layer(l, "mlp.shared_expert.up_proj.weight")},
                                               dtype));
    ASSIGN_OR_RETURN(lw->shared_w2, up.Matrix({tn::Layer(l, "mlp.shared_expert.down_proj.weight")}, dtype));
    ASSIGN_OR_RETURN(lw->shared_gate, up.Matrix({tn::Layer(l, "mlp.shared_expert_gate.weight")}, DType::kF32));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadDenseMlp(int64_t l, DType dtype, Uploader& up, LayerWeights* lw) {
  ASSIGN_OR_RETURN(lw->shared_w13, up.Matrix({tn::Layer(l, "mlp.gate_proj.weight"), tn::Layer(l, "mlp.up_proj.weight")}, dtype));
  ASSIGN_OR_RETURN(lw->shared_w2, up.Matrix({tn::Layer(l, "mlp.down_proj.weight")}, dtype));
  return absl::OkStatus();
}

namespace {

// The storage dtype and the checkpoint's kind, against what the backend implements.
absl::Status CheckLoadable(const ModelConfig& config, const Backend* backend, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat("weight storage dtype must be f32, bf16 or fp8, got ",
                                                   DTypeShortName(dtype)));
  }
  if ((dtype == DType::kF8E4M3 || config.fp8_checkpoint) && !backend->HasFp8Weights()) {
    return absl::UnimplementedError(absl::StrCat("the ", backend->Name(), " backend does not implement FP8 weights"));
  }
  if (config.deepseek_moe() && !backend->HasLatentAttention()) {
    return absl::UnimplementedError(absl::StrCat("the ", backend->Name(), " backend does not implement ",
                                                 config.architecture(), "'s ops (latent attention, scaled RoPE, grouped "
                                                 "routing); run it on the CPU backend"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadExpertsOnly(
    const ModelConfig& config, const WeightShard& only, const std::vector<std::vector<bool>>& held, DType dtype,
    Uploader& up, std::unique_ptr<ModelWeights> w) {
  const int64_t end = only.layer_end < 0 ? config.num_hidden_layers : only.layer_end;
  w->layers_.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = only.layer_begin; l < end; ++l) {
    if (config.dense_layer(l)) continue;
    RETURN_IF_ERROR(LoadRoutedExperts(config, l, dtype, held[static_cast<size_t>(l - only.layer_begin)], up,
                                      &w->layers_[static_cast<size_t>(l)]));
  }
  w->content_digest_ = CombineDigests(w->tensor_digests_);
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const ModelConfig& config,
                                                                  const TensorSource& source,
                                                                  Backend* backend, DType dtype,
                                                                  const WeightShard& only) {
  RETURN_IF_ERROR(config.Validate());
  // What to read: the shard's layers and experts, the embedding on its first stage (and on the
  // last, when lm_head is tied to it), the final norm and lm_head on the last.
  ASSIGN_OR_RETURN(const std::vector<std::vector<bool>> held, HeldExperts(config, only));
  const int64_t end = only.layer_end < 0 ? config.num_hidden_layers : only.layer_end;
  const bool first = only.layer_begin == 0, last = end == config.num_hidden_layers;
  RETURN_IF_ERROR(CheckLoadable(config, backend, dtype));
  // With FP8 the linear layers are FP8; the embedding and lm_head stay bf16 (as vLLM's fp8
  // quantization leaves them), norms and routers fp32.
  const DType table_dtype = dtype == DType::kF8E4M3 ? DType::kBF16 : dtype;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& e : ExpectedTensors(config)) shapes[e.name] = e.shape;
  ASSIGN_OR_RETURN(const int64_t mtp_skipped, CheckCheckpointTensors(config, source, shapes));
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  w->config_ = config;
  w->dtype_ = dtype;
  w->skipped_mtp_tensors_ = mtp_skipped;
  Uploader up(source, shapes, backend, &w->buffers_, &w->total_bytes_, &w->tensor_digests_);
  // A tensor outside the shard: its shape, no data.
  auto shape_only = [&](const std::vector<std::string>& names, DType d) {
    WeightRef r;
    r.dtype = d;
    for (const auto& n : names) {
      const auto& s = shapes.at(n);
      r.rows += s.size() == 2 ? s[0] : 1;
      r.cols = s.back();
    }
    return r;
  };
  if (only.experts_only) return LoadExpertsOnly(config, only, held, dtype, up, std::move(w));
  if (first || (last && config.tie_word_embeddings)) {
    ASSIGN_OR_RETURN(w->embed_, up.Matrix({tn::Embed()}, table_dtype));
  } else {
    w->embed_ = shape_only({tn::Embed()}, table_dtype);
  }
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights lw;
    if (l < only.layer_begin || l >= end) {
      for (int64_t e = 0; e < (config.dense_layer(l) ? 0 : config.num_local_experts); ++e) {
        lw.w13.push_back(shape_only({tn::Expert(config, l, e, "w1"), tn::Expert(config, l, e, "w3")}, dtype));
        lw.w2.push_back(shape_only({tn::Expert(config, l, e, "w2")}, dtype));
      }
      w->layers_.push_back(std::move(lw));
      continue;
    }
    ASSIGN_OR_RETURN(lw.attn_norm, up.Vector(tn::Layer(l, "input_layernorm.weight")));
    ASSIGN_OR_RETURN(lw.mlp_norm, up.Vector(tn::Layer(l, "post_attention_layernorm.weight")));
    if (config.is_mla()) {
      RETURN_IF_ERROR(LoadMlaAttention(config, l, dtype, up, &lw));
    } else {
      RETURN_IF_ERROR(LoadAttention(config, l, dtype, up, &lw));
    }
    if (config.deepseek_moe()) {
      RETURN_IF_ERROR(LoadDeepseekMlp(config, l, dtype, held[l - only.layer_begin], up, &lw));
    } else {
      RETURN_IF_ERROR(LoadMoe(config, l, dtype, held[l - only.layer_begin], up, &lw));
    }
    w->layers_.push_back(std::move(lw));
  }
  if (!last) {
    w->lm_head_ = config.tie_word_embeddings ? w->embed_ : shape_only({tn::LmHead()}, table_dtype);
  } else {
    ASSIGN_OR_RETURN(w->final_norm_, up.Vector(tn::FinalNorm()));
    if (config.tie_word_embeddings) {
      w->lm_head_ = w->embed_;
    } else {
      ASSIGN_OR_RETURN(w->lm_head_, up.Matrix({tn::LmHead()}, table_dtype));
    }
  }
  w->content_digest_ = CombineDigests(w->tensor_digests_);
  return w;
}

void ModelWeights::ReleaseTensors() {
  auto drop = [](WeightRef& w) { w.data = nullptr; };
  drop(embed_);
  drop(lm_head_);
  final_norm_ = nullptr;
  for (LayerWeights& lw : layers_) {
    lw.attn_norm = lw.mlp_norm = nullptr;
    lw.q_bias = lw.k_bias = lw.v_bias = lw.q_norm = lw.k_norm = nullptr;
    lw.router_bias = lw.q_a_norm = lw.kv_a_norm = nullptr;
    for (WeightRef* w : {&lw.q, &lw.k, &lw.v, &lw.o, &lw.router, &lw.shared_w13, &lw.shared_w2, &lw.shared_gate,
                         &lw.q_a, &lw.q_nope, &lw.q_rope, &lw.kv_a, &lw.k_rope}) {
      drop(*w);
    }
    for (auto* list : {&lw.w13, &lw.w2, &lw.k_up_t, &lw.v_up}) {
      for (WeightRef& w : *list) drop(w);
    }
  }
  buffers_.clear();  // frees the device memory
  total_bytes_ = 0;
  released_ = true;
}

uint64_t ModelWeights::CombineDigests(const std::map<std::string, uint64_t>& digests) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& [key, digest] : digests) {  // in name order, whoever read them
    XXH3_64bits_update(state, key.data(), key.size());
    XXH3_64bits_update(state, &digest, sizeof(digest));
  }
  const uint64_t out = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return out;
}

void ModelWeights::MergeTensorDigests(const std::map<std::string, uint64_t>& more) {
  for (const auto& [key, digest] : more) tensor_digests_[key] = digest;
  content_digest_ = CombineDigests(tensor_digests_);
}

size_t ModelWeights::expert_bytes() const {
  if (dtype_ == DType::kF8E4M3 || config_.fp8_checkpoint) {  // a byte per weight, 4 per 128 of a row
    const ModelConfig& c = config_;
    auto groups = [](int64_t n) { return (n + kFp8ScaleCols - 1) / kFp8ScaleCols; };
    return static_cast<size_t>(c.ExpertParams() + 4 * (2 * c.intermediate_size * groups(c.hidden_size) +
                                                      c.hidden_size * groups(c.intermediate_size)));
  }
  return static_cast<size_t>(config_.ExpertParams()) * DTypeSize(dtype_);
}

}  // namespace moeserve
