// MoE transformer forward: the layers in order (attention, MoE), the head and sampling. Latent
// attention (DeepSeek) is in mla_attention.cc.
#include "models/moe_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {

MoeModel::MoeModel(const ModelWeights* weights, Backend* backend, ModelShard shard)
    : weights_(weights), backend_(backend), shard_(std::move(shard)) {
  if (shard_.layer_end < 0) shard_.layer_end = config().num_hidden_layers;
  MakeDispatch();
}

void MoeModel::MakeDispatch() {
  if (!expert_parallel()) return;
  const ModelConfig& c = config();
  const bool bf16 = dispatch_ != nullptr && dispatch_->bf16_rows();
  dispatch_ = std::make_unique<ExpertDispatch>(
      backend_, shard_.ep, shard_.expert_holders,
      ExpertDispatchShape{c.hidden_size, c.intermediate_size, c.num_local_experts, c.num_experts_per_tok},
      shard_.ep_domain_size);
  dispatch_->set_bf16_rows(bf16);
}

void MoeModel::SetExpertHolders(std::vector<std::vector<std::vector<int32_t>>> holders) {
  shard_.expert_holders = std::move(holders);
  MakeDispatch();
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
                               std::vector<float>* logits, ForwardStats* stats,
                               std::vector<int32_t>* sampled) {
  return ForwardShard(in, layout, kv_cache, nullptr, nullptr, logits, stats, sampled);
}

absl::Status MoeModel::UploadStep(const ForwardInput& in) {
  const int64_t t = in.num_tokens();
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.ids.data(), in.token_ids.data(), t * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.positions.data(), in.positions.data(), t * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.token_seq.data(), in.token_seq.data(), t * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.slots.data(), in.slots.data(), t * sizeof(int64_t)));
  return backend_->CopyToDevice(ws_.block_tables.data(), in.block_tables.data(),
                                in.block_tables.size() * sizeof(int32_t));
}

void MoeModel::StandardAttention(const LayerWeights& lw, int64_t t, const AttentionBatch& batch,
                                 const KvLayout& layout, int64_t kv_layer, void* kv_cache) {
  const ModelConfig& c = config();
  // q [t, heads, head_dim], k and v [t, kv_heads, head_dim]: one call, so the CPU rounds xn once.
  const std::array<WeightRef, 3> qkv = {lw.q, lw.k, lw.v};
  const std::array<float*, 3> out = {ws_.q.as<float>(), ws_.k.as<float>(), ws_.v.as<float>()};
  backend_->Gemms(ws_.xn.as<float>(), t, qkv, out);
  AttentionExtras(lw, t);
  if (c.family == ModelFamily::kGlm4Moe) {  // RoPE on the first rotary_dim of each head
    const float* inv = ws_.rope_inv_freq.as<float>();
    const int32_t* pos = ws_.positions.as<int32_t>();
    backend_->RopeScaled(ws_.q.as<float>(), pos, t, c.num_attention_heads, c.head_dim, c.rotary_dim(), inv, 1.0f);
    backend_->RopeScaled(ws_.k.as<float>(), pos, t, c.num_key_value_heads, c.head_dim, c.rotary_dim(), inv, 1.0f);
  } else {
    backend_->Rope(ws_.q.as<float>(), ws_.k.as<float>(), ws_.positions.as<int32_t>(), t, c.num_attention_heads,
                   c.num_key_value_heads, c.head_dim, static_cast<float>(c.rope_theta));
  }
  backend_->WriteKv(ws_.k.as<float>(), ws_.v.as<float>(), ws_.slots.as<int64_t>(), t, layout, kv_layer, kv_cache);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  backend_->PagedAttention(ws_.q.as<float>(), batch, layout, kv_layer, kv_cache, c.num_attention_heads, scale,
                           ws_.attn.as<float>());
  backend_->Gemm(ws_.attn.as<float>(), t, lw.o, ws_.x.as<float>(), /*accumulate=*/true);  // residual
}

absl::Status MoeModel::Head(const ForwardInput& in, std::vector<float>* logits, std::vector<int32_t>* sampled) {
  const ModelConfig& c = config();
  const int64_t r = static_cast<int64_t>(in.logit_rows.size()), h = c.hidden_size;
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.logit_rows.data(), in.logit_rows.data(), r * sizeof(int32_t)));
  float* fx = ws_.final_x.as<float>();
  backend_->GatherRows(ws_.x.as<float>(), ws_.logit_rows.as<int32_t>(), r, h, fx);
  backend_->RmsNorm(fx, weights_->final_norm(), r, h, static_cast<float>(c.rms_norm_eps), fx);
  backend_->Gemm(fx, r, weights_->lm_head(), ws_.logits.as<float>());  // [r, vocab]
  // The logits go to the host before the edits: logprobs are the model's own, as vLLM reports.
  if (in.logits_to_host) {
    logits->resize(static_cast<size_t>(r * c.vocab_size));
    RETURN_IF_ERROR(backend_->CopyToHost(logits->data(), ws_.logits.data(), logits->size() * sizeof(float)));
  } else {
    logits->clear();
  }
  if (in.sample.empty()) return absl::OkStatus();
  if (sampled == nullptr) return absl::InvalidArgumentError("forward: sampling specs but nowhere to put the tokens");
  if (const int64_t n = static_cast<int64_t>(in.logit_edits.size()); n > 0) {
    RETURN_IF_ERROR(backend_->CopyToDevice(ws_.logit_edits.data(), in.logit_edits.data(), n * sizeof(LogitEdit)));
    backend_->EditLogits(ws_.logits.as<float>(), c.vocab_size, ws_.logit_edits.as<LogitEdit>(), n);
  }
  RETURN_IF_ERROR(backend_->CopyToDevice(ws_.sample_specs.data(), in.sample.data(), r * sizeof(SampleSpec)));
  backend_->SampleRows(ws_.logits.as<float>(), r, c.vocab_size, ws_.sample_specs.as<SampleSpec>(),
                       ws_.sampled.as<int32_t>());
  sampled->resize(static_cast<size_t>(r));
  return backend_->CopyToHost(sampled->data(), ws_.sampled.data(), r * sizeof(int32_t));
}

absl::Status MoeModel::ForwardShard(const ForwardInput& in, const KvLayout& layout, void* kv_cache,
                                    const float* hidden_in, const float** hidden_out,
                                    std::vector<float>* logits, ForwardStats* stats,
                                    std::vector<int32_t>* sampled) {
  RETURN_IF_ERROR(Validate(in, layout));
  const ModelConfig& c = config();
  const bool first = shard_.layer_begin == 0, last = shard_.layer_end == c.num_hidden_layers;
  if (!first && hidden_in == nullptr && in.num_tokens() > 0) {
    return absl::InvalidArgumentError(
        "forward: a stage after the first needs the previous stage's hidden states");
  }
  if (!last && hidden_out == nullptr)
    return absl::InvalidArgumentError("forward: a stage before the last needs hidden_out");
  const int64_t t = in.num_tokens();
  const int64_t h = c.hidden_size;
  const int64_t r = static_cast<int64_t>(in.logit_rows.size());
  RETURN_IF_ERROR(
      EnsureWorkspace(std::max<int64_t>(t, 1), std::max<int64_t>(in.block_tables.size(), 1), r,
                      static_cast<int64_t>(in.logit_edits.size())));
  if (stats != nullptr) {
    *stats = ForwardStats();
    stats->tokens = t;
  }
  if (t > 0 && c.is_mla()) RETURN_IF_ERROR(PrepareMlaStep(t));
  if (t > 0 && c.family == ModelFamily::kGlm4Moe) RETURN_IF_ERROR(EnsureRopeTable());
  if (t > 0) RETURN_IF_ERROR(UploadStep(in));
  const AttentionBatch batch{ws_.token_seq.as<int32_t>(), ws_.positions.as<int32_t>(), ws_.block_tables.as<int32_t>(),
                             t, in.num_seqs, in.max_blocks_per_seq};
  float* x = ws_.x.as<float>();
  float* xn = ws_.xn.as<float>();
  Stopwatch phase;
  auto lap = [&](double ForwardStats::*field) {
    if (stats != nullptr) stats->*field += phase.Seconds();
    phase.Reset();
  };
  if (t > 0 && first) backend_->Embedding(ws_.ids.as<int32_t>(), t, weights_->embed(), x);  // [t, hidden]
  if (t > 0 && !first) RETURN_IF_ERROR(backend_->CopyOnDevice(x, hidden_in, t * h * sizeof(float)));
  lap(&ForwardStats::head_seconds);
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t l = shard_.layer_begin; l < shard_.layer_end; ++l) {
    const LayerWeights& lw = weights_->layer(l);
    const int64_t kv_layer = l - shard_.layer_begin;  // the stage's cache holds its layers only
    if (t > 0) {
      backend_->RmsNorm(x, lw.attn_norm, t, h, eps, xn);
      if (c.is_mla()) {
        MlaAttention(lw, t, batch, layout, kv_layer, kv_cache);
      } else {
        StandardAttention(lw, t, batch, layout, kv_layer, kv_cache);
      }
      backend_->RmsNorm(x, lw.mlp_norm, t, h, eps, xn);
    }
    lap(&ForwardStats::attention_seconds);
    RETURN_IF_ERROR(MoeLayer(lw, l, t, stats));
    lap(&ForwardStats::moe_seconds);
  }
  if (!last) {
    *hidden_out = x;
    if (logits != nullptr) logits->clear();
  } else {
    if (sampled != nullptr) sampled->clear();
    if (r == 0) {
      logits->clear();
    } else {
      RETURN_IF_ERROR(Head(in, logits, sampled));
    }
  }
  // The step's compute is done once the stream is: then the routing statistics are read back.
  RETURN_IF_ERROR(backend_->Synchronize());
  absl::Status s = RoutingStats(t, stats);
  if (last && r > 0) lap(&ForwardStats::head_seconds);
  return s;
}

}  // namespace moeserve
