// Reference CPU ops (see reference_ops.h).
#include "kernels/cpu/reference_ops.h"

#include "kernels/weight_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/status.h"

namespace moeserve::cpu_ref {

float WeightAt(const WeightRef& w, int64_t i) {
  switch (w.dtype) {
    case DType::kF32:
      return static_cast<const float*>(w.data)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF8E4M3: {  // row-major, scaled per row and 128 columns
      const int64_t r = i / w.cols, c = i % w.cols;
      const float s = w.scales[r * ((w.cols + kFp8ScaleCols - 1) / kFp8ScaleCols) + c / kFp8ScaleCols];
      return F8E4M3ToF32(static_cast<const uint8_t*>(w.data)[i]) * s;
    }
  }
  return 0.0f;
}

float KvAt(const void* cache, DType dtype, int64_t i) {
  WeightRef w{cache, dtype, 0, 0};
  return WeightAt(w, i);
}

void Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    MS_CHECK(ids[i] >= 0 && ids[i] < table.rows);
    for (int64_t c = 0; c < table.cols; ++c) {
      out[i * table.cols + c] =
          WeightAt(table, WeightIndex(table.layout, table.rows, table.cols, ids[i], c));
    }
  }
}

void Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      double acc = accumulate ? y[i * w.rows + j] : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        acc += static_cast<double>(x[i * w.cols + c]) * WeightAt(w, WeightIndex(w.layout, w.rows, w.cols, j, c));
      }
      y[i * w.rows + j] = static_cast<float>(acc);
    }
  }
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) ss += static_cast<double>(x[r * dim + c]) * x[r * dim + c];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t c = 0; c < dim; ++c) {
      y[r * dim + c] = static_cast<float>(x[r * dim + c] * inv * weight[c]);
    }
  }
}

namespace {

// Rotate-half RoPE on one head vector: pairs (i, i + d/2).
void RopeHead(float* v, int64_t head_dim, int32_t pos, float theta) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
    const double angle = pos * inv_freq;
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = v[i], b = v[i + half];
    v[i] = static_cast<float>(a * c - b * s);
    v[i + half] = static_cast<float>(b * c + a * s);
  }
}

}  // namespace

void Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads,
          int64_t kv_heads, int64_t head_dim, float theta) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < q_heads; ++h) RopeHead(q + (t * q_heads + h) * head_dim, head_dim, positions[t], theta);
    for (int64_t h = 0; h < kv_heads; ++h) RopeHead(k + (t * kv_heads + h) * head_dim, head_dim, positions[t], theta);
  }
}

void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gate_up[r * 2 * inter + i];
      const double u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

void PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                 int32_t* gather_rows, int32_t* combine_rows) {
  const int64_t a = n * k;
  std::fill(offsets, offsets + num_experts + 1, int64_t{0});
  for (int64_t i = 0; i < a; ++i) {
    MS_CHECK(expert_ids[i] >= 0 && expert_ids[i] < num_experts);
    ++offsets[expert_ids[i] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> cursor(offsets, offsets + num_experts);
  for (int64_t i = 0; i < a; ++i) {
    const int64_t row = cursor[expert_ids[i]]++;
    gather_rows[row] = static_cast<int32_t>(i / k);  // source token of sorted row
    combine_rows[i] = static_cast<int32_t>(row);     // sorted row of assignment i
  }
}

void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                int32_t* expert_ids, float* expert_weights) {
  std::vector<double> p(num_experts);
  std::vector<int32_t> order(num_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = logits + t * num_experts;
    const double mx = *std::max_element(row, row + num_experts);
    double sum = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) sum += p[e] = std::exp(row[e] - mx);
    for (auto& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double top_sum = 0.0;
    for (int64_t j = 0; j < k; ++j) top_sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      expert_ids[t * k + j] = order[j];
      expert_weights[t * k + j] = static_cast<float>(renormalize ? p[order[j]] / top_sum : p[order[j]]);
    }
  }
}

void ScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n,
                    int64_t k, int64_t dim, float* out, bool accumulate) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      double acc = accumulate ? out[t * dim + c] : 0.0;
      for (int64_t j = 0; j < k; ++j) {
        acc += static_cast<double>(weights[t * k + j]) * y[rows[t * k + j] * dim + c];
      }
      out[t * dim + c] = static_cast<float>(acc);
    }
  }
}

void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n,
             const KvLayout& layout, int64_t layer, void* cache) {
  const int64_t te = layout.TokenElems();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = slots[i] / layout.block_size;
    const int64_t slot = slots[i] % layout.block_size;
    MS_CHECK(block >= 0 && block < layout.num_blocks);
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = (kv == 0 ? k : v) + i * te;
      const int64_t off = layout.Offset(block, layer, kv, slot);
      if (layout.dtype == DType::kF32) {
        std::copy(src, src + te, static_cast<float*>(cache) + off);
      } else {
        ConvertFromF32(src, te, layout.dtype, static_cast<uint16_t*>(cache) + off);
      }
    }
  }
}

void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                    int64_t layer, const void* cache, int64_t q_heads, float scale, float* out) {
  const int64_t hd = layout.head_dim;
  const int64_t group = q_heads / layout.kv_heads;
  std::vector<double> scores;
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int32_t s = batch.token_seq[t];
    const int64_t ctx = batch.token_pos[t] + 1;
    const int32_t* table = batch.block_tables + s * batch.max_blocks_per_seq;
    scores.assign(ctx, 0.0);
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / group;
      const float* qv = q + (t * q_heads + h) * hd;
      double mx = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t off = layout.Offset(table[j / layout.block_size], layer, 0,
                                          j % layout.block_size) + g * hd;
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * KvAt(cache, layout.dtype, off + d);
        scores[j] = dot * scale;
        mx = std::max(mx, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < ctx; ++j) sum += scores[j] = std::exp(scores[j] - mx);
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < ctx; ++j) {
          const int64_t off = layout.Offset(table[j / layout.block_size], layer, 1,
                                            j % layout.block_size) + g * hd;
          acc += scores[j] * KvAt(cache, layout.dtype, off + d);
        }
        out[(t * q_heads + h) * hd + d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace moeserve::cpu_ref
