// What kernels_bench's files share (kernels_bench.cc defines them): the backend every benchmark
// runs on and the counters each reports.
#pragma once

#include <benchmark/benchmark.h>

#include "core/dtype.h"
#include "kernels/backend.h"

namespace moeserve::bench {

// The CPU backend, one pool for the whole run; MOESERVE_CPU_ISA=avx2|avx512|avx512-bf16|amx picks
// the kernel variant (default: the fastest).
Backend& TheBackend();

// GFLOP/s and GB/s of an iteration's `flops` and `bytes`, and with MOESERVE_HARDWARE=profile.json
// its fraction of that profile's roofline.
void Report(benchmark::State& state, double flops, double bytes, DType dtype);

}  // namespace moeserve::bench
