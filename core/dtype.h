// Element types moeserve stores (weights, KV) and their conversions to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace moeserve {

// kF8E4M3 is PyTorch's float8_e4m3fn (sign, 4 exponent bits of bias 7, 3 mantissa bits, no
// infinities, 0x7f/0xff NaN, largest 448): FP8 weights, always with scales (kernels/backend.h).
enum class DType { kF32, kBF16, kF16, kF8E4M3 };

size_t DTypeSize(DType t);
// Safetensors spelling: "F32", "BF16", "F16".
absl::string_view DTypeSafetensorsName(DType t);
absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view name);
// Hugging Face torch_dtype spelling: "float32", "bfloat16", "float16".
absl::string_view DTypeTorchName(DType t);
absl::StatusOr<DType> DTypeFromTorchName(absl::string_view name);
// Command-line spelling: "f32", "bf16", "f16".
absl::string_view DTypeShortName(DType t);
absl::StatusOr<DType> DTypeFromShortName(absl::string_view name);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float F8E4M3ToF32(uint8_t v);
// Round to nearest even; magnitudes past 448 saturate to 448 (callers scale into range first);
// NaN stays NaN.
uint8_t F32ToF8E4M3(float f);

// Converts `n` elements of type `src_type` at `src` to fp32.
void ConvertToF32(const void* src, DType src_type, size_t n, float* dst);
// Converts `n` fp32 values to `dst_type` (fp32 is a copy).
void ConvertFromF32(const float* src, size_t n, DType dst_type, void* dst);

}  // namespace moeserve
