// `calibrate`'s profile: runs every measurement (measure.h, peak_flops.h) and assembles the
// hardware profile the roofline uses, with the instruction kind the kernels issue per regime,
// the LLC, and the spread of the samples behind each figure.
#include <unistd.h>

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
#include "tools/calibrate/measure.h"
#include "tools/calibrate/peak_flops.h"

namespace moeserve::calibrate {
namespace {

using Shape = std::tuple<int64_t, int64_t, int64_t>;

// The instruction kinds the kernels issue: GEMMs with bf16 weights, with f32 weights, and
// attention over a bf16 cache (the default): AMX tiles on amx, vdpbf16ps on avx512-bf16, else
// fp32 on 8 lanes (an fp32 cache always is). A GPU backend issues its own (named by the backend).
struct KernelKinds {
  std::string bf16, f32, attention;
};
KernelKinds KindsOf(const Backend* backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(backend);
  if (cpu == nullptr) return {backend->Name(), backend->Name(), backend->Name()};
  const char* attention = cpu->isa() == CpuIsa::kAmxModel ? cpu_fast::GemmInstructionKind(CpuIsa::kAmxModel)
                          : cpu->AmxAttention()            ? "amx-bf16"
                          : cpu->Bf16Attention()           ? "bf16-dot-512"
                                                           : "f32-fma-256";
  return {cpu_fast::GemmInstructionKind(cpu->isa()), cpu_fast::GemmInstructionKind(ExactIsaFor(cpu->isa())), attention};
}

nlohmann::json SamplesJson(const Samples& s) {
  return {{"median", s.Median()}, {"min", s.Min()}, {"max", s.Max()}, {"spread", s.Spread()}, {"samples", s.values}};
}

std::string Percent(double f) { return absl::StrFormat("%.0f%%", 100 * f); }

// Everything calibrate measures, before it becomes a profile.
struct Measured {
  int threads = 0;
  size_t array_bytes = 0;
  Samples triad, read, llc;
  std::vector<std::pair<int, double>> bandwidth_by_threads;  // fewer threads: max(triad, read)
  double llc_bytes = 0;
  PeakReport peaks;
  nlohmann::json gemm = nlohmann::json::array();
  double best_gemm_bf16 = 0, best_gemm_f32 = 0, gemv_stream = 0;
  std::pair<double, double> copy = {0, 0}, disk = {0, 0};
};

// The engine's GEMM shapes, one row (memory-bound) up to many (compute-bound).
std::vector<Shape> GemmShapes(bool quick) {
  return quick ? std::vector<Shape>{{1, 512, 512}, {64, 1024, 1024}}
               : std::vector<Shape>{{1, 16384, 8192}, {16, 2048, 2048},  {64, 2048, 512},   {64, 1024, 1024},
                                    {256, 1024, 1024}, {256, 2048, 512}, {256, 4096, 1024}, {512, 2048, 512}};
}

// The best FLOP/s per weight dtype, and the bandwidth one row streams weights far larger than the
// caches at.
absl::Status MeasureGemms(Backend* backend, const CalibrateSettings& o, double array_mb, int repeats,
                          Progress* progress, int64_t* done, Measured* m) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [rows, n, k] : GemmShapes(o.quick)) {
      ASSIGN_OR_RETURN(GemmPoint p, MeasureGemm(backend, dt, rows, n, k, repeats));
      m->gemm.push_back({{"dtype", p.dtype}, {"m", rows}, {"n", n}, {"k", k}, {"seconds", p.seconds},
                         {"flops_per_second", p.flops_per_second}, {"weight_bytes_per_second", p.bytes_per_second}});
      double& best = dt == DType::kBF16 ? m->best_gemm_bf16 : m->best_gemm_f32;
      best = std::max(best, p.flops_per_second);
      if (rows == 1 && static_cast<double>(n * k) * DTypeSize(dt) > 4 * array_mb * (1 << 20) / 3) {
        m->gemv_stream = std::max(m->gemv_stream, p.bytes_per_second);
      }
      progress->Update(++*done, absl::StrCat("GEMM ", p.dtype, " ", rows, "x", n, "x", k));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Measured> Measure(Backend* backend, const CalibrateSettings& o) {
  // Bandwidth arrays stay far above the LLC even in --quick: a stable median needs whole
  // streams from DRAM; --quick saves on repeats and GEMM shapes instead.
  const double array_mb = o.quick ? std::min(o.array_mb, 128.0) : o.array_mb;
  const double disk_mb = o.quick ? 32 : o.disk_mb;
  const int warmups = 2, samples = o.quick ? 7 : 11, repeats = o.quick ? 3 : 7;
  Measured m;
  m.threads = o.threads > 0 ? o.threads : UsableCpus();
  Progress progress("calibrate", 5 + 2 * static_cast<int64_t>(GemmShapes(o.quick).size()) + (o.disk ? 1 : 0),
                    o.progress);
  int64_t done = 0;
  progress.Update(done, "memory bandwidth");
  m.array_bytes = static_cast<size_t>(array_mb * (1 << 20));
  m.triad = TriadBandwidth(m.array_bytes, m.threads, warmups, samples);
  m.read = ReadBandwidth(3 * m.array_bytes, m.threads, warmups, samples);
  // Fewer threads (1, 2, 4, ...): a rank of a layout that splits the cores streams with its own
  // share of them, at more than its share of the bandwidth when it streams alone.
  for (int t = 1; t < m.threads; t *= 2) {
    const double triad = TriadBandwidth(m.array_bytes, t, 1, 5).Median();
    m.bandwidth_by_threads.push_back({t, std::max(triad, ReadBandwidth(3 * m.array_bytes, t, 1, 5).Median())});
  }
  progress.Update(++done, "last-level cache");
  m.llc_bytes = LastLevelCacheBytes();
  // A quarter of the LLC, read 16 times a sample: resident after the first pass.
  if (m.llc_bytes > 0) m.llc = ReadBandwidth(static_cast<size_t>(m.llc_bytes / 4), m.threads, warmups, samples, 16);
  progress.Update(++done, "peak FLOP/s");
  m.peaks = MeasurePeakFlops(m.threads, o.quick ? 0.05 : 0.3, o.quick ? 5 : 7);
  progress.Update(++done, "GEMM");
  RETURN_IF_ERROR(MeasureGemms(backend, o, array_mb, repeats, &progress, &done, &m));
  ASSIGN_OR_RETURN(m.copy, CopyBandwidth(backend, m.array_bytes, repeats));
  progress.Update(++done, "copies");
  if (o.disk) {
    ASSIGN_OR_RETURN(m.disk, DiskBandwidth(o.disk_dir, static_cast<size_t>(disk_mb * (1 << 20))));
    progress.Update(++done, "disk");
  }
  progress.Finish(++done, "done");
  return m;
}

roofline::HardwareProfile ProfileOf(const Measured& m, const Backend* backend, const KernelKinds& kinds,
                                    const CalibrateSettings& o) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  roofline::HardwareProfile p;
  p.name = absl::StrCat("calibrated-", host);
  p.source = absl::StrCat("calibrated on ", host, " at ", date, " (", backend->Name(), ")");
  // The peak of each regime is the hardware's for the instructions the kernels issue there.
  // Without a register-loop measurement of that kind (a GPU backend), our best GEMM stands in.
  auto peak_of = [&](const std::string& kind, double fallback) {
    const PeakFlops* pk = m.peaks.Find(kind);
    return pk != nullptr ? pk->flops_per_second : fallback;
  };
  p.peak_flops_bf16 = peak_of(kinds.bf16, m.best_gemm_bf16);
  p.peak_flops_f32 = peak_of(kinds.f32, m.best_gemm_f32);
  p.peak_flops_attention = peak_of(kinds.attention, 0);
  // The triad does not count its write-allocate traffic, and one sequential stream per thread
  // has less memory-level parallelism than the GEMM's several weight rows, so either can be
  // beaten by the engine's own weight streaming: the bandwidth is the largest of the three.
  p.mem_bandwidth = std::max({m.triad.Median(), m.read.Median(), m.gemv_stream});
  for (auto [threads, bw] : m.bandwidth_by_threads) p.mem_bandwidth_by_threads.push_back({threads, bw});
  if (!m.bandwidth_by_threads.empty()) p.mem_bandwidth_by_threads.push_back({m.threads, p.mem_bandwidth});
  p.mem_capacity = PhysicalMemoryBytes();
  p.llc_bytes = m.llc_bytes;
  p.llc_bandwidth = m.llc.Median();
  p.host_link_bandwidth = std::min(m.copy.first, m.copy.second);
  p.disk_read_bandwidth = m.disk.first;
  p.disk_write_bandwidth = m.disk.second;
  p.devices = 1;
  p.scale_up_domain = 1;
  p.price_per_hour = o.price_per_hour;
  // How far the figures above can be trusted: the widest spread behind them.
  p.measurement_spread = std::max({m.triad.Spread(), m.read.Spread(), m.llc.Spread()});
  for (const std::string& kind : {kinds.bf16, kinds.f32, kinds.attention}) {
    if (const PeakFlops* pk = m.peaks.Find(kind)) p.measurement_spread = std::max(p.measurement_spread, pk->spread);
  }
  return p;
}

nlohmann::json MeasurementsJson(const Measured& m, const KernelKinds& kinds, const CalibrateSettings& o) {
  nlohmann::json peak_json = nlohmann::json::object(), skipped_json = nlohmann::json::object();
  for (const PeakFlops& pk : m.peaks.peaks) {
    peak_json[pk.kind] = {{"flops_per_second", pk.flops_per_second},
                          {"flops_per_instruction", pk.flops_per_instruction},
                          {"spread", pk.spread}};
  }
  for (const SkippedKind& sk : m.peaks.skipped) skipped_json[sk.kind] = sk.missing;
  const PeakFlops* best = m.peaks.Best();
  return {{"threads", m.threads},
          {"pinned_threads", true},
          {"triad_bytes_per_second", m.triad.Median()},
          {"read_bytes_per_second", m.read.Median()},
          {"triad", SamplesJson(m.triad)},
          {"read", SamplesJson(m.read)},
          {"llc_read", SamplesJson(m.llc)},
          {"gemv_weight_stream_bytes_per_second", o.quick ? nlohmann::json() : nlohmann::json(m.gemv_stream)},
          {"array_bytes", m.array_bytes},
          {"gemm", m.gemm},
          {"peak_flops_by_instruction", peak_json},
          {"skipped_instruction_kinds", skipped_json},
          {"kernel_instruction", {{"bf16_weights", kinds.bf16}, {"f32_weights", kinds.f32}, {"attention", kinds.attention}}},
          {"best_instruction", best != nullptr ? nlohmann::json(best->kind) : nlohmann::json()},
          {"copy_to_device_bytes_per_second", m.copy.first},
          {"copy_to_host_bytes_per_second", m.copy.second},
          {"disk_read_bytes_per_second", m.disk.first},
          {"disk_write_bytes_per_second", m.disk.second}};
}

void PrintSummary(const Measured& m, const roofline::HardwareProfile& p, const KernelKinds& kinds,
                  const CalibrateSettings& o) {
  std::vector<std::string> peak_text, skipped_text;
  for (const PeakFlops& pk : m.peaks.peaks) {
    peak_text.push_back(absl::StrFormat("%s (%g FLOP/instr) %.1f", pk.kind, pk.flops_per_instruction, pk.flops_per_second / 1e9));
  }
  for (const SkippedKind& sk : m.peaks.skipped) skipped_text.push_back(absl::StrCat(sk.kind, " (", sk.missing, ")"));
  const PeakFlops* best = m.peaks.Best();
  std::fprintf(
      stderr,
      "calibrate: read %.2f GB/s (spread %s), triad %.2f GB/s (%s), LLC %.0f MiB at %.1f GB/s (%s), GEMV stream %s\n"
      "  peak GFLOP/s, pinned register loops on %d threads: %s%s\n"
      "  kernels issue %s for bf16 weights (peak %.1f), %s for f32 (%.1f), %s for attention; the best this CPU "
      "does: %s %.1f\n"
      "  best GEMM bf16 %.1f GFLOP/s (%.0f%% of its kind's peak), f32 %.1f (%.0f%%) | copy %.2f/%.2f GB/s | disk "
      "%s | FLOP/byte %.1f | widest spread %s\n",
      m.read.Median() / 1e9, Percent(m.read.Spread()).c_str(), m.triad.Median() / 1e9, Percent(m.triad.Spread()).c_str(),
      m.llc_bytes / 1048576.0, m.llc.Median() / 1e9, Percent(m.llc.Spread()).c_str(),
      o.quick ? "not measured in --quick" : absl::StrFormat("%.2f GB/s", m.gemv_stream / 1e9).c_str(), m.threads,
      absl::StrJoin(peak_text, ", ").c_str(),
      skipped_text.empty() ? "" : absl::StrCat("; skipped: ", absl::StrJoin(skipped_text, ", ")).c_str(),
      kinds.bf16.c_str(), p.peak_flops_bf16 / 1e9, kinds.f32.c_str(), p.peak_flops_f32 / 1e9, kinds.attention.c_str(),
      best != nullptr ? best->kind.c_str() : "none", best != nullptr ? best->flops_per_second / 1e9 : 0.0,
      m.best_gemm_bf16 / 1e9, 100 * m.best_gemm_bf16 / p.peak_flops_bf16, m.best_gemm_f32 / 1e9,
      100 * m.best_gemm_f32 / p.peak_flops_f32, m.copy.first / 1e9, m.copy.second / 1e9,
      o.disk ? absl::StrFormat("read %.2f GB/s, write %.2f GB/s", m.disk.first / 1e9, m.disk.second / 1e9).c_str()
             : "not measured",
      p.peak_flops_bf16 / p.mem_bandwidth, Percent(p.measurement_spread).c_str());
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(Backend* backend, const CalibrateSettings& o) {
  ASSIGN_OR_RETURN(const Measured m, Measure(backend, o));
  const KernelKinds kinds = KindsOf(backend);
  Calibration c;
  c.profile = ProfileOf(m, backend, kinds, o);
  c.json = nlohmann::json::parse(c.profile.ToJson());
  c.json["measurements"] = MeasurementsJson(m, kinds, o);
  PrintSummary(m, c.profile, kinds, o);
  return c;
}

}  // namespace moeserve::calibrate
