// Reference CPU ops: plain loops with double accumulation, single-threaded. These are the
// oracle that the fast path and the CUDA backend are tested against.
#pragma once

#include <span>

#include "kernels/backend.h"

namespace moeserve::cpu_ref {

// Reads element i of a weight as fp32.
float WeightAt(const WeightRef& w, int64_t i);
float KvAt(const void* cache, DType dtype, int64_t i);

void Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out);
void Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate);
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);
void Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads,
          int64_t kv_heads, int64_t head_dim, float theta);
void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out);
void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                int32_t* expert_ids, float* expert_weights);
// Counting sort of the n*k assignments by expert, stable (Backend::PlanRouting).
void PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                 int32_t* gather_rows, int32_t* combine_rows);
void ScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n,
                    int64_t k, int64_t dim, float* out, bool accumulate);
void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n,
             const KvLayout& layout, int64_t layer, void* cache);
void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                    int64_t layer, const void* cache, int64_t q_heads, float scale, float* out);

}  // namespace moeserve::cpu_ref
