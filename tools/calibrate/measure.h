// Measurements of the machine at hand for `moeserve calibrate`: memory bandwidth (STREAM
// triad), FLOP/s of the engine's own GEMM per weight dtype and shape, host<->device copy
// bandwidth through the backend, and disk bandwidth. Each returns the best of a few runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "roofline/hardware.h"
#include "tools/calibrate/pinned.h"
#include "kernels/backend.h"

namespace moeserve::calibrate {

// Triad a[i] = b[i] + s * c[i] over three arrays of `bytes_per_array` bytes on `threads` pinned
// threads; counts 3 x 8 bytes per element as STREAM does. Bytes per second per sample, after
// `warmups` unrecorded runs.
Samples TriadBandwidth(size_t bytes_per_array, int threads, int warmups, int samples);
// Sum of one array of 64-bit words (read-only streaming, like a weight read), each thread its
// own part `passes` times per sample. Bytes per second per sample. With `bytes` under the
// last-level cache (and passes > 1) this is the LLC's read bandwidth.
Samples ReadBandwidth(size_t bytes, int threads, int warmups, int samples, int passes = 1);
// The last-level cache's size in bytes (0 when the system does not say).
double LastLevelCacheBytes();

struct GemmPoint {
  std::string dtype;
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0;
  double flops_per_second = 0;
  double bytes_per_second = 0;  // weight bytes over time
};
// The backend's Gemm, y[m, n] = x[m, k] @ w[n, k]^T, with weights of `dtype`.
absl::StatusOr<GemmPoint> MeasureGemm(Backend* backend, DType dtype, int64_t m, int64_t n, int64_t k, int repeats);

// Backend::CopyToDevice and CopyToHost of `bytes`. Bytes per second each.
absl::StatusOr<std::pair<double, double>> CopyBandwidth(Backend* backend, size_t bytes, int repeats);

// Writes `bytes` to a file in `dir` (fsync'd), drops it from the page cache and reads it back.
// Returns {read, write} bytes per second; the file is removed.
absl::StatusOr<std::pair<double, double>> DiskBandwidth(const std::string& dir, size_t bytes);

// Physical memory of the machine in bytes.
double PhysicalMemoryBytes();

struct CalibrateSettings {
  int threads = 0;             // 0: one per CPU this process may run on (UsableCpus)
  double array_mb = 256;       // each STREAM array
  std::string disk_dir = "/tmp";
  double disk_mb = 512;
  bool disk = true;            // measure the disk too
  bool quick = false;          // small sizes, few repeats
  bool progress = true;
  double price_per_hour = 0;
};

struct Calibration {
  roofline::HardwareProfile profile;
  nlohmann::json json;  // the profile plus every measurement
};

// Runs every measurement on `backend` and assembles the profile.
absl::StatusOr<Calibration> Calibrate(Backend* backend, const CalibrateSettings& settings);

}  // namespace moeserve::calibrate
