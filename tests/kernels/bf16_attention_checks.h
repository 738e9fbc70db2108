// What the multi-head (paged_attention_bf16_test.cc) and latent (latent_bf16_test.cc) tests of the
// bf16 attention kernels share: the kernels under test, whether this CPU runs one, and (included
// here) the error bound against float64 attention that the variant self-checks use too
// (kernels/cpu/attention_bound.h).
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "kernels/cpu/attention_bound.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fast_ops.h"

namespace moeserve::testing {

// The bf16 attention kernels: the avx512-bf16 and amx variants' backends, and the amx kernel with
// its tile instructions computed by the software model (kernels/cpu/amx_tile_model.h), which runs
// its layouts, chunks and rows on any CPU with AVX512-BF16 (the model's bits are not the
// hardware's).
enum class Bf16Kernel { kAvx512Bf16, kAmx, kAmxModel };

inline std::string Bf16KernelName(Bf16Kernel k) {
  return k == Bf16Kernel::kAmx ? "amx" : k == Bf16Kernel::kAmxModel ? "amx_model" : "avx512bf16";
}

// Why this CPU cannot run `kernel`, naming the missing cpuid flag; empty where it can.
inline std::string Bf16AttentionSkipReason(Bf16Kernel kernel) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (!f.avx512_bf16) return "this CPU lacks cpuid flag avx512_bf16";
  if (kernel == Bf16Kernel::kAmx && !f.amx_bf16) {
    return "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " + f.amx_detail;
  }
  return "";
}

// A kernel on `threads` threads with the Backend's attention signatures: a variant's backend, or
// the model's kernel on a pool of its own (caches written by the avx512-bf16 backend: every
// variant rounds K, V and latents to bf16 alike).
class KernelUnderTest {
 public:
  KernelUnderTest(Bf16Kernel kernel, int threads)
      : kernel_(kernel),
        backend_(CpuBackendOptions{CpuPath::kFast, threads, 0, true,
                                   kernel == Bf16Kernel::kAmx ? CpuIsa::kAmx : CpuIsa::kAvx512Bf16,
                                   CpuKernelNumerics::kFastest}),
        pool_(kernel == Bf16Kernel::kAmxModel ? threads : 1) {}
  void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout, int64_t layer,
                      const void* cache, int64_t q_heads, float scale, float* out) {
    if (kernel_ != Bf16Kernel::kAmxModel) {
      return backend_.PagedAttention(q, batch, layout, layer, cache, q_heads, scale, out);
    }
    cpu_fast::PagedAttention(pool_, q, batch, layout, layer, cache, q_heads, scale, out,
                             cpu_fast::AttentionKernel::kAmxTilesModel);
  }
  void PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                            const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                            int64_t latent_dim, float scale, float* out) {
    if (kernel_ != Bf16Kernel::kAmxModel) {
      return backend_.PagedLatentAttention(q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim, scale,
                                           out);
    }
    cpu_fast::PagedLatentAttention(pool_, q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim, scale, out,
                                   cpu_fast::AttentionKernel::kAmxTilesModel);
  }
  CpuBackend& backend() { return backend_; }

 private:
  Bf16Kernel kernel_;
  CpuBackend backend_;
  ThreadPool pool_;
};

}  // namespace moeserve::testing
