// DeepSeek-V2/V3 checkpoints (and GLM-4.5's DeepSeek-style MoE): the tensors they must hold,
// and the weights moeserve derives from them at load for multi-head latent attention in its
// absorbed form.
#pragma once

#include <vector>

#include "models/model_weights.h"
#include "models/tensor_names.h"
#include "models/weight_uploader.h"

namespace moeserve {

// Layer `l`'s tensors of multi-head latent attention, and of DeepSeek's MLP (dense, or router,
// correction bias, experts and shared experts), as a checkpoint names them.
void AddMlaTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out);
void AddDeepseekMlpTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out);

// Whether `name` belongs to a multi-token-prediction layer (DeepSeek, GLM) (model.layers.N. with N past the
// last decoder layer): not part of the forward, skipped at load.
bool IsMtpTensor(const ModelConfig& c, const std::string& name);

// Reads layer `l`'s attention and derives its MLA weights:
//   q_nope / q_rope: q_b_proj's (or q_proj's) rows split per head into the non-rotary and the
//     rotary part, the rotary rows de-interleaved ((x0, x1), (x2, x3) pairs become halves), so
//     the rotate-half RoPE computes DeepSeek's rotation up to a fixed permutation of the
//     rotary dimensions, which q . k does not see;
//   kv_a / k_rope: kv_a_proj_with_mqa's latent rows and its rotary rows (de-interleaved);
//   k_up_t[h]: head h's key rows of kv_b_proj transposed, [kv_lora, nope], which carry the
//     query into the latent's space; v_up[h]: its value rows, [v_head, kv_lora].
absl::Status LoadMlaAttention(const ModelConfig& c, int64_t l, DType dtype, Uploader& up, LayerWeights* lw);

// Reads layer `l`'s MLP: dense (gate/up/down as shared_w13/shared_w2) in the first
// first_k_dense_replace layers, else the router, its correction bias, the routed experts held
// (`held`) and the ungated shared experts.
absl::Status LoadDeepseekMlp(const ModelConfig& c, int64_t l, DType dtype, const std::vector<bool>& held,
                             Uploader& up, LayerWeights* lw);

}  // namespace moeserve
