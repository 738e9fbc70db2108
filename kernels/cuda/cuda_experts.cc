// The CUDA backend's expert ops: the routing plan and the grouped expert GEMM. Both read and
// write device memory only, so a MoE layer is enqueued without a host round trip; batches of
// kHostPlanRows expert rows or more read the offsets back once and use cuBLAS's GEMMs instead,
// as the synchronisation is small next to GEMMs that size.
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve {

void CudaBackend::PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts,
                              int64_t* offsets, int32_t* gather_rows, int32_t* combine_rows) {
  Use();
  NOTE_CUDA(cuda::LaunchPlanRouting(expert_ids, n, k, num_experts, offsets, gather_rows,
                                    combine_rows, impl_->stream));
}

const void* const* CudaBackend::ExpertTable(std::span<const WeightRef> w) {
  std::vector<const void*> host;
  for (const WeightRef& e : w) host.push_back(e.data);
  // Keyed by the list itself (a layer's w13 or w2): on an expert-parallel rank the experts it
  // does not hold have no data, so their pointers cannot tell lists apart.
  Impl::ExpertTable& t = impl_->expert_tables[static_cast<const void*>(w.data())];
  if (t.host != host) {  // new, or another list at a reused address
    auto buf = Allocate(host.size() * sizeof(void*));
    if (!buf.ok()) {
      Note(buf.status());
      return nullptr;
    }
    t.device = std::move(*buf);
    t.host = std::move(host);
    // On the compute stream, before the kernel that reads it; the source lives in the cache.
    NOTE_CUDA(cudaMemcpyAsync(t.device.data(), t.host.data(), t.host.size() * sizeof(void*),
                              cudaMemcpyHostToDevice, impl_->stream));
  }
  return static_cast<const void* const*>(t.device.data());
}

void CudaBackend::GroupedGemm(const float* x, std::span<const WeightRef> w, const int64_t* offsets,
                              int64_t max_rows, float* y) {
  Use();
  if (w.empty() || max_rows == 0) return;
  const WeightRef& w0 = w[0];
  for (const WeightRef& e : w) {
    if (e.dtype != w0.dtype || e.rows != w0.rows || e.cols != w0.cols) {
      Note(absl::InvalidArgumentError(
          "grouped gemm: the experts' weights differ in shape or dtype"));
      return;
    }
  }
  if (max_rows >= kHostPlanRows) {
    std::vector<int64_t> host(w.size() + 1);
    NOTE_CUDA(cudaMemcpyAsync(host.data(), offsets, host.size() * sizeof(int64_t),
                              cudaMemcpyDeviceToHost, impl_->stream));
    NOTE_CUDA(cudaStreamSynchronize(impl_->stream));
    return GroupedGemmHost(x, w, host, y);
  }
  const void* const* table = ExpertTable(w);
  if (table == nullptr) return;
  NOTE_CUDA(cuda::LaunchGroupedGemm(x, table, ElemOf(w0.dtype), w0.rows, w0.cols, offsets,
                                    static_cast<int64_t>(w.size()), max_rows, y, impl_->stream));
}

void CudaBackend::GroupedGemmHost(const float* x, std::span<const WeightRef> w,
                                  std::span<const int64_t> offsets, float* y) {
  // One cuBLAS call for every expert (cublasGemmGroupedBatchedEx, cuBLAS 12.5 and later) ...
  if (GroupedGemmOneCall(x, w, offsets, y)) return;
  // ... or one GEMM per expert with rows (tokens are sorted by expert).
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    Gemm(x + offsets[g] * w[g].cols, rows, w[g], y + offsets[g] * w[g].rows, false);
  }
}

bool CudaBackend::GroupedGemmOneCall(const float* x, std::span<const WeightRef> w,
                                     std::span<const int64_t> offsets, float* y) {
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
  if (!impl_->grouped_gemm_supported || w.empty()) return false;
  const WeightRef& w0 = w[0];
  // f32 weights only: the grouped API multiplies bf16/f16 inputs only into a 16-bit output, and
  // the engine keeps activations in fp32 (bf16 weights stay with one cublasGemmEx per expert).
  if (w0.dtype != DType::kF32) return false;
  for (const WeightRef& e : w) {
    if (e.dtype != w0.dtype || e.rows != w0.rows || e.cols != w0.cols)
      return false;  // not one expert shape
  }
  // One problem per expert with rows, each its own group (the token counts differ).
  std::vector<const void*> a, b;
  std::vector<void*> c;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<cublasOperation_t> ta, tb;
  std::vector<float> alpha, beta;
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    a.push_back(w[g].data);
    b.push_back(x + offsets[g] * w0.cols);
    c.push_back(y + offsets[g] * w0.rows);
    m.push_back(static_cast<int>(w0.rows));
    n.push_back(static_cast<int>(rows));
    k.push_back(static_cast<int>(w0.cols));
    lda.push_back(static_cast<int>(w0.cols));
    ldb.push_back(static_cast<int>(w0.cols));
    ldc.push_back(static_cast<int>(w0.rows));
    ta.push_back(CUBLAS_OP_T);
    tb.push_back(CUBLAS_OP_N);
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
    group_size.push_back(1);
  }
  const int groups = static_cast<int>(a.size());
  if (groups == 0) return true;
  // The pointer arrays live on the device: A's, then B's, then C's.
  const size_t ptr_bytes = 3 * static_cast<size_t>(groups) * sizeof(void*);
  if (ptr_bytes > impl_->group_pointers.bytes()) {
    impl_->group_pointers = DeviceBuffer();
    auto grown = Allocate(std::max<size_t>(ptr_bytes, 64 * 3 * sizeof(void*)));
    if (!grown.ok()) return false;  // the per-expert loop needs no pointer arrays
    impl_->group_pointers = std::move(*grown);
  }
  std::vector<const void*> ptrs;
  ptrs.insert(ptrs.end(), a.begin(), a.end());
  ptrs.insert(ptrs.end(), b.begin(), b.end());
  for (void* p : c) ptrs.push_back(p);
  // Pageable source: the call returns once the host array has been staged.
  NOTE_CUDA(cudaMemcpyAsync(impl_->group_pointers.data(), ptrs.data(), ptr_bytes,
                            cudaMemcpyHostToDevice, impl_->stream));
  auto* dev = static_cast<void**>(impl_->group_pointers.data());
  const cudaDataType_t t = CUDA_R_32F;
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      impl_->cublas, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
      const_cast<const void* const*>(dev), t, lda.data(),
      const_cast<const void* const*>(dev + groups), t, ldb.data(), beta.data(), dev + 2 * groups,
      CUDA_R_32F, ldc.data(), groups, group_size.data(), CUBLAS_COMPUTE_32F);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // this type mix: the per-expert loop from now on
    impl_->grouped_gemm_supported = false;
    return false;
  }
  NOTE_CUBLAS(st);
  return true;
#else
  return false;
#endif
}

}  // namespace moeserve
