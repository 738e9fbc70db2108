// Rotary frequencies and YaRN factors (transformers' _compute_yarn_parameters).
#include "models/rope_scaling.h"

#include <algorithm>
#include <cmath>

namespace moeserve {

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

std::vector<float> RopeInvFreq(const ModelConfig& c, int64_t rotary_dim) {
  const RopeScaling& y = c.rope_scaling;
  const int64_t half = rotary_dim / 2;
  const double base = c.rope_theta;
  std::vector<float> inv(static_cast<size_t>(half));
  if (!y.yarn) {
    for (int64_t i = 0; i < half; ++i) inv[i] = static_cast<float>(std::pow(base, -2.0 * i / rotary_dim));
    return inv;
  }
  // The dimension whose wavelength completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return rotary_dim * std::log(y.original_max_position_embeddings / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rotary_dim - 1));
  if (low == high) high += 0.001;  // as transformers: no division by zero
  for (int64_t i = 0; i < half; ++i) {
    const double pos_freq = std::pow(base, 2.0 * i / rotary_dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
    inv[i] = static_cast<float>((1.0 / (y.factor * pos_freq)) * (1.0 - extrapolation) + (1.0 / pos_freq) * extrapolation);
  }
  return inv;
}

float RopeAttentionFactor(const ModelConfig& c) {
  const RopeScaling& y = c.rope_scaling;
  if (!y.yarn) return 1.0f;
  if (y.attention_factor > 0) return static_cast<float>(y.attention_factor);
  if (y.mscale != 0 && y.mscale_all_dim != 0) {
    return static_cast<float>(YarnMscale(y.factor, y.mscale) / YarnMscale(y.factor, y.mscale_all_dim));
  }
  return static_cast<float>(YarnMscale(y.factor, 1.0));
}

double ModelConfig::SoftmaxScale() const {
  if (!is_mla()) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  double scale = 1.0 / std::sqrt(static_cast<double>(mla.qk_head_dim()));
  if (rope_scaling.yarn && rope_scaling.mscale_all_dim != 0) {
    const double m = YarnMscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

}  // namespace moeserve
