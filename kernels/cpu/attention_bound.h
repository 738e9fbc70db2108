// How far a CPU attention kernel's output may lie from float64 attention over the same cache,
// for the variant self-checks (attention_self_check.h) and the kernels' tests. The reference
// follows the kernel's stated arithmetic where it is exact to follow: the bf16 kernels' queries
// rounded to bf16 (round to nearest even, as they round them). What is left is bounded per key:
// a score's fp32 sums and scaling move it by at most d_j = (2 hd + 16) 2^-24 scale sum_i |q_i k_ji|
// + (|s_j| + |s_j - max|) 2^-23, so a probability moves by a factor e^(2 dmax) - 1, plus the
// exponential's 2 ulp, the fp32 sum and division, and for the bf16 kernels 2^-8 for its rounding to
// bf16 (bf16's unit roundoff: 8 significant bits); each output o_e = sum_j p_j v_je then by that fraction
// of W_e = sum_j p_j |v_je|, plus its own fp32 sums over ctx keys and the chunks'
// recombination ((ctx + 32) 2^-24 W_e). Tight enough that a score off by 2% fails (checked by
// mutation), where a bound on max |v| let 10% through.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace moeserve::cpu_fast {

// The largest error of any output checked, as a fraction of its bound, and the error itself.
struct AttentionBound {
  double worst = 0, worst_err = 0;
};

// One query row over keys j < ctx: q(e) for e < hd (the fp32 query the kernel was given), key(j,
// e), value(j, e) for e < vd (the cached values, as doubles), out[e] the kernel's output for e <
// vd; `bf16`: the kernel rounds queries and probabilities to bf16. A NaN output counts as an
// infinite error.
template <typename Q, typename K, typename V>
void CheckAttentionRow(int64_t ctx, int64_t hd, int64_t vd, double scale, bool bf16, const Q& q, const K& key,
                       const V& value, const float* out, AttentionBound* check) {
  constexpr double kU = 0x1p-24;  // fp32's unit roundoff
  std::vector<double> qe(static_cast<size_t>(hd)), sc(static_cast<size_t>(ctx)), mag(static_cast<size_t>(ctx));
  for (int64_t e = 0; e < hd; ++e) {
    const float f = static_cast<float>(q(e));
    qe[e] = bf16 ? double{Bf16ToF32(F32ToBf16(f))} : double{f};
  }
  double mx = -1e300;
  for (int64_t j = 0; j < ctx; ++j) {
    double d = 0, m = 0;
    for (int64_t e = 0; e < hd; ++e) {
      const double p = qe[e] * key(j, e);
      d += p;
      m += std::fabs(p);
    }
    sc[j] = d * scale;
    mag[j] = m * scale;
    mx = std::max(mx, sc[j]);
  }
  double dmax = 0, sum = 0;
  for (int64_t j = 0; j < ctx; ++j) {
    dmax = std::max(dmax, static_cast<double>(2 * hd + 16) * kU * mag[j] + (std::fabs(sc[j]) + mx - sc[j]) * 2 * kU);
    sum += sc[j] = std::exp(sc[j] - mx);
  }
  const double eps = std::expm1(2 * dmax) + 4 * kU + static_cast<double>(ctx + 16) * kU + 2 * kU +
                     (bf16 ? 0x1p-8 : 0.0);
  std::vector<double> o(static_cast<size_t>(vd)), w(static_cast<size_t>(vd));  // sum p v, sum p |v|
  for (int64_t j = 0; j < ctx; ++j) {
    const double p = sc[j] / sum;
    for (int64_t e = 0; e < vd; ++e) {
      const double v = value(j, e);
      o[e] += p * v;
      w[e] += p * std::fabs(v);
    }
  }
  for (int64_t e = 0; e < vd; ++e) {
    const double err = std::isnan(out[e]) ? INFINITY : std::fabs(out[e] - o[e]);
    const double bound = (eps + static_cast<double>(ctx + 32) * kU) * (1 + eps) * w[e] + 1e-7;
    if (err / bound > check->worst) check->worst = err / bound, check->worst_err = err;
  }
}

}  // namespace moeserve::cpu_fast
