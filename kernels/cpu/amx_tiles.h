// The AMX tile configuration the amx kernels share (gemm_amx.cc, attention_amx.cc): a block of
// up to 32 rows in two A tiles against two B tiles, four accumulators.
//
// Tiles 0-3 hold C[a][b] (A tile a, B tile b) as rows0 / rows1 x 16 fp32 (tile 2a + b), tiles
// 4-5 the two A tiles (rows0 / rows1 x 32 bf16), 6-7 the two B tiles (16 pair-rows x 16
// columns); rows1 0 leaves tiles 2, 3 and 5 out. Only inline assembly here (no intrinsic), so
// the header compiles under any target.
#pragma once

#include <cstdint>

namespace moeserve::cpu_fast {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile configuration is thread state, loaded only when it differs from what this thread last
// loaded here. Every tile configuration of the kernels goes through this function and they never
// release the tiles (signals and context switches save and restore the state), so the thread's
// own record is the hardware's. calibrate's peak loop (tools/calibrate/peak_flops.cc) configures
// and releases tiles itself, in a forked child that never runs a kernel: it must stay there. Reading it back with sttilecfg instead waits for every
// tile operation in flight: a quarter of a prefill GEMM's time went there when each block of
// 32 rows checked (Sapphire Rapids VM, m 512 x 2048 x 512).
inline void ConfigureAmxTiles(int rows0, int rows1) {
  thread_local int loaded0 = -1, loaded1 = -1;
  if (rows0 == loaded0 && rows1 == loaded1) return;
  AmxTileConfig want;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    want.rows[t] = static_cast<uint8_t>(rows[t]);
    want.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(want));
  loaded0 = rows0, loaded1 = rows1;
}

}  // namespace moeserve::cpu_fast
