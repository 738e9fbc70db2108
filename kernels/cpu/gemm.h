// The CPU fast path's GEMM: y = x @ w^T for fp32 activations and fp32 or bf16 weights, in
// either weight layout (kernels/weight_layout.h), in one of the variants of cpu_isa.h chosen at
// start (avx2, avx512, avx512-bf16; gemm_*.cc).
//
// Batch-invariant in every variant: every output element is the same sequence of operations
// whatever m, the batch mates, the layout, the thread count or the kernel shape that computed
// it. The exact variants (avx2, avx512; bit-identical): lane l (0..7) accumulates columns
// c = l, l + 8, l + 16, ... in order with fp32 fused multiply-adds (a last partial chunk padded
// with zeros), then the 8 lanes are summed in one fixed tree; bf16 weights widen to fp32
// exactly. avx512-bf16 rounds x to bf16 first (RoundRowsToBf16), then lane p (0..3) of a row
// accumulates the column pairs (8c + 2p, 8c + 2p + 1) in order with vdpbf16ps, and the 4 lanes
// are summed ((p0 + p1) + (p2 + p3)).
//
// Small m (decode) streams each 8-row tile of w once, 8 rows' dot products at a time, with
// software prefetch ahead of the stream: bandwidth-bound. Large m widens a tile to fp32 once and
// runs a 2 x 4 register-blocked kernel over it: compute-bound. Several GEMMs (the experts of a
// MoE layer) run in one parallel region, so that both cores work when a step hits few experts.
#pragma once

#include <span>

#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve::cpu_fast {

struct GemmTask {
  const float* x = nullptr;  // [m, w.cols]
  int64_t m = 0;
  WeightRef w;
  float* y = nullptr;       // [m, w.rows]
  bool accumulate = false;  // y += x @ w^T
  // > 0: w is [gate; up], `swiglu` rows each, and y [m, swiglu] gets silu(x gate^T) * (x up^T)
  // in one pass (amx on weights stored as AMX tiles, avx512-bf16 on 8-row tiles: SwiGluFusable).
  int64_t swiglu = 0;
  // x_packed: the activations already rounded into the variant's layout (PackActivations: amx
  // PadRowsAmx's, RoundUp(m, 32) rows; avx512-bf16 PackRowsBf16's, RoundUp(m, 12) rows; the
  // padding zero), read instead of x. y_packed (with swiglu, where PacksSwiGluOutput): the
  // output written in that layout, bf16, padding included, instead of y: the next GEMM's
  // x_packed, so the [m, swiglu] activations are never stored as fp32 nor rounded again (the
  // same bits: the layout's rounding of the fp32 values).
  const uint16_t* x_packed = nullptr;
  uint16_t* y_packed = nullptr;
};

// Whether a GemmTask with `swiglu` = inter runs on variant `isa` for the [gate; up] weight w.
bool SwiGluFusable(CpuIsa isa, const WeightRef& w, int64_t inter);
// Whether such a task may write its output packed (GemmTask::y_packed) on `isa`.
bool PacksSwiGluOutput(CpuIsa isa, int64_t inter);
// Elements of x [m, k] in variant `isa`'s packed layout (amx, avx512-bf16), and rows [i0, i1) of
// it written from x (i0, i1 multiples of the layout's row block; rows past m zero).
int64_t PackedActivationElems(CpuIsa isa, int64_t m, int64_t k);
int64_t PackedRows(CpuIsa isa, int64_t m);  // m rounded up to the layout's row block
void PackActivations(CpuIsa isa, const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out);

// The instruction kind a variant's inner loop issues for bf16 weights, as `moeserve calibrate`
// names its peaks: "f32-fma-256", "f32-fma-512", "bf16-dot-512", "amx-bf16". f32 weights run on
// GemmInstructionKind(ExactIsaFor(isa)).
const char* GemmInstructionKind(CpuIsa isa);

// Runs all tasks (batch-invariant, as above) in one parallel region on variant `isa` (resolved,
// not kAuto).
void RunGemms(ThreadPool& pool, std::span<const GemmTask> tasks, CpuIsa isa);

// OpenBLAS sgemm on fp32 copies of 64-row blocks of w (one per thread at a time): faster for
// large m than it used to be relative to our kernel, but a row's result depends on m.
void BlasGemm(ThreadPool& pool, const GemmTask& task);

}  // namespace moeserve::cpu_fast
