// Choosing the CPU fast path's kernel variant at start: the variants this CPU supports, each
// self-checked against a float64 reference on fresh random inputs (milliseconds) before it is
// trusted; a variant that fails is not used, with a warning naming it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve {

struct VariantCheck {
  CpuIsa isa = CpuIsa::kAvx2;
  bool supported = false;  // the CPU and OS can run it
  std::string missing;     // the cpuid flag (or OS refusal) when not supported
  bool passed = false;     // the self-check agreed with the reference
  std::string detail;      // max-abs and relative error, or what failed
};

// Runs the self-check of `isa` (supported by the CPU): GEMMs of awkward shapes with f32 and bf16
// weights in both layouts against float64, within the variant's stated tolerance, and every row
// of a batch equal to the same row computed alone, and the same for its FP8 kernel; the fused
// gate/up and SiLU where the variant has one; its multi-head and latent attention over bf16 and
// f32 caches (attention_self_check.h).
VariantCheck SelfCheckVariant(CpuIsa isa);

// Every variant, checked once per process (supported ones run their self-check).
const std::vector<VariantCheck>& CheckedVariants();

// The variant to run. kAuto: the fastest that passed its self-check, among the exact ones when
// `numerics` is kExact. A forced variant the CPU lacks, or that failed its self-check, or a
// bf16 variant with kExact, is an error naming the flag.
absl::StatusOr<CpuIsa> ChooseCpuIsa(CpuIsa requested, CpuKernelNumerics numerics);

// "avx512-bf16 (avx2: passed, avx512: passed, avx512-bf16: passed, amx: no cpuid flag ...)".
std::string DescribeVariants(CpuIsa chosen);

}  // namespace moeserve
