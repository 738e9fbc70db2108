// The Backend interface on one NVIDIA GPU: a capacity-accounted device arena (cudaMalloc),
// every op enqueued on one compute stream (the KV tiers' host copies on a second), GEMMs through cuBLAS (bf16 weights: the activations are
// rounded to bf16 and multiplied with fp32 accumulation by cublasGemmEx; f32 weights:
// cublasSgemm), the grouped expert GEMM as one cublasGemmGroupedBatchedEx call for f32 weights
// (one GEMM per expert for 16-bit weights, which that API only multiplies into a 16-bit
// output, and where cuBLAS lacks it), and the kernels of
// cuda_kernels.cu for everything else. Ops return void as the interface asks: the first CUDA
// or cuBLAS error (with file and line) sticks and is returned by the next Synchronize or copy.
// CopyOnDevice is an asynchronous device-to-device copy: the ranges must not overlap.
// No CUDA headers here.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace moeserve {

struct CudaBackendOptions {
  int device = 0;
  size_t capacity_bytes = 0;  // 0: 90% of the device's free memory at creation
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string Name() const override;
  std::string KernelNumerics() const override { return "cuda-1"; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  size_t capacity_bytes() const override { return capacity_; }
  size_t used_bytes() const override { return used_; }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  // cudaHostAlloc; copies on a second stream, ordered against the compute stream by events.
  absl::StatusOr<HostBuffer> AllocateHost(size_t bytes) override;
  absl::StatusOr<uint64_t> CopyAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status WaitCopy(uint64_t ticket) override;
  void OrderComputeAfterCopies() override;

  void Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) override;
  void Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate = false) override;
  // Device offsets: a kernel that reads them; from kHostPlanRows rows on, cuBLAS after one read
  // of the offsets (cuda_experts.cc).
  void GroupedGemm(const float* x, std::span<const WeightRef> w, const int64_t* offsets, int64_t max_rows,
                   float* y) override;
  void PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                   int32_t* gather_rows, int32_t* combine_rows) override;
  void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) override;
  void Add(float* y, const float* x, int64_t n) override;
  void AddBias(float* y, const float* bias, int64_t rows, int64_t dim) override;
  void Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads, int64_t kv_heads,
            int64_t head_dim, float theta) override;
  void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) override;
  void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                  int32_t* expert_ids, float* expert_weights) override;
  // (RoundsActivationsToBf16 stays false: the GPU's expert GEMMs take fp32 activations, so
  // expert-parallel rows travel as fp32 and these two serve no dispatch yet.)
  void RoundToBf16(const float* x, int64_t n, uint16_t* out) override;
  void WidenBf16(const uint16_t* x, int64_t n, float* out) override;
  void GatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim, float* out) override;
  void ComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) override;
  void ScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n, int64_t k, int64_t dim,
                      float* out, bool accumulate) override;
  void SigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim) override;
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n, const KvLayout& layout,
               int64_t layer, void* cache) override;
  void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout, int64_t layer,
                      const void* cache, int64_t q_heads, float scale, float* out) override;
  void EditLogits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) override;
  void SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs,
                  int32_t* tokens) override;

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  // Records the first failure; later ones are dropped (the first explains them).
  void Note(const absl::Status& s);
  absl::Status TakeError();
  // Makes this backend's GPU current on the calling thread (each thread has its own, and the
  // engine loop is not the thread that created the backend).
  void Use() const;
  // Batches of at least this many expert rows take cuBLAS (tensor cores) at the price of one
  // synchronisation to read the offsets; smaller ones (decode) never wait for the host.
  static constexpr int64_t kHostPlanRows = 2048;
  // The grouped expert GEMM with host offsets: one cuBLAS call, else one GEMM per expert.
  void GroupedGemmHost(const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets, float* y);
  // The device array of the experts' weight pointers (uploaded once per list); null on failure.
  const void* const* ExpertTable(std::span<const WeightRef> w);
  // The grouped expert GEMM as one cublasGemmGroupedBatchedEx call (f32 weights); false when
  // this cuBLAS lacks it, the weights are 16-bit or differ in shape, or it refuses the call
  // (the caller then runs one GEMM per expert; only the pointer upload may have been enqueued).
  bool GroupedGemmOneCall(const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets, float* y);

  std::unique_ptr<Impl> impl_;
  size_t capacity_ = 0;
  std::atomic<size_t> used_{0};
};

}  // namespace moeserve
