// Launchers for the CUDA backend's kernels (cuda_kernels.cu). Plain types only, so that this
// header compiles as C++17 under nvcc and as C++20 in cuda_backend.cc. Every launcher enqueues
// on `stream` and returns the launch error (cudaGetLastError), never waiting.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda {

// Element types of weights and KV as the kernels see them.
enum ElemType : int { kElemF32 = 0, kElemBF16 = 1, kElemF16 = 2 };

// The paged KV layout (kernels/backend.h KvLayout) in plain numbers.
struct KvGeometry {
  int64_t num_blocks = 0, num_layers = 0, block_size = 0, kv_heads = 0, head_dim = 0;
  int elem = kElemF32;
};

cudaError_t LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int elem, int64_t cols, float* out,
                            cudaStream_t stream);
// out[i] = bf16(x[i]) (round to nearest even), or fp16 with `elem` = kElemF16.
cudaError_t LaunchConvert(const float* x, int64_t n, int elem, void* out, cudaStream_t stream);
cudaError_t LaunchRmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                          cudaStream_t stream);
cudaError_t LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream);
cudaError_t LaunchRope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float theta, cudaStream_t stream);
cudaError_t LaunchSiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out, cudaStream_t stream);
cudaError_t LaunchRouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                             int32_t* expert_ids, float* expert_weights, cudaStream_t stream);
// moe_kernels.cu: Backend::PlanRouting (up to 1024 experts), and the grouped expert GEMM with
// device offsets: `weights` is a device array of `groups` pointers to [out_features,
// in_features] matrices of element type `elem`; max_rows bounds offsets[groups].
cudaError_t LaunchPlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                              int32_t* gather_rows, int32_t* combine_rows, cudaStream_t stream);
cudaError_t LaunchGroupedGemm(const float* x, const void* const* weights, int elem, int64_t out_features,
                              int64_t in_features, const int64_t* offsets, int64_t groups, int64_t max_rows,
                              float* y, cudaStream_t stream);
// out[i] = bf16(x[i]) rounded to nearest even; out[i] = x[i] widened. n values.
cudaError_t LaunchRoundToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);
cudaError_t LaunchWidenBf16(const uint16_t* x, int64_t n, float* out, cudaStream_t stream);
cudaError_t LaunchGatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim, float* out,
                             cudaStream_t stream);
// out[i] = first[second[i]], n values (out may be second).
cudaError_t LaunchComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out,
                                 cudaStream_t stream);
cudaError_t LaunchScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n, int64_t k,
                                 int64_t dim, float* out, bool accumulate, cudaStream_t stream);
cudaError_t LaunchSigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim, cudaStream_t stream);
cudaError_t LaunchWriteKv(const float* k, const float* v, const int64_t* slots, int64_t n, KvGeometry g,
                          int64_t layer, void* cache, cudaStream_t stream);
// One warp per (token, query head), online softmax over the token's causal context.
cudaError_t LaunchPagedAttention(const float* q, const int32_t* token_seq, const int32_t* token_pos,
                                 const int32_t* block_tables, int64_t num_tokens, int64_t max_blocks_per_seq,
                                 KvGeometry g, int64_t layer, const void* cache, int64_t q_heads, float scale,
                                 float* out, cudaStream_t stream);

// kernels/backend.h SampleSpec, byte for byte (checked in cuda_backend.cc).
struct SampleSpecDevice {
  double u;
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
};
// kernels/backend.h LogitEdit, byte for byte (checked in cuda_backend.cc).
struct LogitEditDevice {
  int32_t row;
  int32_t token;
  float bias;
  float repetition;
  float subtract;
};
// One thread per edit (sample_kernel.cu); each (row, token) appears once.
cudaError_t LaunchEditLogits(float* logits, int64_t vocab, const LogitEditDevice* edits, int64_t n,
                             cudaStream_t stream);
// One thread block per row (sample_kernel.cu): the token each row's spec picks.
cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpecDevice* specs,
                             int32_t* tokens, cudaStream_t stream);

}  // namespace moeserve::cuda
