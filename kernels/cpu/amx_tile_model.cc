// The software model of the AMX tile unit (amx_tile_model.h).
#include "kernels/cpu/amx_tile_model.h"

#include <cstring>
#include <limits>

namespace moeserve::cpu_fast::amx_model {
namespace {

constexpr int kRows = 16, kPairs = 16, kCols = 16;  // a tile: 16 rows of 64 bytes

// One thread's tiles, as the hardware keeps them per thread.
struct Unit {
  int rows[8] = {};  // configured rows per tile; 0: not configured
  bool legal = false;
  float c[4][kRows * kCols] = {};
};
thread_local Unit unit;

float Bf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// tdpbf16ps of accumulator t with the A tile at `a` (configured rows of A tile ta) and the B
// tile at `b`; reading a tile that is not configured breaks the configuration.
void Dot(int t, int ta, const void* a, long a_stride, const uint32_t* b) {
  if (unit.rows[ta] == 0 || unit.rows[t] != unit.rows[ta]) unit.legal = false;
  for (int m = 0; m < unit.rows[ta]; ++m) {
    const auto* row = reinterpret_cast<const uint16_t*>(static_cast<const char*>(a) + m * a_stride);
    for (int k = 0; k < kPairs; ++k) {
      for (int n = 0; n < kCols; ++n) {
        const uint32_t bw = b[k * kCols + n];
        float& c = unit.c[t][m * kCols + n];
        c += Bf16(row[2 * k]) * Bf16(static_cast<uint16_t>(bw & 0xffff));
        c += Bf16(row[2 * k + 1]) * Bf16(static_cast<uint16_t>(bw >> 16));
      }
    }
  }
}

}  // namespace

void Configure(int rows0, int rows1) {
  unit.legal = rows0 >= 1 && rows0 <= kRows && rows1 >= 0 && rows1 <= kRows && (rows1 == 0 || rows0 == kRows);
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, kRows, kRows};
  std::memcpy(unit.rows, rows, sizeof(rows));
}

void ZeroC(int rows1) {
  for (int t = 0; t < (rows1 > 0 ? 4 : 2); ++t) {
    if (unit.rows[t] == 0) unit.legal = false;
    std::memset(unit.c[t], 0, sizeof(unit.c[t]));
  }
}

void Step(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, int rows1) {
  Dot(0, 4, a0, a_stride, b0);
  Dot(1, 4, a0, a_stride, b1);
  if (rows1 == 0) return;
  Dot(2, 5, a1, a_stride, b0);
  Dot(3, 5, a1, a_stride, b1);
}

void StepSharedB(const void* a0, const void* a1, long a_stride, const uint32_t* b0) {
  Dot(0, 4, a0, a_stride, b0);
  Dot(2, 5, a1, a_stride, b0);
}

void StoreTile(int t, float* dst, int64_t stride) {
  if (unit.rows[t] == 0) unit.legal = false;
  for (int m = 0; m < unit.rows[t]; ++m) {
    for (int n = 0; n < kCols; ++n) {
      dst[m * stride + n] = unit.legal ? unit.c[t][m * kCols + n] : std::numeric_limits<float>::quiet_NaN();
    }
  }
}

void StoreC(float* c, int64_t stride, int rows1) {
  StoreTile(0, c, stride);
  StoreTile(1, c + 16, stride);
  if (rows1 == 0) return;
  StoreTile(2, c + 16 * stride, stride);
  StoreTile(3, c + 16 * stride + 16, stride);
}

void StoreSharedBC(float* c, int64_t stride) {
  StoreTile(0, c, stride);
  StoreTile(2, c + 16 * stride, stride);
}

}  // namespace moeserve::cpu_fast::amx_model
