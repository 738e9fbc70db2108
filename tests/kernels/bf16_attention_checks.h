// What the multi-head (paged_attention_bf16_test.cc) and latent (latent_bf16_test.cc) tests of the
// bf16 attention kernels share: whether this CPU runs a variant's, and (included here) the error
// bound against float64 attention that the variant self-checks use too
// (kernels/cpu/attention_bound.h).
#pragma once

#include <string>

#include "kernels/cpu/attention_bound.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve::testing {

// The variants whose attention rounds to bf16: avx512-bf16, amx, and amx-model (the amx kernels
// with their tile instructions computed by the software model, amx_tile_model.h, on any CPU with
// AVX512-BF16; the model's bits are not the hardware's).
inline constexpr CpuIsa kBf16AttentionVariants[] = {CpuIsa::kAvx512Bf16, CpuIsa::kAmx, CpuIsa::kAmxModel};

// The variant's name as a test parameter.
inline std::string VariantParamName(CpuIsa isa) {
  std::string n = CpuIsaName(isa);
  for (char& ch : n) ch = ch == '-' ? '_' : ch;
  return n;
}

// Why this CPU cannot run the bf16 attention of `isa`, naming the missing cpuid flag; empty
// where it can.
inline std::string Bf16AttentionSkipReason(CpuIsa isa) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (!f.avx512_bf16) return "this CPU lacks cpuid flag avx512_bf16";
  if (isa == CpuIsa::kAmx && !f.amx_bf16) {
    return "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " + f.amx_detail;
  }
  return "";
}

// The fast path's backend of variant `isa` on `threads` threads.
inline CpuBackend VariantBackend(CpuIsa isa, int threads = 2) {
  return CpuBackend{CpuBackendOptions{CpuPath::kFast, threads, 0, true, isa, CpuKernelNumerics::kFastest}};
}

}  // namespace moeserve::testing
