// The machine's peak arithmetic rate, measured the way the hardware sets it: register-resident
// loops of independent multiply-accumulates (no memory traffic) on every core, pinned, one loop
// per instruction kind the CPU has:
//   f32-fma-256   vfmadd231ps ymm      16 FLOP per instruction   (AVX2 + FMA)
//   f32-fma-512   vfmadd231ps zmm      32                        (AVX512F)
//   bf16-dot-256  vdpbf16ps ymm        32                        (AVX512_BF16 + VL)
//   bf16-dot-512  vdpbf16ps zmm        64                        (AVX512_BF16)
//   f16-fma-512   vfmadd231ph zmm      64                        (AVX512_FP16)
//   amx-bf16      tdpbf16ps 16x16x32   16384                     (AMX-TILE + AMX-BF16, after
//                 arch_prctl(ARCH_REQ_XCOMP_PERM); run in a child process, so a fault there
//                 cannot end calibrate)
// A kind the CPU lacks is skipped with the missing cpuid flag named. Roofline fractions are
// taken against the kind the kernels issue (kernels/cpu/gemm.h), not against our own GEMM.
#pragma once

#include <string>
#include <vector>

namespace moeserve::calibrate {

struct PeakFlops {
  std::string kind;                  // as above
  double flops_per_instruction = 0;  // a multiply-add counts 2
  double flops_per_second = 0;       // all cores together, median of the samples
  double spread = 0;                 // (max - min) / median of the samples
};

struct SkippedKind {
  std::string kind;
  std::string missing;  // the cpuid flag or OS refusal
};

struct PeakReport {
  std::vector<PeakFlops> peaks;  // in the order above
  std::vector<SkippedKind> skipped;
  const PeakFlops* Find(const std::string& kind) const;
  const PeakFlops* Best() const;  // the highest rate
};

// Each kind on `threads` pinned threads, `samples` times for about `seconds` each.
PeakReport MeasurePeakFlops(int threads, double seconds, int samples);

}  // namespace moeserve::calibrate
