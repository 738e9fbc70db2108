// What the op cases (op_cases.h) share: inputs put into a backend's memory and outputs brought
// back as doubles, and random inputs.
#pragma once

#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/backend.h"

namespace moeserve::testing {

// Inputs in the backend's memory, outputs back to the host.
class DeviceIo {
 public:
  explicit DeviceIo(Backend& b) : b_(b) {}
  template <typename T>
  T* Up(const std::vector<T>& host) {
    auto buf = b_.Allocate(std::max<size_t>(host.size(), 1) * sizeof(T));
    if (!buf.ok()) std::abort();
    if (!host.empty() && !b_.CopyToDevice(buf->data(), host.data(), host.size() * sizeof(T)).ok()) std::abort();
    bufs_.push_back(std::move(*buf));
    return static_cast<T*>(bufs_.back().data());
  }
  template <typename T>
  std::vector<double> Down(const T* device, size_t n) {
    std::vector<T> host(n);
    if (!b_.Synchronize().ok() || !b_.CopyToHost(host.data(), device, n * sizeof(T)).ok()) std::abort();
    return std::vector<double>(host.begin(), host.end());
  }

 private:
  Backend& b_;
  std::vector<DeviceBuffer> bufs_;
};

inline std::vector<float> Normal(std::mt19937& gen, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

inline void Append(std::vector<double>* out, const std::vector<double>& more) {
  out->insert(out->end(), more.begin(), more.end());
}

}  // namespace moeserve::testing
