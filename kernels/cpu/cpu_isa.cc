// CPU feature detection for the kernel variants.
#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moeserve {
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
constexpr int kXfeatureXtiledata = 18;     // AMX tile data

uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool Bit(uint32_t reg, int bit) { return (reg >> bit) & 1u; }

CpuFeatures Detect() {
  CpuFeatures f;
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = Bit(c, 12), osxsave = Bit(c, 27);
  if (!osxsave) return f;
  const uint64_t xcr0 = Xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;      // SSE and AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;    // plus opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const uint32_t ebx7 = b, edx7 = d;
  uint32_t eax71 = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) eax71 = a;
  f.avx2_fma = ymm_state && fma && Bit(ebx7, 5);
  f.avx512 = f.avx2_fma && zmm_state && Bit(ebx7, 16) && Bit(ebx7, 17) && Bit(ebx7, 30) && Bit(ebx7, 31);
  f.avx512_bf16 = f.avx512 && Bit(eax71, 5);
  f.avx512_fp16 = f.avx512 && Bit(edx7, 23);
  const bool amx_cpu = Bit(edx7, 24) && Bit(edx7, 22);  // AMX-TILE, AMX-BF16
  if (!amx_cpu) {
    f.amx_detail = "cpuid: no amx_tile/amx_bf16";
  } else if (!f.avx512) {
    f.amx_detail = "AMX without AVX-512 state";
  } else if (!tile_state) {
    f.amx_detail = "the OS does not enable tile state (XCR0 bits 17-18)";
  } else if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    f.amx_detail = absl::StrCat("arch_prctl(ARCH_REQ_XCOMP_PERM) refused: ", std::strerror(errno));
  } else {
    f.amx_bf16 = true;
  }
  return f;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  // Facts about the hardware, fixed for the process: computed once, read-only afterwards.
  static const CpuFeatures features = Detect();
  return features;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512-bf16";
    case CpuIsa::kAmx: return "amx";
    case CpuIsa::kAmxModel: return "amx-model";
  }
  return "?";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(const std::string& name) {
  for (CpuIsa isa :
       {CpuIsa::kAuto, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx, CpuIsa::kAmxModel}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--cpu-isa: \"", name, "\" is not one of auto, avx2, avx512, avx512-bf16, amx, amx-model"));
}

const char* CpuKernelNumericsName(CpuKernelNumerics n) {
  return n == CpuKernelNumerics::kExact ? "exact" : "fastest";
}

absl::StatusOr<CpuKernelNumerics> ParseCpuKernelNumerics(const std::string& name) {
  if (name == "exact") return CpuKernelNumerics::kExact;
  if (name == "fastest") return CpuKernelNumerics::kFastest;
  return absl::InvalidArgumentError(absl::StrCat("--cpu-kernel: \"", name, "\" is not one of fastest, exact"));
}

bool CpuSupports(const CpuFeatures& f, CpuIsa isa, std::string* missing) {
  auto no = [&](const std::string& why) {
    if (missing != nullptr) *missing = why;
    return false;
  };
  switch (isa) {
    case CpuIsa::kAuto: return true;
    case CpuIsa::kAvx2: return f.avx2_fma || no("cpuid flag avx2/fma (or OS ymm state)");
    case CpuIsa::kAvx512:
      return f.avx512 || no("cpuid flags avx512f/avx512bw/avx512vl/avx512dq (or OS zmm state)");
    case CpuIsa::kAvx512Bf16: return f.avx512_bf16 || no("cpuid flag avx512_bf16");
    case CpuIsa::kAmx: return f.amx_bf16 || no(f.amx_detail);
    case CpuIsa::kAmxModel: return f.avx512_bf16 || no("cpuid flag avx512_bf16 (the model's packing and softmax)");
  }
  return false;
}

CpuIsa ExactIsaFor(CpuIsa isa) {
  return isa == CpuIsa::kAvx2 ? CpuIsa::kAvx2 : CpuIsa::kAvx512;
}

}  // namespace moeserve
