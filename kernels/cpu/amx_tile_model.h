// A software model of the AMX tile unit as the kernels drive it (amx_tiles.h): the same
// operations under the same names, on one thread's modelled tiles, so the kernels' layouts,
// blocking and row handling run and are tested on any CPU (gemm_amx.cc through
// gemm_amx_tiles.h's EmulatedTiles, attention_amx.cc through its model instantiation; the
// amx-model variant, cpu_isa.h, runs the whole amx variant on it). Each
// tdpbf16ps follows Intel SDM's pseudo-code: per output element, the pair products of each K
// step added in order, even element first. The hardware rounds otherwise (on the Sapphire Rapids
// VM 17-46% of a step's outputs differed from this and four other simple models,
// docs/performance-log.md), so tests hold the model to float64 within a bound, and model to model
// bit for bit, never to the hardware's bits. Plain C++ in its own translation unit: no target
// needed, and no inline function whose copies other targets could replace.
#pragma once

#include <cstdint>

namespace moeserve::cpu_fast::amx_model {

// ConfigureAmxTiles: accumulators 0-1 and A tile 4 take rows0 rows, accumulators 2-3 and A tile
// 5 rows1 (0: unused), B tiles 6-7 16. What the kernels may configure (the hardware faults on
// more than 16 rows; the kernels' second A tile is the 16 rows after a full first): rows0 in
// 1..16, rows1 in 0..16, rows1 > 0 only with rows0 16. A breach, or an instruction on a tile
// left unconfigured, poisons every later store with NaN, so a test fails where the hardware
// would fault.
void Configure(int rows0, int rows1);
// AmxZeroC: accumulators 0-1, and 2-3 when rows1 > 0.
void ZeroC(int rows1);
// AmxStep: C[a][b] += A(a) B(b), A tiles read `a_stride` bytes a row (a1 only when rows1 > 0).
void Step(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, int rows1);
// AmxStepSharedB: C[0][0] += A(0) B(0) and C[1][0] += A(1) B(0).
void StepSharedB(const void* a0, const void* a1, long a_stride, const uint32_t* b0);
// The configured rows of accumulator t (0-3, tile 2a + b) to dst, rows `stride` floats apart.
void StoreTile(int t, float* dst, int64_t stride);
// AmxStoreC: C[a][b] to c + 16 a stride + 16 b (accumulators 2-3 only when rows1 > 0).
void StoreC(float* c, int64_t stride, int rows1);
// AmxStoreSharedBC: C[0][0] to c, C[1][0] to c + 16 stride.
void StoreSharedBC(float* c, int64_t stride);

}  // namespace moeserve::cpu_fast::amx_model
