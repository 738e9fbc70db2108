// Register-resident FMA loops per instruction kind. Each function is compiled for its own
// instruction set (target attributes) and only called where the CPU reports it.
#include "tools/calibrate/peak_flops.h"

#include <immintrin.h>

#include <atomic>
#include <thread>

#include "core/clock.h"

namespace moeserve::calibrate {
namespace {

// Tells the compiler the accumulators are used, so that it neither merges the chains nor drops
// or reorders iterations (distinct starting values keep them distinct computations too).
template <typename V>
inline void KeepOne(V& v) {
  __asm__ volatile("" : "+x"(v));
}
template <typename... V>
inline void Keep(V&... v) {
  (KeepOne(v), ...);
}

// 12 independent accumulators hide the FMA latency (4-5 cycles) at two issues per cycle.
__attribute__((target("avx2,fma"))) double Fma256(int64_t iters) {
  __m256 a0 = _mm256_set1_ps(0.10f), a1 = _mm256_set1_ps(0.11f), a2 = _mm256_set1_ps(0.12f),
         a3 = _mm256_set1_ps(0.13f), a4 = _mm256_set1_ps(0.14f), a5 = _mm256_set1_ps(0.15f),
         a6 = _mm256_set1_ps(0.16f), a7 = _mm256_set1_ps(0.17f), a8 = _mm256_set1_ps(0.18f),
         a9 = _mm256_set1_ps(0.19f), a10 = _mm256_set1_ps(0.20f), a11 = _mm256_set1_ps(0.21f);
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, b, c);
    a1 = _mm256_fmadd_ps(a1, b, c);
    a2 = _mm256_fmadd_ps(a2, b, c);
    a3 = _mm256_fmadd_ps(a3, b, c);
    a4 = _mm256_fmadd_ps(a4, b, c);
    a5 = _mm256_fmadd_ps(a5, b, c);
    a6 = _mm256_fmadd_ps(a6, b, c);
    a7 = _mm256_fmadd_ps(a7, b, c);
    a8 = _mm256_fmadd_ps(a8, b, c);
    a9 = _mm256_fmadd_ps(a9, b, c);
    a10 = _mm256_fmadd_ps(a10, b, c);
    a11 = _mm256_fmadd_ps(a11, b, c);
    Keep(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
  }
  const __m256 s =
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                    _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                  _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}
constexpr double kFma256Flops = 12 * 8 * 2;

__attribute__((target("avx512f"))) double Fma512(int64_t iters) {
  __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f),
         a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f),
         a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f),
         a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, b, c);
    a1 = _mm512_fmadd_ps(a1, b, c);
    a2 = _mm512_fmadd_ps(a2, b, c);
    a3 = _mm512_fmadd_ps(a3, b, c);
    a4 = _mm512_fmadd_ps(a4, b, c);
    a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c);
    a7 = _mm512_fmadd_ps(a7, b, c);
    a8 = _mm512_fmadd_ps(a8, b, c);
    a9 = _mm512_fmadd_ps(a9, b, c);
    a10 = _mm512_fmadd_ps(a10, b, c);
    a11 = _mm512_fmadd_ps(a11, b, c);
    Keep(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
  }
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                  _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  return _mm512_reduce_add_ps(s);
}
constexpr double kFma512Flops = 12 * 16 * 2;

// vdpbf16ps: 16 lanes, each adds two bf16 products: 64 FLOP per instruction.
__attribute__((target("avx512f,avx512bf16"))) double Bf16Dot512(int64_t iters) {
  __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f),
         a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f),
         a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f),
         a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3800);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_dpbf16_ps(a0, b, c);
    a1 = _mm512_dpbf16_ps(a1, b, c);
    a2 = _mm512_dpbf16_ps(a2, b, c);
    a3 = _mm512_dpbf16_ps(a3, b, c);
    a4 = _mm512_dpbf16_ps(a4, b, c);
    a5 = _mm512_dpbf16_ps(a5, b, c);
    a6 = _mm512_dpbf16_ps(a6, b, c);
    a7 = _mm512_dpbf16_ps(a7, b, c);
    a8 = _mm512_dpbf16_ps(a8, b, c);
    a9 = _mm512_dpbf16_ps(a9, b, c);
    a10 = _mm512_dpbf16_ps(a10, b, c);
    a11 = _mm512_dpbf16_ps(a11, b, c);
    Keep(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
  }
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                  _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  return _mm512_reduce_add_ps(s);
}
constexpr double kBf16Dot512Flops = 12 * 16 * 4;

// Runs `loop` on every thread at once for about `seconds` (iterations sized by a trial run).
double Rate(double (*loop)(int64_t), double flops_per_iter, int threads, double seconds) {
  int64_t iters = 1 << 16;
  for (;;) {  // grow until one thread's run takes a tenth of the budget
    Stopwatch sw;
    volatile double sink = loop(iters);
    (void)sink;
    if (sw.Seconds() > seconds / 10 || iters > (int64_t{1} << 40)) break;
    iters *= 4;
  }
  iters = static_cast<int64_t>(static_cast<double>(iters) * 5);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> elapsed(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      Stopwatch sw;
      volatile double sink = loop(iters);
      (void)sink;
      elapsed[static_cast<size_t>(t)] = sw.Seconds();
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true);
  for (auto& th : pool) th.join();
  double total = 0;
  for (double e : elapsed) total += flops_per_iter * static_cast<double>(iters) / e;
  return total;
}

}  // namespace

std::vector<PeakFlops> MeasurePeakFlops(int threads, double seconds) {
  std::vector<PeakFlops> out;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out.push_back({"f32-fma-256", Rate(Fma256, kFma256Flops, threads, seconds)});
  }
  if (__builtin_cpu_supports("avx512f")) {
    out.push_back({"f32-fma-512", Rate(Fma512, kFma512Flops, threads, seconds)});
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    out.push_back({"bf16-dot-512", Rate(Bf16Dot512, kBf16Dot512Flops, threads, seconds)});
  }
  return out;
}

}  // namespace moeserve::calibrate
