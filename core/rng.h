// Deterministic random numbers (SplitMix64 seeding a xoshiro256**), so that seeded weights
// and seeded sampling give the same values on every machine and compiler.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

namespace moeserve {

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a, to derive a per-tensor seed from a name independently of generation order.
inline uint64_t HashString(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t st = seed;
    for (auto& w : s_) w = SplitMix64(st);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 bits of precision (exact in fp32).
  float UniformFloat() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) with 53 bits.
  double UniformDouble() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace moeserve
