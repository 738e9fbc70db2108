// The AMX tile configuration the amx kernels share (gemm_amx.cc, attention_amx.cc): a block of
// up to 32 rows in two A tiles against two B tiles, four accumulators.
//
// Tiles 0-3 hold C[a][b] (A tile a, B tile b) as rows0 / rows1 x 16 fp32 (tile 2a + b), tiles
// 4-5 the two A tiles (rows0 / rows1 x 32 bf16), 6-7 the two B tiles (16 pair-rows x 16
// columns); rows1 0 leaves tiles 2, 3 and 5 out. Only inline assembly here (no intrinsic), so
// the header compiles under any target.
#pragma once

#include <cstdint>
#include <cstring>

namespace moeserve::cpu_fast {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile configuration is thread state that other code may change (or release): it is read back
// with sttilecfg (64 zero bytes when released) and loaded only when it differs.
inline void ConfigureAmxTiles(int rows0, int rows1) {
  AmxTileConfig want;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    want.rows[t] = static_cast<uint8_t>(rows[t]);
    want.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  AmxTileConfig have;
  __asm__ volatile("sttilecfg %0" : "=m"(have));
  if (std::memcmp(&have, &want, sizeof(want)) != 0) __asm__ volatile("ldtilecfg %0" ::"m"(want));
}

}  // namespace moeserve::cpu_fast
