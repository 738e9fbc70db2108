// The instruction sets the CPU fast path can issue, as cpuid and the OS report them, and the
// kernel variant chosen from them. One binary holds every variant (each compiled for its own
// instructions with target attributes); which one runs is decided at start, never at build time.
//
// Variants and their numerics:
//   avx2         fp32 FMAs on 8 lanes: exact (fp32 activations), the reference order of gemm.h
//   avx512       fp32 FMAs on 16 lanes, two weight rows per register: bit-identical to avx2
//   avx512-bf16  vdpbf16ps: activations rounded to bf16, bf16 weights (f32 weights use avx512)
//   amx          tdpbf16ps tiles: activations rounded to bf16, bf16 weights
// Each is deterministic and batch-invariant; the bf16 ones differ from the exact ones (and from
// each other) in the last bits, which the backend's KernelNumerics() names.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeserve {

// kAmxModel ("amx-model"): the amx variant with its tile instructions computed by the software
// model of the tile unit (amx_tile_model.h), on any CPU with AVX512-BF16, to run the amx
// variant's code where no AMX is granted (its tests; variant_accuracy). Not meant for speed,
// never chosen by auto; its bits are the model's, not the hardware's.
enum class CpuIsa { kAuto = 0, kAvx2, kAvx512, kAvx512Bf16, kAmx, kAmxModel };

// The amx variant's code paths: on the tiles, or on their model.
inline bool IsAmx(CpuIsa isa) { return isa == CpuIsa::kAmx || isa == CpuIsa::kAmxModel; }

// Whether the fastest variant may round activations to bf16 (kFastest) or must keep the exact
// fp32 arithmetic (kExact: avx2 or avx512).
enum class CpuKernelNumerics { kFastest = 0, kExact };

struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA, with the OS saving ymm state
  bool avx512 = false;       // AVX512 F, BW, VL and DQ, with the OS saving zmm state
  bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps)
  bool avx512_fp16 = false;  // AVX512_FP16 (calibrate's peak only)
  bool amx_bf16 = false;     // AMX-TILE and AMX-BF16, and the kernel granted tile state
  std::string amx_detail;    // why AMX is not usable, when the CPU has it
};

// cpuid, xgetbv and, for AMX, arch_prctl(ARCH_REQ_XCOMP_PERM): asked once per process.
const CpuFeatures& DetectCpuFeatures();

const char* CpuIsaName(CpuIsa isa);  // "auto", "avx2", "avx512", "avx512-bf16", "amx", "amx-model"
absl::StatusOr<CpuIsa> ParseCpuIsa(const std::string& name);
const char* CpuKernelNumericsName(CpuKernelNumerics n);  // "fastest", "exact"
absl::StatusOr<CpuKernelNumerics> ParseCpuKernelNumerics(const std::string& name);

// Whether this CPU can run `isa`; if not, `missing` names the cpuid flag (or the OS refusal).
bool CpuSupports(const CpuFeatures& f, CpuIsa isa, std::string* missing = nullptr);

// Whether a variant rounds activations to bf16 (the exact ones do not).
inline bool RoundsActivations(CpuIsa isa) { return isa == CpuIsa::kAvx512Bf16 || IsAmx(isa); }

// The exact variant that serves f32 weights when `isa` is chosen.
CpuIsa ExactIsaFor(CpuIsa isa);

}  // namespace moeserve
