// CUDA backend.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace moeserve {
namespace {

cuda::KvGeometry GeometryOf(const KvLayout& l) {
  cuda::KvGeometry g;
  g.num_blocks = l.num_blocks;
  g.num_layers = l.num_layers;
  g.block_size = l.block_size;
  g.kv_heads = l.kv_heads;
  g.head_dim = l.head_dim;
  g.elem = ElemOf(l.dtype);
  return g;
}

}  // namespace

void CudaBackend::Use() const { cudaSetDevice(impl_->device); }

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear it
    return absl::FailedPreconditionError("cuda: no GPU is visible");
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda: device ", options.device, " of ", count));
  }
  auto impl = std::make_unique<Impl>();
  impl->device = options.device;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  impl->name = absl::StrCat("cuda (device ", options.device, ": ", prop.name, ")");
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->copy_stream, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&impl->compute_event, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&impl->barrier_event, cudaEventDisableTiming));
  for (cudaEvent_t& e : impl->ring) CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&impl->cublas));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(impl->cublas, impl->stream));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(impl)));
  b->capacity_ = options.capacity_bytes > 0 ? options.capacity_bytes : free_bytes / 10 * 9;
  return b;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  Use();
  cudaStreamSynchronize(impl_->stream);
  // Every buffer this object holds goes while its streams exist: Free synchronises on them, and
  // Impl's destructor destroys them before its members are destroyed.
  impl_->scratch = DeviceBuffer();
  impl_->group_pointers = DeviceBuffer();
  impl_->expert_tables.clear();
}

std::string CudaBackend::Name() const { return impl_->name; }

void CudaBackend::Note(const absl::Status& s) {
  if (s.ok()) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->error.ok()) impl_->error = s;
}

absl::Status CudaBackend::TakeError() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  absl::Status s = impl_->error;
  impl_->error = absl::OkStatus();
  return s;
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  if (used_ + rounded > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("cuda device arena: cannot allocate ", bytes, " bytes, ", used_.load(),
                                                     " of ", capacity_, " bytes in use"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  void* p = nullptr;
  if (cudaMalloc(&p, rounded) != cudaSuccess) {
    cudaGetLastError();  // clear it, so that it is not reported by the next launch
    return absl::ResourceExhaustedError(absl::StrCat("cuda: cudaMalloc of ", rounded, " bytes failed (", used_.load(),
                                                     " of ", capacity_, " bytes in use by this backend)"));
  }
  used_ += rounded;
  return DeviceBuffer(this, p, rounded);
}

void CudaBackend::Free(void* data, size_t bytes) {
  Use();
  cudaStreamSynchronize(impl_->stream);       // no kernel may still use it
  cudaStreamSynchronize(impl_->copy_stream);  // nor a copy (cudaFree need not wait for them)
  cudaFree(data);
  used_ -= bytes;
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  Use();
  if (bytes == 0) return TakeError();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream));
  // The host buffer may be reused as soon as this returns.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return TakeError();
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  Use();
  if (bytes == 0) return TakeError();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return TakeError();
}

absl::Status CudaBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  Use();
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
  return TakeError();
}

absl::Status CudaBackend::Synchronize() {
  Use();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return TakeError();
}

absl::StatusOr<HostBuffer> CudaBackend::AllocateHost(size_t bytes) {
  Use();
  void* p = nullptr;
  // Portable: pinned for every GPU of the process (the ranks of --ep/--pp share host tiers).
  if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cuda: cudaHostAlloc of ", bytes, " pinned bytes failed"));
  }
  return HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); }, /*pinned=*/true);
}

absl::StatusOr<uint64_t> CudaBackend::CopyAsync(void* dst, const void* src, size_t bytes) {
  Use();
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.copy_mu);
  const uint64_t t = m.issued + 1;
  cudaEvent_t ev = m.ring[t % Impl::kRing];
  if (t > Impl::kRing && m.completed < t - Impl::kRing) {  // the slot still tracks ticket t - kRing
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev));
    m.completed = t - Impl::kRing;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(m.compute_event, m.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(m.copy_stream, m.compute_event, 0));
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, m.copy_stream));
  if (absl::Status s = cuda::CudaStatus(cudaEventRecord(ev, m.copy_stream), "cudaEventRecord", __FILE__, __LINE__);
      !s.ok()) {
    cudaStreamSynchronize(m.copy_stream);  // no untracked copy may outlive the failed call
    return s;
  }
  m.issued = t;
  return t;
}

absl::Status CudaBackend::WaitCopy(uint64_t ticket) {
  Use();
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.copy_mu);
  if (ticket > m.issued) {
    return absl::InvalidArgumentError(absl::StrCat("wait for copy ", ticket, ": only ", m.issued, " issued"));
  }
  if (ticket <= m.completed) return absl::OkStatus();
  // Not yet reused: a slot is re-recorded only after its previous ticket completed.
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(m.ring[ticket % Impl::kRing]));
  m.completed = ticket;
  return absl::OkStatus();
}

void CudaBackend::OrderComputeAfterCopies() {
  Use();
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.copy_mu);
  NOTE_CUDA(cudaEventRecord(m.barrier_event, m.copy_stream));
  NOTE_CUDA(cudaStreamWaitEvent(m.stream, m.barrier_event, 0));
}

void CudaBackend::Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) {
  Use();
  NOTE_CUDA(cuda::LaunchEmbedding(ids, n, table.data, ElemOf(table.dtype), table.cols, out, impl_->stream));
}

void CudaBackend::Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) {
  Use();
  if (m == 0 || w.rows == 0) return;
  // Row-major y[m, rows] = x[m, cols] @ W[rows, cols]^T is, column-major, y^T = W^T^T x^T:
  // A = W (cols x rows column-major, transposed), B = x (cols x m), C = y (rows x m).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols), mm = static_cast<int>(m);
  if (w.dtype == DType::kF32) {
    NOTE_CUBLAS(cublasSgemm(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, mm, cols, &alpha,
                            static_cast<const float*>(w.data), cols, x, cols, &beta, y, rows));
    return;
  }
  // bf16 / f16 weights: round the activations to the same type, accumulate in fp32.
  const size_t need = static_cast<size_t>(m * w.cols) * 2;
  if (need > impl_->scratch.bytes()) {
    const size_t old = impl_->scratch.bytes();
    impl_->scratch = DeviceBuffer();  // Free waits for the stream
    auto grown = Allocate(std::max(need, 2 * old));
    if (!grown.ok()) {
      Note(grown.status());
      return;
    }
    impl_->scratch = std::move(*grown);
  }
  const int elem = ElemOf(w.dtype);
  NOTE_CUDA(cuda::LaunchConvert(x, m * w.cols, elem, impl_->scratch.data(), impl_->stream));
  const cudaDataType_t t = elem == cuda::kElemBF16 ? CUDA_R_16BF : CUDA_R_16F;
  NOTE_CUBLAS(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, mm, cols, &alpha, w.data, t, cols,
                           impl_->scratch.data(), t, cols, &beta, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  Use();
  NOTE_CUDA(cuda::LaunchRmsNorm(x, weight, rows, dim, eps, y, impl_->stream));
}

void CudaBackend::Add(float* y, const float* x, int64_t n) {
  Use();
  NOTE_CUDA(cuda::LaunchAdd(y, x, n, impl_->stream));
}

void CudaBackend::AddBias(float* y, const float* bias, int64_t rows, int64_t dim) {
  Use();
  NOTE_CUDA(cuda::LaunchAddBias(y, bias, rows, dim, impl_->stream));
}

void CudaBackend::Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float theta) {
  Use();
  NOTE_CUDA(cuda::LaunchRope(q, k, positions, n, q_heads, kv_heads, head_dim, theta, impl_->stream));
}

void CudaBackend::SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  Use();
  NOTE_CUDA(cuda::LaunchSiluMul(gate_up, rows, inter, out, impl_->stream));
}

void CudaBackend::RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                             int32_t* expert_ids, float* expert_weights) {
  Use();
  NOTE_CUDA(cuda::LaunchRouterTopK(logits, n, num_experts, k, renormalize, expert_ids, expert_weights,
                                   impl_->stream));
}

void CudaBackend::RoundToBf16(const float* x, int64_t n, uint16_t* out) {
  Use();
  NOTE_CUDA(cuda::LaunchRoundToBf16(x, n, out, impl_->stream));
}

void CudaBackend::WidenBf16(const uint16_t* x, int64_t n, float* out) {
  Use();
  NOTE_CUDA(cuda::LaunchWidenBf16(x, n, out, impl_->stream));
}

void CudaBackend::GatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim, float* out) {
  Use();
  NOTE_CUDA(cuda::LaunchGatherRows(x, src_rows, n, dim, out, impl_->stream));
}

void CudaBackend::ComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) {
  Use();
  NOTE_CUDA(cuda::LaunchComposeIndices(first, second, n, out, impl_->stream));
}

void CudaBackend::ScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n, int64_t k,
                                 int64_t dim, float* out, bool accumulate) {
  Use();
  NOTE_CUDA(cuda::LaunchScatterCombine(y, rows, weights, n, k, dim, out, accumulate, impl_->stream));
}

void CudaBackend::SigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim) {
  Use();
  NOTE_CUDA(cuda::LaunchSigmoidScaleRows(x, gate, rows, dim, impl_->stream));
}

void CudaBackend::WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n, const KvLayout& layout,
                          int64_t layer, void* cache) {
  Use();
  NOTE_CUDA(cuda::LaunchWriteKv(k, v, slots, n, GeometryOf(layout), layer, cache, impl_->stream));
}

void CudaBackend::PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout, int64_t layer,
                                 const void* cache, int64_t q_heads, float scale, float* out) {
  Use();
  NOTE_CUDA(cuda::LaunchPagedAttention(q, batch.token_seq, batch.token_pos, batch.block_tables, batch.num_tokens,
                                       batch.max_blocks_per_seq, GeometryOf(layout), layer, cache, q_heads, scale,
                                       out, impl_->stream));
}

static_assert(sizeof(SampleSpec) == sizeof(cuda::SampleSpecDevice) &&
              offsetof(SampleSpec, u) == offsetof(cuda::SampleSpecDevice, u) &&
              offsetof(SampleSpec, temperature) == offsetof(cuda::SampleSpecDevice, temperature) &&
              offsetof(SampleSpec, top_p) == offsetof(cuda::SampleSpecDevice, top_p) &&
              offsetof(SampleSpec, top_k) == offsetof(cuda::SampleSpecDevice, top_k) &&
              offsetof(SampleSpec, min_p) == offsetof(cuda::SampleSpecDevice, min_p),
              "SampleSpec and its device mirror must have the same layout");

static_assert(sizeof(LogitEdit) == sizeof(cuda::LogitEditDevice) &&
              offsetof(LogitEdit, row) == offsetof(cuda::LogitEditDevice, row) &&
              offsetof(LogitEdit, token) == offsetof(cuda::LogitEditDevice, token) &&
              offsetof(LogitEdit, bias) == offsetof(cuda::LogitEditDevice, bias) &&
              offsetof(LogitEdit, repetition) == offsetof(cuda::LogitEditDevice, repetition) &&
              offsetof(LogitEdit, subtract) == offsetof(cuda::LogitEditDevice, subtract),
              "LogitEdit and its device mirror must have the same layout");

void CudaBackend::EditLogits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) {
  Use();
  NOTE_CUDA(cuda::LaunchEditLogits(logits, vocab, reinterpret_cast<const cuda::LogitEditDevice*>(edits), n,
                                   impl_->stream));
}

void CudaBackend::SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs,
                             int32_t* tokens) {
  Use();
  NOTE_CUDA(cuda::LaunchSampleRows(logits, rows, vocab, reinterpret_cast<const cuda::SampleSpecDevice*>(specs),
                                   tokens, impl_->stream));
}

}  // namespace moeserve
