// Rotary embedding frequencies as transformers computes them: plain (theta^(-2i/d)) or YaRN
// (interpolated below the correction range, extrapolated above it, a ramp between), and YaRN's
// scale factors for cos/sin and for the softmax.
#pragma once

#include <vector>

#include "models/model_config.h"

namespace moeserve {

// YaRN's magnitude correction: 0.1 * mscale * ln(scale) + 1, or 1 for scale <= 1.
double YarnMscale(double scale, double mscale);

// The `rotary_dim / 2` inverse frequencies of the config's rotary embedding.
std::vector<float> RopeInvFreq(const ModelConfig& c, int64_t rotary_dim);

// The factor transformers multiplies cos and sin by (1 without YaRN).
float RopeAttentionFactor(const ModelConfig& c);

}  // namespace moeserve
