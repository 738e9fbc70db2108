// Mixtral tensor naming.
#include "models/tensor_names.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/deepseek_weights.h"

namespace moeserve {
namespace tensor_names {

std::string Embed() { return "model.embed_tokens.weight"; }
std::string FinalNorm() { return "model.norm.weight"; }
std::string LmHead() { return "lm_head.weight"; }
std::string Layer(int64_t layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}
std::string Expert(int64_t layer, int64_t expert, const std::string& w) {
  return absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.", expert, ".", w, ".weight");
}

std::string Router(const ModelConfig& c, int64_t layer) {
  return Layer(layer, c.family == ModelFamily::kMixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}
std::string Expert(const ModelConfig& c, int64_t layer, int64_t expert, const std::string& w) {
  if (c.family == ModelFamily::kMixtral) return Expert(layer, expert, w);
  const char* name = w == "w1" ? "gate_proj" : w == "w2" ? "down_proj" : "up_proj";
  return absl::StrCat("model.layers.", layer, ".mlp.experts.", expert, ".", name, ".weight");
}

}  // namespace tensor_names

namespace {

// Grouped-query attention: q, k, v, o and each family's extras.
void AddAttentionTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out) {
  namespace tn = tensor_names;
  const int64_t h = c.hidden_size;
  out->push_back({tn::Layer(l, "self_attn.q_proj.weight"), {c.q_dim(), h}});
  out->push_back({tn::Layer(l, "self_attn.k_proj.weight"), {c.kv_dim(), h}});
  out->push_back({tn::Layer(l, "self_attn.v_proj.weight"), {c.kv_dim(), h}});
  out->push_back({tn::Layer(l, "self_attn.o_proj.weight"), {h, c.q_dim()}});
  if (c.qkv_bias) {
    out->push_back({tn::Layer(l, "self_attn.q_proj.bias"), {c.q_dim()}});
    out->push_back({tn::Layer(l, "self_attn.k_proj.bias"), {c.kv_dim()}});
    out->push_back({tn::Layer(l, "self_attn.v_proj.bias"), {c.kv_dim()}});
  }
  if (c.qk_norm != QkNorm::kNone) {
    const bool per_head = c.qk_norm == QkNorm::kPerHead;
    out->push_back({tn::Layer(l, "self_attn.q_norm.weight"), {per_head ? c.head_dim : c.q_dim()}});
    out->push_back({tn::Layer(l, "self_attn.k_norm.weight"), {per_head ? c.head_dim : c.kv_dim()}});
  }
}

}  // namespace

void AddDenseMlpTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out) {
  namespace tn = tensor_names;
  const int64_t h = c.hidden_size, i = c.dense_intermediate_size;
  out->push_back({tn::Layer(l, "mlp.gate_proj.weight"), {i, h}});
  out->push_back({tn::Layer(l, "mlp.up_proj.weight"), {i, h}});
  out->push_back({tn::Layer(l, "mlp.down_proj.weight"), {h, i}});
}

namespace {

// Routed experts and the optional gated shared expert (Mixtral, Qwen, OLMoE); a dense layer's MLP.
void AddMoeTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out) {
  namespace tn = tensor_names;
  if (c.dense_layer(l)) return AddDenseMlpTensors(c, l, out);
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  out->push_back({tn::Router(c, l), {c.num_local_experts, h}});
  for (int64_t e = 0; e < c.num_local_experts; ++e) {
    out->push_back({tn::Expert(c, l, e, "w1"), {i, h}});
    out->push_back({tn::Expert(c, l, e, "w2"), {h, i}});
    out->push_back({tn::Expert(c, l, e, "w3"), {i, h}});
  }
  if (c.has_shared_expert()) {
    const int64_t s = c.shared_expert_intermediate_size;
    out->push_back({tn::Layer(l, "mlp.shared_expert.gate_proj.weight"), {s, h}});
    out->push_back({tn::Layer(l, "mlp.shared_expert.up_proj.weight"), {s, h}});
    out->push_back({tn::Layer(l, "mlp.shared_expert.down_proj.weight"), {h, s}});
    out->push_back({tn::Layer(l, "mlp.shared_expert_gate.weight"), {1, h}});
  }
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  namespace tn = tensor_names;
  const int64_t h = c.hidden_size;
  std::vector<ExpectedTensor> out;
  out.push_back({tn::Embed(), {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    out.push_back({tn::Layer(l, "input_layernorm.weight"), {h}});
    if (c.is_mla()) {
      AddMlaTensors(c, l, &out);
    } else {
      AddAttentionTensors(c, l, &out);
    }
    out.push_back({tn::Layer(l, "post_attention_layernorm.weight"), {h}});
    if (c.deepseek_moe()) {
      AddDeepseekMlpTensors(c, l, &out);
    } else {
      AddMoeTensors(c, l, &out);
    }
  }
  out.push_back({tn::FinalNorm(), {h}});
  if (!c.tie_word_embeddings) out.push_back({tn::LmHead(), {c.vocab_size, h}});
  return out;
}

// Reports the first missing tensor before anything is allocated, and refuses a tensor the config
// does not explain: it belongs to something this build does not compute (biases, another
// architecture's parts), and ignoring it would run a different model. Returns how many
// multi-token-prediction tensors were skipped.
absl::StatusOr<int64_t> CheckCheckpointTensors(const ModelConfig& config, const TensorSource& source,
                                               const std::map<std::string, std::vector<int64_t>>& shapes) {
  for (const auto& [name, shape] : shapes) {
    if (!source.Has(name)) {
      return absl::NotFoundError(absl::StrCat("checkpoint is missing tensor \"", name, "\""));
    }
  }
  int64_t mtp_skipped = 0;
  for (const std::string& name : source.Names()) {
    if (IsMtpTensor(config, name)) {
      ++mtp_skipped;
      continue;
    }
    if (absl::EndsWith(name, "_scale_inv") && shapes.count(name.substr(0, name.size() - 10)) > 0) {
      if (!config.fp8_checkpoint) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint has FP8 scales (\"", name,
                                                       "\") but config.json has no quantization_config for them"));
      }
      continue;  // read with its weight
    }
    if (shapes.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint has tensor \"", name,
                                                     "\", which this build's ", config.architecture(), " does not use"));
    }
  }
  return mtp_skipped;
}


}  // namespace moeserve
