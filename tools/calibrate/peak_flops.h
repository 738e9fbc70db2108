// The machine's peak arithmetic rate, measured the way the hardware sets it: register-resident
// loops of independent fused multiply-adds (no memory traffic) on every thread, one loop per
// instruction kind the CPU has: fp32 FMA on 256-bit (AVX2) and 512-bit (AVX-512) registers,
// and AVX512-BF16 dot products. Roofline fractions are taken against the kind the GEMM kernels
// issue (kernels/cpu/gemm.h), not against our own GEMM.
#pragma once

#include <string>
#include <vector>

namespace moeserve::calibrate {

struct PeakFlops {
  std::string kind;             // "f32-fma-256", "f32-fma-512", "bf16-dot-512"
  double flops_per_second = 0;  // all threads together; a multiply-add counts 2
};

// One entry per kind this CPU supports (in that order), each run on `threads` threads for
// about `seconds`.
std::vector<PeakFlops> MeasurePeakFlops(int threads, double seconds);

}  // namespace moeserve::calibrate
