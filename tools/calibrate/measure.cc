// Machine measurements.
#include "tools/calibrate/measure.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <ctime>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
#include "models/model_weights.h"
#include "tools/calibrate/peak_flops.h"

namespace moeserve::calibrate {

double TriadBandwidth(size_t bytes_per_array, int threads, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes_per_array / sizeof(double));
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
  ThreadPool pool(threads);
  const int64_t grain = std::max<int64_t>(1, n / pool.num_threads());
  // First touch on the threads that will use the pages.
  pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 0;
      b[i] = 1;
      c[i] = 2;
    }
  });
  double best = 0;
  const double s = 3.0;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
      double* __restrict pa = a.get();
      const double* __restrict pb = b.get();
      const double* __restrict pc = c.get();
      for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
    best = std::max(best, 3.0 * sizeof(double) * static_cast<double>(n) / sw.Seconds());
  }
  volatile double sink = a[n / 2];
  (void)sink;
  return best;
}

double ReadBandwidth(size_t bytes, int threads, int repeats) {
  // Integer words, so the sum may be reassociated and vectorised: the loop is bound by loads.
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> a(new uint64_t[n]);
  ThreadPool pool(threads);
  const int64_t grain = std::max<int64_t>(1, n / pool.num_threads());
  pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] = static_cast<uint64_t>(i);
  });
  double best = 0;
  std::atomic<uint64_t> sink{0};
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
      // Eight independent sums over each 64-byte line, and a prefetch 2 KiB ahead: as many
      // misses in flight as the core allows, as the GEMV's stream has (one dependent chain and
      // no prefetch measured a third less on one core).
      const uint64_t* __restrict p = a.get();
      uint64_t s[8] = {};
      int64_t i = lo;
      for (; i + 8 <= hi; i += 8) {
        __builtin_prefetch(p + i + 256);
        for (int l = 0; l < 8; ++l) s[l] += p[i + l];
      }
      for (; i < hi; ++i) s[0] += p[i];
      sink.fetch_add(s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7], std::memory_order_relaxed);
    });
    best = std::max(best, sizeof(uint64_t) * static_cast<double>(n) / sw.Seconds());
  }
  volatile uint64_t keep = sink.load();
  (void)keep;
  return best;
}

absl::StatusOr<GemmPoint> MeasureGemm(Backend* backend, DType dtype, int64_t m, int64_t n, int64_t k, int repeats) {
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> wf(static_cast<size_t>(n * k));
  for (float& v : wf) v = dist(gen);
  std::vector<uint8_t> wbytes(wf.size() * DTypeSize(dtype));
  ConvertFromF32(wf.data(), wf.size(), dtype, wbytes.data());
  // In the layout the engine uploads weights in.
  auto wbuf = UploadWeight(backend, wbytes.data(), dtype, n, k, backend->PreferredWeightLayout());
  if (!wbuf.ok()) return wbuf.status();
  auto xbuf = backend->Allocate(static_cast<size_t>(m * k) * sizeof(float));
  if (!xbuf.ok()) return xbuf.status();
  auto ybuf = backend->Allocate(static_cast<size_t>(m * n) * sizeof(float));
  if (!ybuf.ok()) return ybuf.status();
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(gen);
  if (absl::Status s = backend->CopyToDevice(xbuf->data(), x.data(), x.size() * sizeof(float)); !s.ok()) return s;
  WeightRef w{wbuf->data(), dtype, n, k, backend->PreferredWeightLayout()};
  backend->Gemm(xbuf->as<float>(), m, w, ybuf->as<float>());  // warm-up
  if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    backend->Gemm(xbuf->as<float>(), m, w, ybuf->as<float>());
    if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
    best = std::min(best, sw.Seconds());
  }
  GemmPoint p;
  p.dtype = std::string(DTypeShortName(dtype));
  p.m = m;
  p.n = n;
  p.k = k;
  p.seconds = best;
  p.flops_per_second = 2.0 * static_cast<double>(m * n * k) / best;
  p.bytes_per_second = static_cast<double>(wbytes.size()) / best;
  return p;
}

absl::StatusOr<std::pair<double, double>> CopyBandwidth(Backend* backend, size_t bytes, int repeats) {
  std::vector<uint8_t> host(bytes, 1);
  auto dev = backend->Allocate(bytes);
  if (!dev.ok()) return dev.status();
  double to = 0, from = 0;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    if (absl::Status s = backend->CopyToDevice(dev->data(), host.data(), bytes); !s.ok()) return s;
    if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
    to = std::max(to, static_cast<double>(bytes) / sw.Seconds());
    sw.Reset();
    if (absl::Status s = backend->CopyToHost(host.data(), dev->data(), bytes); !s.ok()) return s;
    if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
    from = std::max(from, static_cast<double>(bytes) / sw.Seconds());
  }
  return std::make_pair(to, from);
}

absl::StatusOr<std::pair<double, double>> DiskBandwidth(const std::string& dir, size_t bytes) {
  const std::string path = absl::StrCat(dir, "/moeserve_calibrate_", getpid(), ".bin");
  constexpr size_t kChunk = 8 << 20;
  std::vector<uint8_t> buf(kChunk);
  std::mt19937 gen(7);
  for (auto& b : buf) b = static_cast<uint8_t>(gen());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("--disk-dir: cannot create ", path, ": ", strerror(errno)));
  Stopwatch sw;
  for (size_t done = 0; done < bytes; done += kChunk) {
    if (write(fd, buf.data(), kChunk) != static_cast<ssize_t>(kChunk)) {
      close(fd);
      unlink(path.c_str());
      return absl::UnavailableError(absl::StrCat("--disk-dir: write to ", path, " failed: ", strerror(errno)));
    }
  }
  fsync(fd);
  const double write_bw = static_cast<double>(bytes) / sw.Seconds();
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  const int rfd = open(path.c_str(), O_RDONLY);
  if (rfd < 0) {
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("cannot reopen ", path));
  }
  posix_fadvise(rfd, 0, 0, POSIX_FADV_DONTNEED);
  sw.Reset();
  size_t got = 0;
  for (ssize_t r; (r = read(rfd, buf.data(), kChunk)) > 0;) got += static_cast<size_t>(r);
  const double read_bw = static_cast<double>(got) / sw.Seconds();
  close(rfd);
  unlink(path.c_str());
  return std::make_pair(read_bw, write_bw);
}

double PhysicalMemoryBytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

}  // namespace moeserve::calibrate

namespace moeserve::calibrate {

absl::StatusOr<Calibration> Calibrate(Backend* backend, const CalibrateSettings& o) {
  const double array_mb = o.quick ? 32 : o.array_mb;
  const double disk_mb = o.quick ? 32 : o.disk_mb;
  const int repeats = o.quick ? 2 : 5;
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  // Shapes the engine's decode GEMMs take: one row (memory-bound) up to many (compute-bound).
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes =
      o.quick ? std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 512, 512}, {64, 512, 512}}
              : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
                    {1, 16384, 8192}, {16, 2048, 2048}, {64, 2048, 512},  {64, 1024, 1024},
                    {256, 1024, 1024}, {256, 2048, 512}, {256, 4096, 1024}, {512, 2048, 512}};
  Progress progress("calibrate", 4 + 2 * static_cast<int64_t>(shapes.size()) + (o.disk ? 1 : 0), o.progress);
  int64_t done = 0;
  progress.Update(done, "memory bandwidth");
  const double triad = TriadBandwidth(static_cast<size_t>(array_mb * (1 << 20)), threads, repeats);
  const double read = ReadBandwidth(static_cast<size_t>(3 * array_mb * (1 << 20)), threads, repeats);
  progress.Update(++done, "peak FLOP/s");
  const std::vector<PeakFlops> peaks = MeasurePeakFlops(threads, o.quick ? 0.1 : 0.5);
  progress.Update(++done, "GEMM");
  nlohmann::json gemm = nlohmann::json::array();
  double peak_bf16 = 0, peak_f32 = 0, gemv_stream = 0;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [m, n, k] : shapes) {
      ASSIGN_OR_RETURN(GemmPoint p, MeasureGemm(backend, dt, m, n, k, repeats + 2));
      gemm.push_back({{"dtype", p.dtype}, {"m", m}, {"n", n}, {"k", k}, {"seconds", p.seconds},
                      {"flops_per_second", p.flops_per_second}, {"weight_bytes_per_second", p.bytes_per_second}});
      double& peak = dt == DType::kBF16 ? peak_bf16 : peak_f32;
      peak = std::max(peak, p.flops_per_second);
      // One row against weights far larger than the caches streams them from memory.
      if (m == 1 && static_cast<double>(n * k) * DTypeSize(dt) > 4 * array_mb * (1 << 20) / 3) {
        gemv_stream = std::max(gemv_stream, p.bytes_per_second);
      }
      progress.Update(++done, absl::StrCat("GEMM ", p.dtype, " ", m, "x", n, "x", k));
    }
  }
  ASSIGN_OR_RETURN(auto copy, CopyBandwidth(backend, static_cast<size_t>(array_mb * (1 << 20)), repeats));
  progress.Update(++done, "copies");
  std::pair<double, double> disk = {0, 0};
  if (o.disk) {
    ASSIGN_OR_RETURN(disk, DiskBandwidth(o.disk_dir, static_cast<size_t>(disk_mb * (1 << 20))));
    progress.Update(++done, "disk");
  }
  progress.Finish(++done, "done");

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  Calibration c;
  roofline::HardwareProfile& p = c.profile;
  p.name = absl::StrCat("calibrated-", host);
  p.source = absl::StrCat("calibrated on ", host, " at ", date, " (", backend->Name(), ")");
  // The peak is the hardware's, for the instructions the kernels issue: bf16 weights are widened
  // to fp32 in registers, so both weight dtypes run on the same fp32 FMAs. Without a
  // register-loop measurement of that kind, our best GEMM stands in.
  const auto* cpu = dynamic_cast<const CpuBackend*>(backend);
  const std::string kind = cpu != nullptr ? cpu_fast::GemmInstructionKind(cpu->isa()) : backend->Name();
  double hardware_peak = 0;
  nlohmann::json peak_json = nlohmann::json::object();
  for (const PeakFlops& pk : peaks) {
    peak_json[pk.kind] = pk.flops_per_second;
    if (pk.kind == kind) hardware_peak = pk.flops_per_second;
  }
  const double gemm_best_bf16 = peak_bf16, gemm_best_f32 = peak_f32;
  if (hardware_peak > 0) peak_bf16 = peak_f32 = hardware_peak;
  p.peak_flops_bf16 = peak_bf16;
  p.peak_flops_f32 = peak_f32;
  // The triad does not count its write-allocate traffic, and one sequential stream per thread
  // has less memory-level parallelism than the GEMM's several weight rows, so either can be
  // beaten by the engine's own weight streaming: the peak is the largest of the three.
  p.mem_bandwidth = std::max({triad, read, gemv_stream});
  p.mem_capacity = PhysicalMemoryBytes();
  p.host_link_bandwidth = std::min(copy.first, copy.second);
  p.disk_read_bandwidth = disk.first;
  p.disk_write_bandwidth = disk.second;
  p.devices = 1;
  p.scale_up_domain = 1;
  p.price_per_hour = o.price_per_hour;
  c.json = nlohmann::json::parse(p.ToJson());
  c.json["measurements"] = {{"threads", threads},
                            {"triad_bytes_per_second", triad},
                            {"read_bytes_per_second", read},
                            {"gemv_weight_stream_bytes_per_second", gemv_stream},
                            {"array_bytes", array_mb * (1 << 20)},
                            {"gemm", gemm},
                            {"peak_flops_by_instruction", peak_json},
                            {"kernel_instruction", kind},
                            {"copy_to_device_bytes_per_second", copy.first},
                            {"copy_to_host_bytes_per_second", copy.second},
                            {"disk_read_bytes_per_second", disk.first},
                            {"disk_write_bytes_per_second", disk.second}};
  std::string peak_text;
  for (const PeakFlops& pk : peaks) absl::StrAppend(&peak_text, peak_text.empty() ? "" : ", ", pk.kind, " ", absl::StrFormat("%.1f", pk.flops_per_second / 1e9));
  std::fprintf(stderr,
               "calibrate: triad %.2f GB/s, read %.2f GB/s, GEMV stream %.2f GB/s | peak GFLOP/s (register loops): %s; "
               "kernels issue %s | best GEMM bf16 %.1f GFLOP/s (%.0f%% of peak), f32 %.1f (%.0f%%) | "
               "copy %.2f/%.2f GB/s | disk read %.2f GB/s, write %.2f GB/s | FLOP/byte %.1f\n",
               triad / 1e9, read / 1e9, gemv_stream / 1e9, peak_text.empty() ? "none" : peak_text.c_str(), kind.c_str(),
               gemm_best_bf16 / 1e9, 100 * gemm_best_bf16 / peak_bf16, gemm_best_f32 / 1e9, 100 * gemm_best_f32 / peak_f32,
               copy.first / 1e9, copy.second / 1e9, disk.first / 1e9, disk.second / 1e9, peak_bf16 / p.mem_bandwidth);
  return c;
}

}  // namespace moeserve::calibrate
