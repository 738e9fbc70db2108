// Google Benchmark micro-benchmarks of the CPU backend's hot kernels: the GEMM with bf16, f32
// and FP8 weights (GB/s of weights, GFLOP/s) and the expert gather here, paged attention in
// attention_bench.cc. With MOESERVE_HARDWARE=profile.json (from `moeserve calibrate`), each also reports its
// fraction of the profile's roofline, max(FLOPs / peak, bytes / bandwidth) over the measured
// time (printed with a "/s" suffix: it is bound-seconds per second; 1 is at the roofline).
//
//   build/benchmarks/kernels_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "benchmarks/kernels_bench.h"
#include "core/dtype.h"
#include "core/file_util.h"
#include "core/host_buffer.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/weight_layout.h"
#include "roofline/hardware.h"

namespace moeserve {
namespace bench {

Backend& TheBackend() {
  static CpuBackend* backend = [] {  // one pool for the whole run
    CpuBackendOptions o;
    if (const char* isa = std::getenv("MOESERVE_CPU_ISA")) o.isa = ParseCpuIsa(isa).value_or(CpuIsa::kAuto);
    return new CpuBackend(o);
  }();
  return *backend;
}

namespace {
const std::optional<roofline::HardwareProfile>& Profile() {
  static const std::optional<roofline::HardwareProfile> profile = []() -> std::optional<roofline::HardwareProfile> {
    const char* path = std::getenv("MOESERVE_HARDWARE");
    if (path == nullptr) return std::nullopt;
    auto p = roofline::LoadHardware(path);
    return p.ok() ? std::optional<roofline::HardwareProfile>(*p) : std::nullopt;
  }();
  return profile;
}

}  // namespace

void Report(benchmark::State& state, double flops, double bytes, DType dtype) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(bytes * iters / 1e9, benchmark::Counter::kIsRate);
  if (const auto& hw = Profile()) {
    // Bound per iteration over measured time per iteration: 1 means at the roofline.
    const double bound = std::max(flops / hw->PeakFlops(dtype == DType::kF32 ? "f32" : "bf16"), bytes / hw->mem_bandwidth);
    state.counters["roofline_fraction"] =
        benchmark::Counter(bound * iters, benchmark::Counter::kIsRate);  // bound seconds per second
  }
}

}  // namespace bench

namespace {

using bench::Report;
using bench::TheBackend;

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dtype = state.range(3) ? DType::kBF16 : DType::kF32;
  // tiled: 1 is the layout the backend stores weights of this dtype in (kTiled8, or kAmxTiles for
  // bf16 on the amx variant), 0 row-major, 2 kTiled8 whatever the backend prefers.
  const WeightLayout layout = state.range(4) == 2 ? WeightLayout::kTiled8
                              : state.range(4)    ? TheBackend().PreferredWeightLayout(dtype)
                                                  : WeightLayout::kRowMajor;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> wf(static_cast<size_t>(n * k)), x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (float& v : wf) v = u(gen);
  for (float& v : x) v = u(gen);
  std::vector<uint8_t> row_major(wf.size() * DTypeSize(dtype));
  ConvertFromF32(wf.data(), wf.size(), dtype, row_major.data());
  // 64-byte aligned, as the engine's weights are (a tile row across two cache lines costs two loads).
  const HostBuffer w = HostBuffer::Plain(static_cast<size_t>(WeightStorageElems(layout, n, k)) * DTypeSize(dtype));
  PackWeight(layout, row_major.data(), n, k, DTypeSize(dtype), w.data());
  const WeightRef ref{w.data(), dtype, n, k, layout};
  for (auto _ : state) {
    TheBackend().Gemm(x.data(), m, ref, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  Report(state, 2.0 * m * n * k, static_cast<double>(row_major.size()), dtype);
}
// Decode shapes of the small preset's experts (w13: 2048 x 512, w2: 512 x 1024) and a weight
// matrix far larger than the last-level cache.
BENCHMARK(BM_Gemm)
    ->ArgNames({"m", "n", "k", "bf16", "tiled"})
    ->Args({1, 2048, 512, 1, 1})
    ->Args({8, 2048, 512, 1, 1})
    ->Args({16, 2048, 512, 1, 1})
    ->Args({32, 2048, 512, 1, 1})
    ->Args({64, 2048, 512, 1, 1})
    ->Args({64, 2048, 512, 1, 0})
    ->Args({1, 8192, 4096, 1, 1})
    ->Args({1, 16384, 8192, 1, 1})
    ->Args({16, 8192, 4096, 1, 1})
    ->Args({256, 2048, 512, 1, 1})
    ->Args({256, 2048, 512, 1, 2})
    ->Args({512, 2048, 512, 1, 1})   // a 2000-token prefill's expert (small preset, 8 experts top-2)
    ->Args({2048, 768, 512, 1, 1})   // and its qkv projection
    ->Args({256, 1024, 2048, 1, 1})
    ->Args({256, 1024, 2048, 1, 2})
    ->Args({1, 8192, 4096, 0, 1})
    ->Args({256, 2048, 512, 0, 1})
    ->UseRealTime();

// The same GEMM with its weights cold, as in a decode step: each iteration takes the next of
// enough matrices to fill 512 MiB, so every weight byte comes from DRAM, not from the caches.
void BM_GemmColdWeights(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dtype = DType::kBF16;
  const WeightLayout layout = state.range(3) ? TheBackend().PreferredWeightLayout(dtype) : WeightLayout::kRowMajor;
  const size_t bytes = static_cast<size_t>(WeightStorageElems(layout, n, k)) * DTypeSize(dtype);
  const size_t count = std::max<size_t>(2, (size_t{512} << 20) / bytes);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (float& v : x) v = u(gen);
  // Google Benchmark calls this several times per shape: fill the 512 MiB once per shape.
  static std::map<std::tuple<int64_t, int64_t, WeightLayout>, HostBuffer> cache;
  HostBuffer& w = cache[{n, k, layout}];
  if (w.empty()) {
    std::vector<float> wf(static_cast<size_t>(n * k));
    for (float& v : wf) v = u(gen);
    std::vector<uint8_t> row_major(static_cast<size_t>(n * k) * DTypeSize(dtype));
    ConvertFromF32(wf.data(), wf.size(), dtype, row_major.data());
    w = HostBuffer::Plain(bytes * count);
    for (size_t i = 0; i < count; ++i) PackWeight(layout, row_major.data(), n, k, DTypeSize(dtype), w.data() + i * bytes);
  }
  size_t next = 0;
  for (auto _ : state) {
    const WeightRef ref{w.data() + next * bytes, dtype, n, k, layout};
    TheBackend().Gemm(x.data(), m, ref, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % count;
  }
  Report(state, 2.0 * m * n * k, static_cast<double>(bytes), dtype);
}
// FP8 weights (row-major bytes and a scale per row and 128 columns), cold as above; compare
// with BM_GemmColdWeights at the same shape: half the bytes of bf16.
void BM_GemmFp8ColdWeights(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int64_t groups = (k + kFp8ScaleCols - 1) / kFp8ScaleCols;
  const size_t bytes = static_cast<size_t>(n * k), scale_bytes = static_cast<size_t>(n * groups) * sizeof(float);
  const size_t count = std::max<size_t>(2, (size_t{512} << 20) / bytes);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (float& v : x) v = u(gen);
  static std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<uint8_t>, std::vector<float>>> cache;
  auto& [w, scales] = cache[{n, k}];
  if (w.empty()) {
    w.resize(bytes * count);
    for (uint8_t& b : w) b = F32ToF8E4M3(u(gen) * 400.0f);
    scales.assign(static_cast<size_t>(n * groups) * count, 1e-3f);
  }
  size_t next = 0;
  for (auto _ : state) {
    const WeightRef ref{w.data() + next * bytes, DType::kF8E4M3, n, k, WeightLayout::kRowMajor,
                        scales.data() + next * n * groups};
    TheBackend().Gemm(x.data(), m, ref, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % count;
  }
  Report(state, 2.0 * m * n * k, static_cast<double>(bytes + scale_bytes), DType::kBF16);
}
BENCHMARK(BM_GemmFp8ColdWeights)
    ->ArgNames({"m", "n", "k"})
    ->Args({1, 2048, 512})
    ->Args({1, 4096, 1024})
    ->Args({1, 16384, 8192})
    ->Args({4, 4096, 1024})
    ->Args({16, 4096, 1024})
    ->UseRealTime();

BENCHMARK(BM_GemmColdWeights)
    ->ArgNames({"m", "n", "k", "tiled"})
    ->Args({1, 2048, 512, 1})
    ->Args({1, 2048, 512, 0})
    ->Args({1, 512, 1024, 1})
    ->Args({4, 2048, 512, 1})
    ->Args({1, 4096, 1024, 1})
    ->Args({1, 16384, 8192, 1})
    ->UseRealTime();

// The expert dispatch's gather: `rows` token rows of `dim` floats copied in a random order (a
// 2000-token prefill of `small` routes 4000 rows of 512; a decode step at batch 64, 128).
void BM_GatherRows(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1), tokens = rows / 2;
  std::vector<float> x(static_cast<size_t>(tokens * dim), 1.0f), out(static_cast<size_t>(rows * dim));
  std::vector<int32_t> src(static_cast<size_t>(rows));
  std::mt19937 gen(1);
  for (auto& r : src) r = static_cast<int32_t>(gen() % tokens);
  for (auto _ : state) {
    TheBackend().GatherRows(x.data(), src.data(), rows, dim, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, 0, 2.0 * rows * dim * sizeof(float), DType::kF32);  // read and written
}
BENCHMARK(BM_GatherRows)->ArgNames({"rows", "dim"})->Args({4000, 512})->Args({128, 512})->UseRealTime();

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
