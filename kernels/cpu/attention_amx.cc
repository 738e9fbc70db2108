// Paged attention's products on AMX tiles (see attention_amx.h), in amx_tiles.h's arrangement:
// two A tiles of up to 16 rows against two B tiles, four accumulators. Only amx_tiles.h's inline
// assembly touches the tiles, so no target pragma is needed here.
#include "kernels/cpu/attention_amx.h"

#include <algorithm>

#include "kernels/cpu/amx_tiles.h"

namespace moeserve::cpu_fast {

constexpr int64_t kTileDwords = 256;  // one B tile: 16 rows x 16 dwords

void ScoresAmx(const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks, float* out,
               int64_t out_stride) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  ConfigureAmxTiles(rows0, rows1);
  const long a_stride = static_cast<long>(hd * sizeof(uint16_t));
  const int64_t steps = hd / 32, block_dwords = steps * kTileDwords;
  const uint16_t* q1 = rows1 > 0 ? q + 16 * hd : q;  // the second A tile, when there is one
  for (int64_t b = 0; b < blocks; b += 2) {
    AmxZeroC(rows1);
    const uint32_t* k0 = kt + b * block_dwords;
    for (int64_t s = 0; s < steps; ++s) {
      AmxStep(q + 32 * s, q1 + 32 * s, a_stride, k0 + s * kTileDwords, k0 + block_dwords + s * kTileDwords, rows1);
    }
    AmxStoreC(out + 16 * b, out_stride, rows1);
  }
}

void WeightedSumAmx(const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt, int64_t steps, int64_t hd,
                    float* acc) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  ConfigureAmxTiles(rows0, rows1);
  const long a_stride = static_cast<long>(p_stride * sizeof(uint16_t));
  const int64_t step_dwords = hd / 16 * kTileDwords;
  const uint16_t* p1 = rows1 > 0 ? p + 16 * p_stride : p;
  for (int64_t c = 0; c < hd / 16; c += 2) {  // 32 dimensions per pass
    AmxZeroC(rows1);
    for (int64_t t = 0; t < steps; ++t) {
      const uint32_t* v = vt + t * step_dwords + c * kTileDwords;
      AmxStep(p + 32 * t, p1 + 32 * t, a_stride, v, v + kTileDwords, rows1);
    }
    AmxStoreC(acc + 16 * c, hd, rows1);
  }
}

}  // namespace moeserve::cpu_fast
