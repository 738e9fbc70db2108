// Register-resident loops per instruction kind. Each loop is compiled for its own instruction
// set (target attributes) and only called where cpu_isa.h reports it.
#include "tools/calibrate/peak_flops.h"

#include <immintrin.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "core/clock.h"
#include "kernels/cpu/cpu_isa.h"
#include "tools/calibrate/pinned.h"

namespace moeserve::calibrate {
namespace {

// Tells the compiler the accumulators are used, so that it neither merges the chains nor drops
// or reorders iterations (distinct starting values keep them distinct computations too).
#define MS_KEEP(v) __asm__ volatile("" : "+v"(v))

// 12 independent accumulators hide the latency (4-6 cycles) at two issues per cycle.
#define MS_PEAK_LOOP(NAME, TARGET, VEC, INIT, STEP)                                       \
  __attribute__((target(TARGET))) void NAME(int64_t iters) {                                \
    VEC a0 = INIT(0.10f), a1 = INIT(0.11f), a2 = INIT(0.12f), a3 = INIT(0.13f);           \
    VEC a4 = INIT(0.14f), a5 = INIT(0.15f), a6 = INIT(0.16f), a7 = INIT(0.17f);           \
    VEC a8 = INIT(0.18f), a9 = INIT(0.19f), a10 = INIT(0.20f), a11 = INIT(0.21f);         \
    for (int64_t i = 0; i < iters; ++i) {                                                   \
      a0 = STEP(a0); a1 = STEP(a1); a2 = STEP(a2); a3 = STEP(a3);                           \
      a4 = STEP(a4); a5 = STEP(a5); a6 = STEP(a6); a7 = STEP(a7);                           \
      a8 = STEP(a8); a9 = STEP(a9); a10 = STEP(a10); a11 = STEP(a11);                       \
      MS_KEEP(a0); MS_KEEP(a1); MS_KEEP(a2); MS_KEEP(a3); MS_KEEP(a4); MS_KEEP(a5);         \
      MS_KEEP(a6); MS_KEEP(a7); MS_KEEP(a8); MS_KEEP(a9); MS_KEEP(a10); MS_KEEP(a11);       \
    }                                                                                       \
  }

// a = a * 0.999 + 1e-4 stays bounded; the bf16 dots add 1.0 * 2^-15 pairs (no denormals).
#define MS_F32_256(x) _mm256_set1_ps(x)
#define MS_FMA_256(a) _mm256_fmadd_ps(a, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-4f))
MS_PEAK_LOOP(Fma256, "avx2,fma", __m256, MS_F32_256, MS_FMA_256)

#define MS_F32_512(x) _mm512_set1_ps(x)
#define MS_FMA_512(a) _mm512_fmadd_ps(a, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-4f))
MS_PEAK_LOOP(Fma512, "avx512f", __m512, MS_F32_512, MS_FMA_512)

#define MS_DOT_256(a) \
  _mm256_dpbf16_ps(a, (__m256bh)_mm256_set1_epi16(0x3f80), (__m256bh)_mm256_set1_epi16(0x3800))
MS_PEAK_LOOP(Bf16Dot256, "avx512f,avx512vl,avx512bf16", __m256, MS_F32_256, MS_DOT_256)

#define MS_DOT_512(a) \
  _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi16(0x3f80), (__m512bh)_mm512_set1_epi16(0x3800))
MS_PEAK_LOOP(Bf16Dot512, "avx512f,avx512bf16", __m512, MS_F32_512, MS_DOT_512)

#define MS_F16_512(x) _mm512_set1_ph(static_cast<_Float16>(x))
#define MS_FMA_PH(a) \
  _mm512_fmadd_ph(a, _mm512_set1_ph(static_cast<_Float16>(0.999f)), _mm512_set1_ph(static_cast<_Float16>(1e-4f)))
MS_PEAK_LOOP(F16Fma512, "avx512f,avx512fp16", __m512h, MS_F16_512, MS_FMA_PH)

// AMX: 4 accumulator tiles (16 x 16 fp32) fed by 2 A tiles and 2 B tiles (16 x 32 bf16) held in
// tile registers; each tdpbf16ps is 16 x 16 x 32 multiply-adds. Raw asm, so that the whole tile
// configuration is visibly an input of ldtilecfg.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) void AmxBf16(int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  alignas(64) uint16_t ab[16 * 32];
  for (uint16_t& v : ab) v = 0x3a80;  // 2^-10
  alignas(64) float c[16 * 16];
  const long stride = 64;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);
  __asm__ volatile(
      "tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
      "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7" ::"r"(ab),
      "r"(stride)
      : "memory");
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
  __asm__ volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(c), "r"(stride) : "memory");
  __asm__ volatile("tilerelease" ::);
  volatile float sink = c[0];
  (void)sink;
}

struct Kind {
  const char* name;
  void (*loop)(int64_t);
  double flops_per_instruction;
  double instructions_per_iter;
  CpuIsa needs;          // the cpu_isa.h level that implies it (kAuto: checked below)
  const char* flag;      // cpuid flag named when it is missing
};

// Median over `samples` runs on every pinned core of Σ per-thread FLOP/s, iterations sized so a
// run takes about `seconds`.
PeakFlops Measure(const Kind& k, int threads, double seconds, int samples) {
  const double flops_per_iter = k.flops_per_instruction * k.instructions_per_iter;
  int64_t iters = 1 << 12;
  for (;;) {  // warm-up, growing until one run takes a tenth of the budget
    Stopwatch sw;
    k.loop(iters);
    if (sw.Seconds() > seconds / 10 || iters > (int64_t{1} << 40)) break;
    iters *= 4;
  }
  iters *= 10;
  // One unrecorded run on every pinned core first: clocks settle (AVX-512 licences, turbo)
  // before the samples.
  RunPinned(threads, [&](int) { k.loop(iters); });
  Samples s;
  for (int r = 0; r < samples; ++r) {
    double total = 0;
    for (double e : RunPinned(threads, [&](int) { k.loop(iters); })) total += flops_per_iter * static_cast<double>(iters) / e;
    s.values.push_back(total);
  }
  return PeakFlops{k.name, k.flops_per_instruction, s.Median(), s.Spread()};
}

// Runs Measure in a child process and returns its result; a fault there (an instruction the
// kernel or CPU refuses) comes back as missing, not as the end of calibrate.
bool MeasureInChild(const Kind& k, int threads, double seconds, int samples, PeakFlops* out, std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) {
    *why = "pipe failed";
    return false;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata);  // per process: ask again
    const PeakFlops p = Measure(k, threads, seconds, samples);
    const double v[2] = {p.flops_per_second, p.spread};
    const ssize_t w = write(fds[1], v, sizeof(v));
    _exit(w == sizeof(v) ? 0 : 1);
  }
  close(fds[1]);
  double v[2] = {0, 0};
  ssize_t got = 0;
  pollfd pfd{fds[0], POLLIN, 0};
  if (pid > 0 && poll(&pfd, 1, static_cast<int>(1000 * (60 + seconds * samples * 20))) > 0) {
    got = read(fds[0], v, sizeof(v));
  }
  close(fds[0]);
  int status = 0;
  if (pid > 0) {
    if (got != sizeof(v)) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  if (got != sizeof(v)) {
    *why = pid < 0 ? "fork failed"
           : WIFSIGNALED(status) ? std::string("the loop died with signal ") + strsignal(WTERMSIG(status))
                                 : "the loop gave no result";
    return false;
  }
  *out = PeakFlops{k.name, k.flops_per_instruction, v[0], v[1]};
  return true;
}

}  // namespace

const PeakFlops* PeakReport::Find(const std::string& kind) const {
  for (const PeakFlops& p : peaks) {
    if (p.kind == kind) return &p;
  }
  return nullptr;
}

const PeakFlops* PeakReport::Best() const {
  const PeakFlops* best = nullptr;
  for (const PeakFlops& p : peaks) {
    if (best == nullptr || p.flops_per_second > best->flops_per_second) best = &p;
  }
  return best;
}

PeakReport MeasurePeakFlops(int threads, double seconds, int samples) {
  const CpuFeatures& f = DetectCpuFeatures();
  const Kind kinds[] = {
      {"f32-fma-256", Fma256, 16, 12, CpuIsa::kAvx2, "avx2/fma"},
      {"f32-fma-512", Fma512, 32, 12, CpuIsa::kAvx512, "avx512f"},
      {"bf16-dot-256", Bf16Dot256, 32, 12, CpuIsa::kAvx512Bf16, "avx512_bf16"},
      {"bf16-dot-512", Bf16Dot512, 64, 12, CpuIsa::kAvx512Bf16, "avx512_bf16"},
      {"f16-fma-512", F16Fma512, 64, 12, CpuIsa::kAuto, "avx512_fp16"},
      {"amx-bf16", AmxBf16, 2.0 * 16 * 16 * 32, 4, CpuIsa::kAmx, "amx_tile/amx_bf16"},
  };
  PeakReport r;
  for (const Kind& k : kinds) {
    std::string missing;
    const bool has = k.needs == CpuIsa::kAuto ? f.avx512_fp16 : CpuSupports(f, k.needs, &missing);
    if (!has) {
      r.skipped.push_back({k.name, missing.empty() ? std::string("cpuid flag ") + k.flag : missing});
      continue;
    }
    if (k.needs != CpuIsa::kAmx) {
      r.peaks.push_back(Measure(k, threads, seconds, samples));
      continue;
    }
    PeakFlops p;
    std::string why;
    if (MeasureInChild(k, threads, seconds, samples, &p, &why)) {
      r.peaks.push_back(p);
    } else {
      r.skipped.push_back({k.name, why});
    }
  }
  return r;
}

}  // namespace moeserve::calibrate
