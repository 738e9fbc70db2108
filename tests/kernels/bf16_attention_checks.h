// What the multi-head (paged_attention_test.cc) and latent (latent_bf16_test.cc) tests of the bf16
// attention kernels share: whether this CPU runs a variant, and the error bound against float64
// attention: rounding the query to bf16
// moves a score by at most d = scale 2^-8 sum_i |q_i k_i|, a probability by a factor e^(2 d) - 1
// and then 2^-9 more (its own rounding), so an output by (e^(2 dmax) - 1 + 2^-7) max_j |v_j|
// (with room for fp32 sums).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

// The largest error of any output checked, as a fraction of its bound, and the error itself.
struct BoundCheck {
  double worst = 0, worst_err = 0;
};

// One query row over keys j < ctx: q(e) for e < hd, key(j, e), value(j, e) for e < vd (the
// cached values, as doubles), out[e] the kernel's output for e < vd.
template <typename Q, typename K, typename V>
void CheckRowWithinBound(int64_t ctx, int64_t hd, int64_t vd, double scale, const Q& q, const K& key, const V& value,
                         const float* out, BoundCheck* check) {
  std::vector<double> sc(static_cast<size_t>(ctx));
  double mx = -1e300, sum = 0, dmax = 0;
  for (int64_t j = 0; j < ctx; ++j) {
    double d = 0, mag = 0;
    for (int64_t e = 0; e < hd; ++e) {
      d += q(e) * key(j, e);
      mag += std::fabs(q(e) * key(j, e));
    }
    sc[j] = d * scale;
    dmax = std::max(dmax, scale * mag / 256.0);
    mx = std::max(mx, sc[j]);
  }
  for (auto& v : sc) sum += v = std::exp(v - mx);
  for (int64_t e = 0; e < vd; ++e) {
    double o = 0, vmax = 0;
    for (int64_t j = 0; j < ctx; ++j) {
      o += sc[j] / sum * value(j, e);
      vmax = std::max(vmax, std::fabs(value(j, e)));
    }
    const double err = std::fabs(out[e] - o);
    const double bound = (std::expm1(2 * dmax) + 1.0 / 128) * vmax + 1e-6;
    if (err / bound > check->worst) check->worst = err / bound, check->worst_err = err;
  }
}

}  // namespace moeserve::testing
