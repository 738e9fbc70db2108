// Reference loops for multi-head latent attention and grouped routing.
#include "kernels/cpu/latent_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/reference_ops.h"

namespace moeserve::cpu_ref {

void RopeScaled(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                int64_t rotary_dim, const float* inv_freq, float cos_sin_scale) {
  MS_CHECK(rotary_dim <= head_dim && rotary_dim % 2 == 0);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      const double c = std::cos(angle) * cos_sin_scale, s = std::sin(angle) * cos_sin_scale;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * head_dim;
        const double a = v[i], b = v[i + half];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(b * c + a * s);
      }
    }
  }
}

namespace {

// Indices of the k largest values, largest first, the lower index first among equals.
std::vector<int32_t> TopIndices(const std::vector<double>& v, int64_t k) {
  std::vector<int32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

// Masks the experts outside the best spec.topk_group groups to -inf in `choice`.
void LimitToGroups(const Backend::GroupedRouting& spec, std::vector<double>* choice) {
  const int64_t per = spec.num_experts / spec.n_group;
  std::vector<double> group_score(spec.n_group);
  for (int64_t g = 0; g < spec.n_group; ++g) {
    std::vector<double> members(choice->begin() + g * per, choice->begin() + (g + 1) * per);
    const std::vector<int32_t> best = TopIndices(members, spec.group_top_two_sum ? 2 : 1);
    group_score[g] = 0;
    for (int32_t b : best) group_score[g] += members[b];
  }
  std::vector<bool> keep(spec.n_group, false);
  for (int32_t g : TopIndices(group_score, spec.topk_group)) keep[g] = true;
  for (int64_t e = 0; e < spec.num_experts; ++e) {
    if (!keep[e / per]) (*choice)[e] = -INFINITY;
  }
}

}  // namespace

void RouterGroupedTopK(const float* logits, int64_t n, const Backend::GroupedRouting& spec, const float* bias,
                       int32_t* expert_ids, float* expert_weights) {
  const int64_t e_count = spec.num_experts, k = spec.top_k;
  MS_CHECK(spec.n_group >= 1 && e_count % spec.n_group == 0 && spec.topk_group <= spec.n_group);
  std::vector<double> score(e_count), choice(e_count);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = logits + t * e_count;
    if (spec.sigmoid) {
      for (int64_t e = 0; e < e_count; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
    } else {
      const double mx = *std::max_element(row, row + e_count);
      double sum = 0;
      for (int64_t e = 0; e < e_count; ++e) sum += score[e] = std::exp(row[e] - mx);
      for (double& s : score) s /= sum;
    }
    for (int64_t e = 0; e < e_count; ++e) choice[e] = score[e] + (bias != nullptr ? bias[e] : 0.0);
    if (spec.n_group > 1) LimitToGroups(spec, &choice);
    const std::vector<int32_t> top = TopIndices(choice, k);
    double sum = 0;
    for (int32_t e : top) sum += score[e];
    for (int64_t j = 0; j < k; ++j) {
      const double w = spec.renormalize ? score[top[j]] / (sum + 1e-20) : score[top[j]];
      expert_ids[t * k + j] = top[j];
      expert_weights[t * k + j] = static_cast<float>(w * spec.scaling);
    }
  }
}

void WriteLatentKv(const float* latent, const float* rope, const int64_t* slots, int64_t n, int64_t latent_dim,
                   const KvLayout& layout, int64_t layer, void* cache) {
  MS_CHECK(layout.planes == 1 && layout.kv_heads == 1 && latent_dim < layout.head_dim);
  const int64_t rope_dim = layout.head_dim - latent_dim;
  std::vector<float> row(layout.head_dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = slots[i] / layout.block_size, slot = slots[i] % layout.block_size;
    MS_CHECK(block >= 0 && block < layout.num_blocks);
    std::copy(latent + i * latent_dim, latent + (i + 1) * latent_dim, row.begin());
    std::copy(rope + i * rope_dim, rope + (i + 1) * rope_dim, row.begin() + latent_dim);
    const int64_t off = layout.Offset(block, layer, 0, slot);
    if (layout.dtype == DType::kF32) {
      std::copy(row.begin(), row.end(), static_cast<float*>(cache) + off);
    } else {
      ConvertFromF32(row.data(), layout.head_dim, layout.dtype, static_cast<uint16_t*>(cache) + off);
    }
  }
}

void PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                          const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                          int64_t latent_dim, float scale, float* out) {
  MS_CHECK(layout.planes == 1 && layout.kv_heads == 1 && latent_dim < layout.head_dim);
  const int64_t r = latent_dim, dr = layout.head_dim - latent_dim;
  std::vector<double> p;
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t ctx = batch.token_pos[t] + 1;
    const int32_t* table = batch.block_tables + batch.token_seq[t] * batch.max_blocks_per_seq;
    auto row = [&](int64_t j) { return layout.Offset(table[j / layout.block_size], layer, 0, j % layout.block_size); };
    p.assign(ctx, 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      const float* ql = q_latent + (t * heads + h) * r;
      const float* qr = q_rope + (t * heads + h) * dr;
      double mx = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t off = row(j);
        double dot = 0;
        for (int64_t d = 0; d < r; ++d) dot += static_cast<double>(ql[d]) * KvAt(cache, layout.dtype, off + d);
        for (int64_t d = 0; d < dr; ++d) dot += static_cast<double>(qr[d]) * KvAt(cache, layout.dtype, off + r + d);
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < ctx; ++j) sum += p[j] = std::exp(p[j] - mx);
      float* o = out + (t * heads + h) * r;
      for (int64_t d = 0; d < r; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < ctx; ++j) acc += p[j] * KvAt(cache, layout.dtype, row(j) + d);
        o[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace moeserve::cpu_ref
