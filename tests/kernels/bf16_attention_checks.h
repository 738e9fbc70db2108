// What the multi-head (paged_attention_test.cc) and latent (latent_bf16_test.cc) tests of the bf16
// attention kernels share: whether this CPU runs a variant, and (included here) the error bound
// against float64 attention that the variant self-checks use too (kernels/cpu/attention_bound.h).
#pragma once

#include <string>

#include "kernels/cpu/attention_bound.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve::testing {

// Why this CPU cannot run the bf16 attention of `isa` (avx512-bf16 or amx), naming the missing
// cpuid flag; empty where it can.
inline std::string Bf16AttentionSkipReason(CpuIsa isa) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (!f.avx512_bf16) return "this CPU lacks cpuid flag avx512_bf16";
  if (isa == CpuIsa::kAmx && !f.amx_bf16) {
    return "this CPU or kernel grants no AMX tiles (cpuid amx_bf16, amx_tile): " + f.amx_detail;
  }
  return "";
}

}  // namespace moeserve::testing
