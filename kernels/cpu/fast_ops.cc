// Fast CPU ops (see fast_ops.h). Loops marked `omp simd` are vectorised by the compiler
// (-fopenmp-simd) without relaxing floating-point semantics elsewhere.
#include "kernels/cpu/fast_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/host_buffer.h"
#include "core/status.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/vec8.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {
namespace {

// Below this many activation rows the non-invariant GEMM still uses the invariant kernel.
constexpr int64_t kBlasMinRows = 16;

// Runs `tasks`: without batch invariance those of more than kBlasMinRows rows on OpenBLAS, one
// by one (small m is memory-bound and the invariant kernel is as fast as BLAS there); the rest
// together in one parallel region (both cores busy, rows shared by several tasks rounded once).
void RunTasks(ThreadPool& pool, std::span<const GemmTask> tasks, bool batch_invariant, CpuIsa isa) {
  std::vector<GemmTask> invariant;
  for (const GemmTask& t : tasks) {
    if (!batch_invariant && t.m > kBlasMinRows) {
      BlasGemm(pool, t);
    } else {
      invariant.push_back(t);
    }
  }
  RunGemms(pool, invariant, isa);
}

inline void Bf16RowToF32(const uint16_t* src, int64_t n, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    dst[i] = f;
  }
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void LoadRowF32(const void* base, DType dtype, int64_t offset, int64_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, n * sizeof(float));
  } else if (dtype == DType::kBF16) {
    Bf16RowToF32(static_cast<const uint16_t*>(base) + offset, n, dst);
  } else {
    ConvertToF32(static_cast<const uint16_t*>(base) + offset, dtype, n, dst);
  }
}

}  // namespace

void Embedding(ThreadPool& pool, const int32_t* ids, int64_t n, const WeightRef& table, float* out) {
  pool.ParallelFor(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      MS_CHECK(ids[i] >= 0 && ids[i] < table.rows);
      // A tiled table holds a row as runs of a few columns (8 per chunk, or AMX's pairs).
      const int64_t run = WeightRowRun(table.layout, table.cols);
      for (int64_t c = 0; c < table.cols; c += run) {
        LoadRowF32(table.data, table.dtype, WeightIndex(table.layout, table.rows, table.cols, ids[i], c),
                   std::min(run, table.cols - c), out + i * table.cols + c);
      }
    }
  });
}

void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y,
          bool accumulate, bool batch_invariant, CpuIsa isa) {
  const GemmTask task{x, m, w, y, accumulate};
  RunTasks(pool, std::span<const GemmTask>(&task, 1), batch_invariant, isa);
}

void Gemms(ThreadPool& pool, const float* x, int64_t m, std::span<const WeightRef> w, std::span<float* const> y,
           bool batch_invariant, CpuIsa isa) {
  MS_CHECK(w.size() == y.size());
  std::vector<GemmTask> tasks;
  for (size_t i = 0; i < w.size(); ++i) {
    MS_CHECK(w[i].dtype != DType::kF8E4M3);
    tasks.push_back(GemmTask{x, m, w[i], y[i], false});
  }
  RunTasks(pool, tasks, batch_invariant, isa);
}

void GroupedGemm(ThreadPool& pool, const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets,
                 float* y, bool batch_invariant, CpuIsa isa) {
  MS_CHECK(offsets.size() == w.size() + 1);
  std::vector<GemmTask> tasks;
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    tasks.push_back(GemmTask{x + offsets[g] * w[g].cols, rows, w[g], y + offsets[g] * w[g].rows, false});
  }
  RunTasks(pool, tasks, batch_invariant, isa);  // the experts together
}

void GroupedSwiGluMlp(ThreadPool& pool, const float* x, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                      std::span<const int64_t> offsets, int64_t inter, float* act, float* out, CpuIsa isa) {
  MS_CHECK(offsets.size() == w13.size() + 1 && w2.size() == w13.size());
  // The activations stay bf16 in the variant's packed layout between the two GEMMs where every
  // w2 GEMM runs on that variant too.
  bool packed = PacksSwiGluOutput(isa, inter);
  int64_t packed_elems = 0;
  for (size_t g = 0; g < w13.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    MS_CHECK(w2[g].cols == inter && (w2[g].dtype == DType::kBF16 || w2[g].dtype == DType::kF32));
    packed = packed && w2[g].dtype == DType::kBF16;
    packed_elems += PackedActivationElems(isa, rows, inter);
  }
  const HostBuffer act_packed =
      packed ? HostBuffer::Uninitialized(static_cast<size_t>(packed_elems) * sizeof(uint16_t)) : HostBuffer();
  MS_CHECK(!packed || packed_elems == 0 || !act_packed.empty());  // out of memory, as new[] would have thrown
  std::vector<GemmTask> first, second;
  uint16_t* next = reinterpret_cast<uint16_t*>(act_packed.data());
  for (size_t g = 0; g < w13.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    GemmTask up{x + offsets[g] * w13[g].cols, rows, w13[g], act + offsets[g] * inter, false};
    GemmTask down{act + offsets[g] * inter, rows, w2[g], out + offsets[g] * w2[g].rows, false};
    up.swiglu = inter;
    if (packed) {
      up.y_packed = next;
      down.x_packed = next;
      next += PackedActivationElems(isa, rows, inter);
    }
    first.push_back(up);
    second.push_back(down);
  }
  RunGemms(pool, first, isa);
  RunGemms(pool, second, isa);
}

void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps, float* y) {
  pool.ParallelFor(rows, 32, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      const float inv = 1.0f / std::sqrt(Dot(xr, xr, dim) / dim + eps);
#pragma omp simd
      for (int64_t c = 0; c < dim; ++c) yr[c] = xr[c] * inv * weight[c];
    }
  });
}

namespace {

std::vector<double> InverseFrequencies(float theta, int64_t head_dim) {
  std::vector<double> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  return inv_freq;
}

// One position's cos and sin (RopeTable's and Rope's arithmetic).
void Angles(int32_t position, const std::vector<double>& inv_freq, float* cs, float* sn) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = position * inv_freq[i];
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
}

}  // namespace

bool RopeTable::Cover(ThreadPool& pool, int64_t upto, float t, int64_t hd) {
  if (positions == 0) theta = t, head_dim = hd;
  if (t != theta || hd != head_dim) return false;  // the first (theta, head size) keeps the table
  upto = std::min(upto, kMaxPositions);
  if (upto <= positions) return true;
  const int64_t rows = std::min(kMaxPositions, std::max(upto, 2 * positions)), half = hd / 2;  // amortised growth
  cs.resize(static_cast<size_t>(rows * half));
  sn.resize(static_cast<size_t>(rows * half));
  const std::vector<double> inv_freq = InverseFrequencies(t, hd);
  pool.ParallelFor(rows - positions, 64, [&](int64_t b, int64_t e) {
    for (int64_t p = positions + b; p < positions + e; ++p) {
      Angles(static_cast<int32_t>(p), inv_freq, cs.data() + p * half, sn.data() + p * half);
    }
  });
  positions = rows;
  return true;
}

void Rope(ThreadPool& pool, float* q, float* k, const int32_t* positions, int64_t n,
          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float theta, RopeTable* table) {
  const int64_t half = head_dim / 2;
  const std::vector<double> inv_freq = InverseFrequencies(theta, head_dim);
  if (table != nullptr && (n == 0 || !table->Cover(pool, static_cast<int64_t>(*std::max_element(positions, positions + n)) + 1,
                                                   theta, head_dim))) {
    table = nullptr;
  }
  pool.ParallelFor(n, 8, [&](int64_t b, int64_t e) {
    std::vector<float> own_cs(half), own_sn(half);
    for (int64_t t = b; t < e; ++t) {
      const float* cs = own_cs.data();
      const float* sn = own_sn.data();
      if (table != nullptr && positions[t] >= 0 && positions[t] < table->positions) {
        cs = table->cs.data() + positions[t] * half, sn = table->sn.data() + positions[t] * half;
      } else {
        Angles(positions[t], inv_freq, own_cs.data(), own_sn.data());
      }
      auto rotate = [&](float* v) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], c = v[i + half];
          v[i] = a * cs[i] - c * sn[i];
          v[i + half] = c * cs[i] + a * sn[i];
        }
      };
      for (int64_t h = 0; h < q_heads; ++h) rotate(q + (t * q_heads + h) * head_dim);
      for (int64_t h = 0; h < kv_heads; ++h) rotate(k + (t * kv_heads + h) * head_dim);
    }
  });
}

void SiluMulRow(const float* g, const float* u, int64_t n, float* o) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // vec8.h's exp: the same value in every lane and build
    const V8 gv = Load(g + i);
    Store(o + i, Mul(Div(gv, Add(Set1(1.0f), Exp(Mul(gv, Set1(-1.0f))))), Load(u + i)));
  }
  if (i < n) {
    float gt[8] = {}, ut[8] = {}, ot[8];
    std::memcpy(gt, g + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(ut, u + i, static_cast<size_t>(n - i) * sizeof(float));
    const V8 gv = Load(gt);
    Store(ot, Mul(Div(gv, Add(Set1(1.0f), Exp(Mul(gv, Set1(-1.0f))))), Load(ut)));
    std::memcpy(o + i, ot, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void SiluMul(ThreadPool& pool, const float* gate_up, int64_t rows, int64_t inter, float* out) {
  pool.ParallelFor(rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) SiluMulRow(gate_up + r * 2 * inter, gate_up + r * 2 * inter + inter, inter, out + r * inter);
  });
}

void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                int32_t* expert_ids, float* expert_weights) {
  std::vector<float> p(num_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = logits + t * num_experts;
    const float mx = *std::max_element(row, row + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) sum += p[e] = std::exp(row[e] - mx);
    // Selection of the k largest by repeated scans: k is small (2 to 8).
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= expert_ids[t * k + i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
      }
      expert_ids[t * k + j] = best;
      expert_weights[t * k + j] = p[best] / sum;
      top_sum += p[best] / sum;
    }
    if (renormalize) {
      for (int64_t j = 0; j < k; ++j) expert_weights[t * k + j] /= top_sum;
    }
  }
}

void ScatterCombine(ThreadPool& pool, const float* y, const int32_t* rows, const float* weights,
                    int64_t n, int64_t k, int64_t dim, float* out, bool accumulate) {
  pool.ParallelFor(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = out + t * dim;
      if (!accumulate) std::fill(o, o + dim, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float wgt = weights[t * k + j];
        const float* yr = y + static_cast<int64_t>(rows[t * k + j]) * dim;
#pragma omp simd
        for (int64_t c = 0; c < dim; ++c) o[c] += wgt * yr[c];
      }
    }
  });
}

void WriteKv(ThreadPool& pool, const float* k, const float* v, const int64_t* slots, int64_t n,
             const KvLayout& layout, int64_t layer, void* cache) {
  const int64_t te = layout.TokenElems();
  for (int64_t i = 0; i < n; ++i) {  // every slot checked before any thread writes
    MS_CHECK(slots[i] >= 0 && slots[i] / layout.block_size < layout.num_blocks);
  }
  constexpr int64_t kTokensPerPart = 16;  // a part writes at least ~8 KiB (two rows of 256 bytes a token)
  pool.ParallelFor(n, kTokensPerPart, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t block = slots[i] / layout.block_size;
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t off = layout.Offset(block, layer, kv, slots[i] % layout.block_size);
        const float* src = (kv == 0 ? k : v) + i * te;
        if (layout.dtype == DType::kF32) {
          std::memcpy(static_cast<float*>(cache) + off, src, te * sizeof(float));
        } else {
          ConvertFromF32(src, te, layout.dtype, static_cast<uint16_t*>(cache) + off);
        }
      }
    }
  });
}

}  // namespace moeserve::cpu_fast
