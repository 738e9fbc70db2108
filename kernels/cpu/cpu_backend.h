// The CPU backend: a capacity-limited "virtual device" arena plus two implementations of every
// op: a plain reference path (double accumulation, single thread, obviously right; the oracle
// in tests) and a fast path (OpenBLAS GEMM, SIMD loops, a thread pool).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fast_ops.h"

namespace moeserve {

enum class CpuPath { kReference, kFast };

struct CpuBackendOptions {
  CpuPath path = CpuPath::kFast;
  int num_threads = 0;          // 0: one per usable CPU (UsableCpus)
  size_t capacity_bytes = 0;    // device arena size; 0: 3/4 of physical memory
  // Fast path: compute every GEMM row in an order independent of the batch, so a request's
  // output does not depend on what shares its step. Off: OpenBLAS for large batches.
  bool batch_invariant = true;
  // The fast path's kernel variant (kernels/cpu/cpu_isa.h): kAuto picks the fastest that passed
  // its self-check, among the exact ones with kExact. A forced variant must be supported
  // (ChooseCpuIsa says why not; callers validate first).
  CpuIsa isa = CpuIsa::kAuto;
  CpuKernelNumerics numerics = CpuKernelNumerics::kFastest;
  // Emulates a GPU's asynchronous copy engine (tests): CopyAsync only queues the copy, which
  // runs at the latest moment a GPU could run it: at WaitCopy, or, once ordered before compute
  // by OrderComputeAfterCopies, at the next copy, Synchronize or KV op. A caller that forgets
  // a wait or an ordering then reads stale or overwritten data, as it could on a GPU.
  bool defer_copies = false;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = {});
  ~CpuBackend() override;

  std::string Name() const override;
  // v2: tiled GEMM with lane-strided FMA order, vectorised attention and exp. The exact variants
  // (avx2, avx512) compute the same bits; the bf16 ones are named.
  std::string KernelNumerics() const override;
  // The fast path's GEMM streams 8-row tiles (kernels/weight_layout.h); the amx variant loads
  // bf16 weights as AMX B tiles.
  WeightLayout PreferredWeightLayout(DType dtype) const override;
  CpuPath path() const { return options_.path; }
  // The kernel variant the fast path runs (resolved, never kAuto).
  CpuIsa isa() const { return isa_; }
  // Whether attention over a bf16 KV cache runs on vdpbf16ps, rounding queries and
  // probabilities to bf16: the variants that round activations, batch-invariant, on a CPU with
  // AVX512-BF16 (every AMX CPU has it).
  bool Bf16Attention() const;
  // Whether that attention runs its Q·Kᵀ and P·V on AMX tiles: the amx variant.
  bool AmxAttention() const;
  // Whether GroupedSwiGluMlp can fuse gate/up and SiLU for these experts (cpu_fast::SwiGluFusable
  // on this rank's own experts, on the batch-invariant fast path); avx512-bf16 then fuses only
  // where the experts hit average 16 rows or more.
  bool FusesGateUpSilu(std::span<const WeightRef> w13, int64_t inter) const;
  int num_threads() const { return pool_ ? pool_->num_threads() : 1; }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  size_t capacity_bytes() const override { return options_.capacity_bytes; }
  size_t used_bytes() const override { return used_.load(); }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  // CopyToHost calls so far: the host round trips a GPU would make in the same place (tests
  // count them, e.g. one per MoE layer under expert parallelism).
  int64_t copies_to_host() const { return copies_to_host_.load(); }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<HostBuffer> AllocateHost(size_t bytes) override;
  absl::StatusOr<uint64_t> CopyAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status WaitCopy(uint64_t ticket) override;
  void OrderComputeAfterCopies() override;

  void Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) override;
  void Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) override;
  void Gemms(const float* x, int64_t m, std::span<const WeightRef> w, std::span<float* const> y) override;
  void GroupedGemm(const float* x, std::span<const WeightRef> w, const int64_t* offsets, int64_t max_rows,
                   float* y) override;
  void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
               float* y) override;
  void Add(float* y, const float* x, int64_t n) override;
  void AddBias(float* y, const float* bias, int64_t rows, int64_t dim) override;
  void Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads,
            int64_t kv_heads, int64_t head_dim, float theta) override;
  void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) override;
  // Fused for bf16 experts in the variant's layout (FusesGateUpSilu; cpu_fast::GroupedSwiGluMlp):
  // always on amx, on avx512-bf16 where the experts hit average 16 rows or more.
  void GroupedSwiGluMlp(const float* x, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                        const int64_t* offsets, int64_t max_rows, int64_t inter, float* gate_up, float* act,
                        float* out) override;
  void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k,
                  bool renormalize, int32_t* expert_ids, float* expert_weights) override;
  void PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                   int32_t* gather_rows, int32_t* combine_rows) override;
  bool RoundsActivationsToBf16(DType weight_dtype) const override;
  void RoundToBf16(const float* x, int64_t n, uint16_t* out) override;
  void WidenBf16(const uint16_t* x, int64_t n, float* out) override;
  void GatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim,
                  float* out) override;
  void ComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) override;
  void ScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n,
                      int64_t k, int64_t dim, float* out, bool accumulate) override;
  void SigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim) override;
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n,
               const KvLayout& layout, int64_t layer, void* cache) override;
  void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                      int64_t layer, const void* cache, int64_t q_heads, float scale,
                      float* out) override;
  void EditLogits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) override;
  void SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs,
                  int32_t* tokens) override;
  // DeepSeek's ops: the reference loops (kernels/cpu/latent_ops.h), latent attention vectorised
  // on the fast path (kernels/cpu/attention.cc).
  bool HasLatentAttention() const override { return true; }
  bool HasFp8Weights() const override { return true; }
  void RopeScaled(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                  const float* inv_freq, float cos_sin_scale) override;
  void RouterGroupedTopK(const float* logits, int64_t n, const GroupedRouting& spec, const float* bias,
                         int32_t* expert_ids, float* expert_weights) override;
  void WriteLatentKv(const float* latent, const float* rope, const int64_t* slots, int64_t n, int64_t latent_dim,
                     const KvLayout& layout, int64_t layer, void* cache) override;
  void PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                            const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                            int64_t latent_dim, float scale, float* out) override;

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  bool fast() const { return options_.path == CpuPath::kFast; }
  // Runs queued copies with a ticket up to `ticket` (defer_copies).
  void RunCopies(uint64_t ticket);
  // Runs the copies that compute must see before it starts (defer_copies).
  void RunOrderedCopies();

  CpuBackendOptions options_;
  CpuIsa isa_ = CpuIsa::kAvx2;
  struct QueuedCopy {
    uint64_t ticket;
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::mutex copy_mu_;
  std::deque<QueuedCopy> copies_;
  uint64_t copies_issued_ = 0, copies_ordered_ = 0;
  std::atomic<size_t> used_{0};
  std::atomic<int64_t> copies_to_host_{0};
  std::unique_ptr<ThreadPool> pool_;  // fast path only
  // Fast path: each position's RoPE angles, grown as positions come. Rope writes it: like every
  // op here, one caller at a time (each rank and each engine has its own backend).
  cpu_fast::RopeTable rope_table_;
};

}  // namespace moeserve
