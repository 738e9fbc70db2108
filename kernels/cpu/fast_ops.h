// Fast CPU ops: the batch-invariant GEMM of gemm.h (OpenBLAS optionally), SIMD loops and a
// thread pool. Each is tested
// against the reference op of the same name (reference_ops.h).
#pragma once

#include <span>

#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve::cpu_fast {

void Embedding(ThreadPool& pool, const int32_t* ids, int64_t n, const WeightRef& table, float* out);
// batch_invariant: every row is computed in the same order whatever m is, on kernel variant
// `isa` (kernels/cpu/gemm.h); otherwise large m uses OpenBLAS, batch-dependent in the last bits.
// y = x @ w^T for FP8 weights (gemm_fp8.cc), on 16 lanes when `avx512` (the same bits);
// batch-invariant. The grouped form runs every group's rows in one parallel loop.
void GemmFp8(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate, bool avx512);
void GroupedGemmFp8(ThreadPool& pool, const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets,
                    float* y, bool avx512);
// The same with activations rounded to bf16 and vdpbf16ps (gemm_fp8_bf16.cc), for the variants
// that round activations (avx512-bf16, amx); batch-invariant.
void GemmFp8Bf16(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate);
void GroupedGemmFp8Bf16(ThreadPool& pool, const float* x, std::span<const WeightRef> w,
                        std::span<const int64_t> offsets, float* y);
// The FP8 kernel variant `isa` runs: GemmFp8Bf16 where it rounds activations, else GemmFp8 on
// 16 lanes past avx2 (the same bits as 8). CpuBackend's choice, and its self-check's.
void GemmFp8On(CpuIsa isa, ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y,
               bool accumulate);
void GroupedGemmFp8On(CpuIsa isa, ThreadPool& pool, const float* x, std::span<const WeightRef> w,
                      std::span<const int64_t> offsets, float* y);
void Gemm(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y,
          bool accumulate, bool batch_invariant, CpuIsa isa);
// y[i] = x w[i]^T for each i, in one parallel region with x rounded once for the variants that
// round it: each y[i] gets Gemm's bits. No w[i] may be FP8.
void Gemms(ThreadPool& pool, const float* x, int64_t m, std::span<const WeightRef> w, std::span<float* const> y,
           bool batch_invariant, CpuIsa isa);
// Every group's GEMM in one parallel region (rows [offsets[g], offsets[g+1]) times w[g]).
void GroupedGemm(ThreadPool& pool, const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets,
                 float* y, bool batch_invariant, CpuIsa isa);
// The experts' MLP: out = act w2^T for each group's rows, act = silu(x w13_gate^T) * (x w13_up^T)
// in one pass of the variant's fused kernel (GemmTask::swiglu, amx or avx512-bf16; only where
// SwiGluFusable), the bits of GroupedGemm, SiluMul, GroupedGemm. Where every w2 GEMM runs on the
// same variant and PacksSwiGluOutput, act passes between the GEMMs in its packed bf16 layout
// (GemmTask::y_packed, x_packed) and `act` [rows, inter] is left unwritten; else it holds act in
// fp32. w2: [hidden, inter], bf16 or f32.
void GroupedSwiGluMlp(ThreadPool& pool, const float* x, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                      std::span<const int64_t> offsets, int64_t inter, float* act, float* out, CpuIsa isa);
void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps, float* y);
// Each position's cos and sin of RoPE's angles, as Rope computes them (float of the double
// cos / sin of position x theta^(-2i / head_dim)): kept by the backend across layers and steps,
// so that a step's tokens take them from memory instead of computing them once per layer (1.5%
// of a 2000-token prefill's samples went to sincos). Positions from kMaxPositions on are
// computed as before.
// At most kMaxPositions x head_dim floats (16 MiB at head size 128), per CPU backend.
struct RopeTable {
  static constexpr int64_t kMaxPositions = 1 << 15;
  float theta = 0;
  int64_t head_dim = 0, positions = 0;  // rows held: positions [0, positions)
  std::vector<float> cs, sn;            // [positions, head_dim / 2]
  // Grows to hold [0, upto) (at most kMaxPositions) for theta and head_dim; false (and nothing
  // changes) for another theta or head size than the table was first filled for, whose callers
  // compute their angles per call (a backend shared by two RoPE shapes does not rebuild it each time).
  bool Cover(ThreadPool& pool, int64_t upto, float theta, int64_t head_dim);
};
// `table` (may be null) is grown to the step's positions and read where it holds them.
void Rope(ThreadPool& pool, float* q, float* k, const int32_t* positions, int64_t n,
          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float theta, RopeTable* table);
void SiluMul(ThreadPool& pool, const float* gate_up, int64_t rows, int64_t inter, float* out);
void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                int32_t* expert_ids, float* expert_weights);
void ScatterCombine(ThreadPool& pool, const float* y, const int32_t* rows, const float* weights,
                    int64_t n, int64_t k, int64_t dim, float* out, bool accumulate);
// Tokens split over the pool's threads (a prefill's thousands; a decode step's batch).
void WriteKv(ThreadPool& pool, const float* k, const float* v, const int64_t* slots, int64_t n,
             const KvLayout& layout, int64_t layer, void* cache);
// How attention over a bf16 cache (of a head size attention_bf16.h takes) runs: the exact fp32
// kernel, vdpbf16ps (the caller has checked AVX512-BF16), or AMX tiles for the products (the
// caller has checked the tiles were granted). An fp32 cache always takes the exact kernel.
// kAmxTilesModel: the amx kernel with its tile instructions computed by the software model
// (amx_tile_model.h): the amx-model variant's, on any CPU with AVX512-BF16.
enum class AttentionKernel { kExact, kBf16Dot, kAmxTiles, kAmxTilesModel };
// The kernel variant `isa` runs over a bf16 cache (CpuBackend's choice, and its self-check's):
// the amx variant on tiles (amx-model on their model), avx512-bf16 on vdpbf16ps, the exact
// variants exact.
inline AttentionKernel AttentionKernelOf(CpuIsa isa) {
  if (isa == CpuIsa::kAmx) return AttentionKernel::kAmxTiles;
  if (isa == CpuIsa::kAmxModel) return AttentionKernel::kAmxTilesModel;
  return isa == CpuIsa::kAvx512Bf16 ? AttentionKernel::kBf16Dot : AttentionKernel::kExact;
}
void PagedAttention(ThreadPool& pool, const float* q, const AttentionBatch& batch,
                    const KvLayout& layout, int64_t layer, const void* cache, int64_t q_heads,
                    float scale, float* out, AttentionKernel kernel = AttentionKernel::kExact);
// Latent attention (Backend::PagedLatentAttention), in attention.cc.
void PagedLatentAttention(ThreadPool& pool, const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                          const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                          int64_t latent_dim, float scale, float* out,
                          AttentionKernel kernel = AttentionKernel::kExact);

}  // namespace moeserve::cpu_fast
