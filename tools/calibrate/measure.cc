// Machine measurements.
#include "tools/calibrate/measure.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <ctime>
#include <fstream>
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
#include "tools/calibrate/pinned.h"

namespace moeserve::calibrate {

namespace {

// Splits [0, n) into `parts` contiguous ranges: part t is [Begin(t), Begin(t + 1)).
int64_t Begin(int64_t n, int parts, int t) { return n * t / parts; }

}  // namespace

Samples TriadBandwidth(size_t bytes_per_array, int threads, int warmups, int samples) {
  const int64_t n = static_cast<int64_t>(bytes_per_array / sizeof(double));
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
  // First touch on the pinned thread that will use the pages (their NUMA node).
  RunPinned(threads, [&](int t) {
    for (int64_t i = Begin(n, threads, t); i < Begin(n, threads, t + 1); ++i) {
      a[i] = 0;
      b[i] = 1;
      c[i] = 2;
    }
  });
  Samples out;
  const double s = 3.0;
  for (int r = 0; r < warmups + samples; ++r) {
    const std::vector<double> secs = RunPinned(threads, [&](int t) {
      double* __restrict pa = a.get();
      const double* __restrict pb = b.get();
      const double* __restrict pc = c.get();
      for (int64_t i = Begin(n, threads, t); i < Begin(n, threads, t + 1); ++i) pa[i] = pb[i] + s * pc[i];
    });
    if (r >= warmups) out.values.push_back(3.0 * sizeof(double) * static_cast<double>(n) / *std::max_element(secs.begin(), secs.end()));
  }
  volatile double sink = a[n / 2];
  (void)sink;
  return out;
}

Samples ReadBandwidth(size_t bytes, int threads, int warmups, int samples, int passes) {
  // Integer words, so the sum may be reassociated and vectorised: the loop is bound by loads.
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> a(new uint64_t[n]);
  RunPinned(threads, [&](int t) {
    for (int64_t i = Begin(n, threads, t); i < Begin(n, threads, t + 1); ++i) a[i] = static_cast<uint64_t>(i);
  });
  Samples out;
  std::atomic<uint64_t> sink{0};
  for (int r = 0; r < warmups + samples; ++r) {
    const std::vector<double> secs = RunPinned(threads, [&](int t) {
      // Eight independent sums over each 64-byte line, and a prefetch 2 KiB ahead: as many
      // misses in flight as the core allows, as the GEMV's stream has (one dependent chain and
      // no prefetch measured a third less on one core).
      const uint64_t* __restrict p = a.get();
      uint64_t acc[8] = {};
      const int64_t lo = Begin(n, threads, t), hi = Begin(n, threads, t + 1);
      for (int pass = 0; pass < passes; ++pass) {
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8) {
          __builtin_prefetch(p + i + 256);
          for (int l = 0; l < 8; ++l) acc[l] += p[i + l];
        }
        for (; i < hi; ++i) acc[0] += p[i];
      }
      sink.fetch_add(acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7], std::memory_order_relaxed);
    });
    if (r >= warmups) {
      out.values.push_back(sizeof(uint64_t) * static_cast<double>(n) * passes / *std::max_element(secs.begin(), secs.end()));
    }
  }
  volatile uint64_t keep = sink.load();
  (void)keep;
  return out;
}

double LastLevelCacheBytes() {
  // The kernel's cache description first: under a hypervisor cpuid (which sysconf reads) can
  // report a host-wide figure (here 320 MiB for a 32 MiB L3).
  // (A stream, not ReadFileToString: sysfs files cannot be memory-mapped.)
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (in >> text) {
    const double n = std::atof(text.c_str());
    if (n > 0) return text.find('M') != std::string::npos ? n * 1048576.0 : n * 1024.0;
  }
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? static_cast<double>(v) : 0;
}

absl::StatusOr<GemmPoint> MeasureGemm(Backend* backend, DType dtype, int64_t m, int64_t n, int64_t k, int repeats) {
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> wf(static_cast<size_t>(n * k));
  for (float& v : wf) v = dist(gen);
  std::vector<uint8_t> wbytes(wf.size() * DTypeSize(dtype));
  ConvertFromF32(wf.data(), wf.size(), dtype, wbytes.data());
  // In the layout the engine uploads weights in.
  auto wbuf = UploadWeight(backend, wbytes.data(), dtype, n, k, backend->PreferredWeightLayout(dtype));
  if (!wbuf.ok()) return wbuf.status();
  auto xbuf = backend->Allocate(static_cast<size_t>(m * k) * sizeof(float));
  if (!xbuf.ok()) return xbuf.status();
  auto ybuf = backend->Allocate(static_cast<size_t>(m * n) * sizeof(float));
  if (!ybuf.ok()) return ybuf.status();
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(gen);
  if (absl::Status s = backend->CopyToDevice(xbuf->data(), x.data(), x.size() * sizeof(float)); !s.ok()) return s;
  WeightRef w{wbuf->data(), dtype, n, k, backend->PreferredWeightLayout(dtype)};
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
