// Kernel variant self-checks and the choice among them.
#include "kernels/cpu/kernel_select.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention_self_check.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/weight_layout.h"

namespace moeserve {
namespace {

constexpr CpuIsa kAllVariants[] = {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

struct Shape {
  int64_t m, n, k;
};

// A random weight of `dtype` as stored in `layout`, and the values it holds. FP8: random codes
// (no NaN) and a random scale per row and 128 columns, row-major, as checkpoints carry them.
struct CheckWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> scales, values;  // values: [n, k] row-major, what the weight means
  WeightRef ref;
};

CheckWeight MakeCheckWeight(const Shape& s, DType dtype, WeightLayout layout, std::mt19937& gen) {
  CheckWeight w;
  w.values.resize(static_cast<size_t>(s.n * s.k));
  std::vector<uint8_t> row_major(w.values.size() * DTypeSize(dtype));
  if (dtype == DType::kF8E4M3) {
    const int64_t groups = (s.k + kFp8ScaleCols - 1) / kFp8ScaleCols;
    std::uniform_real_distribution<float> scale(1e-3f, 4e-3f);
    w.scales.resize(static_cast<size_t>(s.n * groups));
    for (float& x : w.scales) x = scale(gen);
    for (auto& b : row_major) {
      do b = static_cast<uint8_t>(gen()); while ((b & 0x7f) == 0x7f);
    }
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t c = 0; c < s.k; ++c) {
        w.values[j * s.k + c] = F8E4M3ToF32(row_major[j * s.k + c]) * w.scales[j * groups + c / kFp8ScaleCols];
      }
    }
  } else {
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& v : w.values) v = u(gen);
    ConvertFromF32(w.values.data(), w.values.size(), dtype, row_major.data());
    ConvertToF32(row_major.data(), dtype, w.values.size(), w.values.data());  // the weights as stored
  }
  w.bytes.resize(static_cast<size_t>(WeightStorageElems(layout, s.n, s.k)) * DTypeSize(dtype));
  PackWeight(layout, row_major.data(), s.n, s.k, DTypeSize(dtype), w.bytes.data());
  w.ref = WeightRef{w.bytes.data(), dtype, s.n, s.k, layout, w.scales.empty() ? nullptr : w.scales.data()};
  return w;
}

// y = x w^T for m rows of x, as the variant computes it.
using GemmRun = std::function<void(const float* x, int64_t m, const WeightRef& w, float* y)>;

// One GEMM of `isa` (run by `run`) against float64 on fresh random inputs, and each row again
// alone; returns an empty string when both hold, else what failed.
std::string CheckShape(CpuIsa isa, const Shape& s, const CheckWeight& w, const GemmRun& run, std::mt19937& gen,
                       double* worst) {
  std::uniform_real_distribution<float> u(-1, 1);
  const DType dtype = w.ref.dtype;
  std::vector<float> x(static_cast<size_t>(s.m * s.k));
  for (float& v : x) v = u(gen);
  std::vector<float> y(static_cast<size_t>(s.m * s.n)), alone(static_cast<size_t>(s.n));
  run(x.data(), s.m, w.ref, y.data());
  // The arithmetic the variant states: bf16 activations where it rounds them (all but f32 weights).
  std::vector<float> xe = x;
  if (RoundsActivations(isa) && dtype != DType::kF32) {
    for (float& v : xe) v = Bf16ToF32(F32ToBf16(v));
  }
  // fp32 accumulation of k products (exact, or rounded once: f32 weights), the lane tree and,
  // for FP8, a scaling per 128 columns: |error| <= (k + 2 groups + 16) u sum|x w|.
  const double terms = static_cast<double>(s.k + 2 * ((s.k + kFp8ScaleCols - 1) / kFp8ScaleCols) + 16);
  for (int64_t i = 0; i < s.m; ++i) {
    run(x.data() + i * s.k, 1, w.ref, alone.data());
    for (int64_t j = 0; j < s.n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < s.k; ++c) {
        const double p = static_cast<double>(xe[i * s.k + c]) * w.values[j * s.k + c];
        ref += p;
        mag += std::abs(p);
      }
      const double got = y[i * s.n + j];
      const double bound = terms * std::ldexp(1.0, -24) * mag + 1e-30;
      *worst = std::max(*worst, std::abs(got - ref) / bound);
      if (!(std::abs(got - ref) <= bound)) {
        return absl::StrFormat("%s weights %dx%dx%d row %d col %d: %.9g vs float64 %.9g (|error| %.3g > bound %.3g)",
                               DTypeShortName(dtype), s.m, s.n, s.k, i, j, got, ref, std::abs(got - ref), bound);
      }
      if (std::memcmp(&alone[static_cast<size_t>(j)], &y[static_cast<size_t>(i * s.n + j)], sizeof(float)) != 0) {
        return absl::StrFormat("%s weights %dx%dx%d row %d col %d: %.9g in the batch, %.9g alone (not batch-invariant)",
                               DTypeShortName(dtype), s.m, s.n, s.k, i, j, y[i * s.n + j], alone[j]);
      }
    }
  }
  return "";
}

// A variant's fused gate/up GEMM and SiLU (GemmTask::swiglu; amx, avx512-bf16) against its GEMM
// then SiluMul on fresh random inputs, bit for bit, written as fp32 and (where PacksSwiGluOutput)
// as the next GEMM's packed bf16 rows (GemmTask::y_packed, against PackActivations); an empty
// string when they agree.
std::string CheckFusedSwiGlu(CpuIsa isa, ThreadPool& pool, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1, 1);
  constexpr int64_t kK = 72;
  const WeightLayout layout = IsAmx(isa) ? WeightLayout::kAmxTiles : WeightLayout::kTiled8;
  for (const int64_t inter : {48, 64}) {  // 48: amx's up tiles start half way into a 32-row group
    std::vector<float> wf(static_cast<size_t>(2 * inter * kK));
    for (float& v : wf) v = u(gen);
    std::vector<uint8_t> wrow(wf.size() * 2), packed(static_cast<size_t>(WeightStorageElems(layout, 2 * inter, kK)) * 2);
    ConvertFromF32(wf.data(), wf.size(), DType::kBF16, wrow.data());
    PackWeight(layout, wrow.data(), 2 * inter, kK, 2, packed.data());
    const WeightRef w{packed.data(), DType::kBF16, 2 * inter, kK, layout};
    for (int64_t m : {5, 70}) {
      std::vector<float> x(static_cast<size_t>(m * kK)), gate_up(static_cast<size_t>(m * 2 * inter));
      for (float& v : x) v = 4 * u(gen);
      std::vector<float> want(static_cast<size_t>(m * inter)), got(want.size());
      const cpu_fast::GemmTask plain{x.data(), m, w, gate_up.data(), false};
      cpu_fast::RunGemms(pool, std::span(&plain, 1), isa);
      for (int64_t r = 0; r < m; ++r) {
        cpu_fast::SiluMulRow(&gate_up[r * 2 * inter], &gate_up[r * 2 * inter + inter], inter, &want[r * inter]);
      }
      cpu_fast::GemmTask fused{x.data(), m, w, got.data(), false};
      fused.swiglu = inter;
      cpu_fast::RunGemms(pool, std::span(&fused, 1), isa);
      for (size_t e = 0; e < got.size(); ++e) {
        if (std::memcmp(&got[e], &want[e], sizeof(float)) != 0) {
          return absl::StrFormat("fused gate/up and SiLU, %d rows: row %d col %d %.9g, unfused %.9g", m,
                                 e / inter, e % inter, got[e], want[e]);
        }
      }
      if (!cpu_fast::PacksSwiGluOutput(isa, inter)) continue;
      const size_t elems = static_cast<size_t>(cpu_fast::PackedActivationElems(isa, m, inter));
      std::vector<uint16_t> want_tiles(elems), got_tiles(elems, 0x7fc1);
      cpu_fast::PackActivations(isa, want.data(), m, inter, 0, cpu_fast::PackedRows(isa, m), want_tiles.data());
      fused.y = nullptr;
      fused.y_packed = got_tiles.data();
      cpu_fast::RunGemms(pool, std::span(&fused, 1), isa);
      for (size_t e = 0; e < elems; ++e) {
        if (got_tiles[e] != want_tiles[e]) {
          return absl::StrFormat("fused gate/up and SiLU into bf16 tiles, %d rows: element %d 0x%04x, unfused 0x%04x",
                                 m, e, got_tiles[e], want_tiles[e]);
        }
      }
    }
  }
  return "";
}

// The checks themselves, in this process: the GEMMs (bf16, f32 and FP8 weights), the fused
// SwiGLU, and the variant's attention kernels (attention_self_check.h).
VariantCheck CheckHere(CpuIsa isa) {
  VariantCheck v;
  v.isa = isa;
  v.supported = true;
  ThreadPool pool(1);
  std::mt19937 gen(std::random_device{}());
  double worst = 0;
  // Row counts that give an AMX block one short tile, two tiles, and both in one work item; the
  // last has several items of weight rows (a second B tile past the matrix) and x rows past 64.
  const Shape shapes[] = {{1, 13, 37}, {5, 24, 200}, {23, 17, 72}, {40, 20, 64}, {70, 72, 96}};
  const GemmRun gemm = [&](const float* x, int64_t m, const WeightRef& w, float* y) {
    const cpu_fast::GemmTask task{x, m, w, y, false};
    cpu_fast::RunGemms(pool, std::span(&task, 1), isa);
  };
  for (const Shape& s : shapes) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      for (WeightLayout layout : {WeightLayout::kTiled8, WeightLayout::kRowMajor, WeightLayout::kAmxTiles}) {
        // AMX tiles hold bf16 weights for the amx variant only (CpuBackend::PreferredWeightLayout).
        if (layout == WeightLayout::kAmxTiles && (!IsAmx(isa) || dt != DType::kBF16)) continue;
        if (std::string e = CheckShape(isa, s, MakeCheckWeight(s, dt, layout, gen), gemm, gen, &worst); !e.empty()) {
          v.detail = e;
          return v;
        }
      }
    }
  }
  // FP8 weights (row-major, scaled per 128 columns) on the variant's FP8 kernel; widths past 128
  // and 256 take partial scale groups.
  const GemmRun fp8 = [&](const float* x, int64_t m, const WeightRef& w, float* y) {
    cpu_fast::GemmFp8On(isa, pool, x, m, w, y, false);
  };
  for (const Shape& s : {Shape{1, 13, 37}, Shape{5, 24, 203}, Shape{11, 9, 300}}) {
    if (std::string e = CheckShape(isa, s, MakeCheckWeight(s, DType::kF8E4M3, WeightLayout::kRowMajor, gen), fp8,
                                   gen, &worst);
        !e.empty()) {
      v.detail = e;
      return v;
    }
  }
  if (RoundsActivations(isa)) {
    if (std::string e = CheckFusedSwiGlu(isa, pool, gen); !e.empty()) {
      v.detail = e;
      return v;
    }
  }
  // Two threads, so that a long context alone splits into its chunks; one in the amx variant's
  // child process (a child of a threaded process starts no threads; there a context's chunks run
  // in one item).
  ThreadPool attention_pool(isa == CpuIsa::kAmx ? 1 : 2);
  cpu_fast::AttentionCheckErrors attention;
  if (std::string e = cpu_fast::CheckAttentionKernels(isa, attention_pool, gen, &attention); !e.empty()) {
    v.detail = e;
    return v;
  }
  v.passed = true;
  v.detail = absl::StrFormat("largest error %.2f of its bound (GEMMs), %.2f (attention), %.2f (latent attention)",
                             worst, attention.paged, attention.latent);
  return v;
}

// The checks in a child process: a variant that has never run on this kind of CPU (AMX) may
// fault, and must not take the caller with it. The child reports pass/fail and the detail.
VariantCheck CheckInChild(CpuIsa isa) {
  VariantCheck v;
  v.isa = isa;
  v.supported = true;
  int fds[2];
  if (pipe(fds) != 0) {
    v.detail = "pipe failed";
    return v;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const VariantCheck c = CheckHere(isa);
    const std::string msg = std::string(c.passed ? "1" : "0") + c.detail;
    const ssize_t w = write(fds[1], msg.data(), msg.size());
    _exit(w == static_cast<ssize_t>(msg.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  pollfd pfd{fds[0], POLLIN, 0};
  while (pid > 0 && poll(&pfd, 1, 60000) > 0) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  if (pid > 0) {
    if (msg.empty()) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  if (msg.empty()) {
    v.detail = pid < 0 ? "fork failed"
               : WIFSIGNALED(status) ? absl::StrCat("the self-check died with signal ", strsignal(WTERMSIG(status)))
                                     : "the self-check gave no result";
    return v;
  }
  v.passed = msg[0] == '1';
  v.detail = msg.substr(1);
  return v;
}

}  // namespace

VariantCheck SelfCheckVariant(CpuIsa isa) {
  VariantCheck v;
  v.isa = isa;
  v.supported = CpuSupports(DetectCpuFeatures(), isa, &v.missing);
  if (!v.supported) return v;
  return isa == CpuIsa::kAmx ? CheckInChild(isa) : CheckHere(isa);
}

const std::vector<VariantCheck>& CheckedVariants() {
  // Facts about this CPU and binary, fixed for the process: checked once, read-only afterwards.
  static const std::vector<VariantCheck> checks = [] {
    std::vector<VariantCheck> out;
    for (CpuIsa isa : kAllVariants) {
      out.push_back(SelfCheckVariant(isa));
      const VariantCheck& v = out.back();
      if (v.supported && !v.passed) {
        std::fprintf(stderr, "moeserve: warning: CPU kernel variant %s failed its self-check and is not used: %s\n",
                     CpuIsaName(isa), v.detail.c_str());
      }
    }
    return out;
  }();
  return checks;
}

namespace {

// The amx model's check: only where asked for, once a process (a fact about this CPU and binary,
// as CheckedVariants').
const VariantCheck& ModelCheck() {
  static const VariantCheck check = SelfCheckVariant(CpuIsa::kAmxModel);
  return check;
}

// The variant asked for by name, from its check.
absl::StatusOr<CpuIsa> Requested(const VariantCheck& v) {
  if (!v.supported) {
    return absl::InvalidArgumentError(absl::StrCat("--cpu-isa ", CpuIsaName(v.isa), ": this CPU lacks it (", v.missing, ")"));
  }
  if (!v.passed) {
    return absl::FailedPreconditionError(absl::StrCat("--cpu-isa ", CpuIsaName(v.isa), " failed its self-check: ", v.detail));
  }
  return v.isa;
}

}  // namespace

absl::StatusOr<CpuIsa> ChooseCpuIsa(CpuIsa requested, CpuKernelNumerics numerics) {
  if (numerics == CpuKernelNumerics::kExact && RoundsActivations(requested)) {
    return absl::InvalidArgumentError(absl::StrCat("--cpu-isa ", CpuIsaName(requested),
                                                   " rounds activations to bf16; --cpu-kernel exact allows avx2 "
                                                   "or avx512 only"));
  }
  if (requested == CpuIsa::kAmxModel) return Requested(ModelCheck());
  const std::vector<VariantCheck>& checks = CheckedVariants();
  for (const VariantCheck& v : checks) {
    if (v.isa == requested) return Requested(v);
  }
  for (auto it = checks.rbegin(); it != checks.rend(); ++it) {  // fastest first
    if (!it->passed) continue;
    if (numerics == CpuKernelNumerics::kExact && RoundsActivations(it->isa)) continue;
    return it->isa;
  }
  return absl::FailedPreconditionError("no CPU kernel variant passed its self-check (the CPU needs AVX2 and FMA)");
}

std::string DescribeVariants(CpuIsa chosen) {
  std::vector<std::string> parts;
  std::vector<VariantCheck> checks = CheckedVariants();
  if (chosen == CpuIsa::kAmxModel) checks.push_back(ModelCheck());
  for (const VariantCheck& v : checks) {
    parts.push_back(absl::StrCat(CpuIsaName(v.isa), ": ",
                                 !v.supported ? absl::StrCat("not on this CPU (", v.missing, ")")
                                 : v.passed   ? "passed"
                                              : absl::StrCat("FAILED (", v.detail, ")")));
  }
  return absl::StrCat(CpuIsaName(chosen), " (", absl::StrJoin(parts, "; "), ")");
}

}  // namespace moeserve
