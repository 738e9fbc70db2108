// The CPU fast path's GEMM: y = x @ w^T for fp32 activations and fp32 or bf16 weights, in
// either weight layout (kernels/weight_layout.h), on AVX2 + FMA registers (a portable loop
// elsewhere, same arithmetic).
//
// Exact and batch-invariant: every output element is the same sequence of fp32 operations
// whatever m, the batch mates, the layout, the thread count or the kernel shape that computed
// it: lane l (0..7) accumulates columns c = l, l + 8, l + 16, ... in order with fused
// multiply-adds (a last partial chunk padded with zeros), then the 8 lanes are summed in one
// fixed tree. bf16 weights widen to fp32 exactly.
//
// Small m (decode) streams each 8-row tile of w once, 8 rows' dot products at a time, with
// software prefetch ahead of the stream: bandwidth-bound. Large m widens a tile to fp32 once and
// runs a 2 x 4 register-blocked kernel over it: compute-bound. Several GEMMs (the experts of a
// MoE layer) run in one parallel region, so that both cores work when a step hits few experts.
#pragma once

#include <span>

#include "core/thread_pool.h"
#include "kernels/backend.h"

namespace moeserve::cpu_fast {

struct GemmTask {
  const float* x = nullptr;  // [m, w.cols]
  int64_t m = 0;
  WeightRef w;
  float* y = nullptr;       // [m, w.rows]
  bool accumulate = false;  // y += x @ w^T
};

// The instruction kind the kernels' inner loop issues, as `moeserve calibrate` names its peaks:
// "f32-fma-256" (AVX2 + FMA), or "f32-scalar" in a build without them.
const char* GemmInstructionKind();

// Runs all tasks (batch-invariant, as above) in one parallel region.
void RunGemms(ThreadPool& pool, std::span<const GemmTask> tasks);

// OpenBLAS sgemm on fp32 copies of 64-row blocks of w (one per thread at a time): faster for
// large m than it used to be relative to our kernel, but a row's result depends on m.
void BlasGemm(ThreadPool& pool, const GemmTask& task);

}  // namespace moeserve::cpu_fast
