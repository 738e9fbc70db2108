// An independent, naive Mixtral forward for tests: double accumulation, no paging, no batching,
// one sequence, written straight from the Hugging Face modeling code's semantics and reading
// the weights by name from a TensorSource. It shares no code with models/moe_model.cc.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/model_config.h"
#include "models/safetensors.h"

namespace moeserve::testing {

class NaiveMixtral {
 public:
  // When round_kv_bf16, K and V are rounded to bf16 as a bf16 KV cache stores them.
  NaiveMixtral(const ModelConfig& c, const TensorSource& src, bool round_weights_bf16 = false,
               bool round_kv_bf16 = false)
      : c_(c), src_(src), round_w_(round_weights_bf16), round_kv_(round_kv_bf16) {}

  // Logits [tokens.size(), vocab] for every position of the sequence.
  std::vector<std::vector<double>> Logits(const std::vector<int32_t>& tokens) const {
    const int64_t n = tokens.size(), h = c_.hidden_size, hd = c_.head_dim;
    const int64_t nh = c_.num_attention_heads, nkv = c_.num_key_value_heads;
    std::vector<std::vector<double>> x(n, std::vector<double>(h));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < h; ++i) x[t][i] = W("model.embed_tokens.weight", tokens[t] * h + i);
    }
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        auto xn = Norm(x[t], p + "input_layernorm.weight");
        q[t] = MatVec(p + "self_attn.q_proj.weight", xn, nh * hd);
        k[t] = MatVec(p + "self_attn.k_proj.weight", xn, nkv * hd);
        v[t] = MatVec(p + "self_attn.v_proj.weight", xn, nkv * hd);
        for (int64_t hh = 0; hh < nh; ++hh) Rope(q[t].data() + hh * hd, t);
        for (int64_t hh = 0; hh < nkv; ++hh) Rope(k[t].data() + hh * hd, t);
        if (round_kv_) {
          for (auto& e : k[t]) e = RoundBf16(e);
          for (auto& e : v[t]) e = RoundBf16(e);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> attn(nh * hd, 0.0);
        for (int64_t hh = 0; hh < nh; ++hh) {
          const int64_t g = hh / (nh / nkv);
          std::vector<double> s(t + 1);
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int64_t e = 0; e < hd; ++e) d += q[t][hh * hd + e] * k[j][g * hd + e];
            s[j] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[j]);
          }
          for (auto& e : s) sum += e = std::exp(e - mx);
          for (int64_t j = 0; j <= t; ++j) {
            for (int64_t e = 0; e < hd; ++e) attn[hh * hd + e] += s[j] / sum * v[j][g * hd + e];
          }
        }
        auto o = MatVec(p + "self_attn.o_proj.weight", attn, h);
        for (int64_t i = 0; i < h; ++i) x[t][i] += o[i];
        auto xn = Norm(x[t], p + "post_attention_layernorm.weight");
        auto moe = Moe(p, xn);
        for (int64_t i = 0; i < h; ++i) x[t][i] += moe[i];
      }
    }
    std::vector<std::vector<double>> logits(n);
    const std::string head = c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (int64_t t = 0; t < n; ++t) logits[t] = MatVec(head, Norm(x[t], "model.norm.weight"), c_.vocab_size);
    return logits;
  }

 private:
  static double RoundBf16(double v) { return Bf16ToF32(F32ToBf16(static_cast<float>(v))); }

  double W(const std::string& name, int64_t i) const { return W(name, src_.Find(name), i); }
  double W(const std::string& name, const TensorView* t, int64_t i) const {
    float f;
    ConvertToF32(static_cast<const uint8_t*>(t->data) + i * DTypeSize(t->dtype), t->dtype, 1, &f);
    // Norms and the router are kept in fp32 by the engine; matrices are rounded when asked.
    const bool matrix = name.find("norm") == std::string::npos && name.find(".gate.") == std::string::npos &&
                        name.find("shared_expert_gate") == std::string::npos;
    return round_w_ && matrix ? RoundBf16(f) : f;
  }

  std::vector<double> MatVec(const std::string& name, const std::vector<double>& x, int64_t rows) const {
    const int64_t cols = x.size();
    std::vector<double> y(rows, 0.0);
    const TensorView* t = src_.Find(name);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < cols; ++i) y[r] += W(name, t, r * cols + i) * x[i];
    }
    return y;
  }

  std::vector<double> Norm(const std::vector<double>& x, const std::string& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / x.size() + c_.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * W(w, i);
    return y;
  }

  // rotate_half: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
  void Rope(double* v, int64_t pos) const {
    const int64_t hd = c_.head_dim, half = hd / 2;
    std::vector<double> out(hd);
    for (int64_t i = 0; i < hd; ++i) {
      const int64_t fi = i % half;
      const double ang = pos * std::pow(c_.rope_theta, -2.0 * fi / hd);
      const double rot = i < half ? -v[i + half] : v[i - half];
      out[i] = v[i] * std::cos(ang) + rot * std::sin(ang);
    }
    std::copy(out.begin(), out.end(), v);
  }

  std::vector<double> Expert(const std::string& w1, const std::string& w3, const std::string& w2,
                             const std::vector<double>& x, int64_t inter) const {
    auto g = MatVec(w1, x, inter), u = MatVec(w3, x, inter);
    for (int64_t i = 0; i < inter; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return MatVec(w2, g, c_.hidden_size);
  }

  std::vector<double> Moe(const std::string& p, const std::vector<double>& x) const {
    const int64_t e = c_.num_local_experts, k = c_.num_experts_per_tok;
    auto logits = MatVec(p + "block_sparse_moe.gate.weight", x, e);
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    std::vector<double> prob(e);
    for (int64_t i = 0; i < e; ++i) sum += prob[i] = std::exp(logits[i] - mx);
    for (auto& v : prob) v /= sum;
    std::vector<int64_t> chosen;
    std::vector<bool> taken(e, false);
    double top = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < e; ++i) {
        if (!taken[i] && (best < 0 || prob[i] > prob[best])) best = i;
      }
      taken[best] = true;
      chosen.push_back(best);
      top += prob[best];
    }
    std::vector<double> out(c_.hidden_size, 0.0);
    for (int64_t ex : chosen) {
      const std::string q = absl::StrCat(p, "block_sparse_moe.experts.", ex, ".");
      auto y = Expert(q + "w1.weight", q + "w3.weight", q + "w2.weight", x, c_.intermediate_size);
      const double wgt = c_.norm_topk_prob ? prob[ex] / top : prob[ex];
      for (int64_t i = 0; i < c_.hidden_size; ++i) out[i] += wgt * y[i];
    }
    if (c_.has_shared_expert()) {
      auto y = Expert(p + "mlp.shared_expert.gate_proj.weight", p + "mlp.shared_expert.up_proj.weight",
                      p + "mlp.shared_expert.down_proj.weight", x, c_.shared_expert_intermediate_size);
      const double gate = MatVec(p + "mlp.shared_expert_gate.weight", x, 1)[0];
      const double sg = 1.0 / (1.0 + std::exp(-gate));
      for (int64_t i = 0; i < c_.hidden_size; ++i) out[i] += sg * y[i];
    }
    return out;
  }

  ModelConfig c_;
  const TensorSource& src_;
  bool round_w_, round_kv_;
};

}  // namespace moeserve::testing
