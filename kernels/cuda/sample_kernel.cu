// Sampling on the GPU: one thread block per row of logits, never sorting. The method is the one
// kernels/cpu/sample_ops.h describes and the CPU tests check against sorting (RadixSampleRow):
// each decision (the top_k-th candidate, the end of the nucleus, the sampled token) is a
// descent over the 64-bit order key (logit bits, then the inverted id), one byte per pass,
// picking the byte from a 256-bucket histogram of counts or probability mass in shared memory.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/sample_order.h"

namespace moeserve::cuda {
namespace {

constexpr int kSampleThreads = 512;

// Block-wide max of a key and sum of a double; every thread gets the result.
__device__ uint64_t BlockMaxKey(uint64_t v, uint64_t* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_down_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t m = scratch[0];
    for (int w = 1; w < kSampleThreads / 32; ++w) m = scratch[w] > m ? scratch[w] : m;
    scratch[kSampleThreads / 32] = m;
  }
  __syncthreads();
  const uint64_t out = scratch[kSampleThreads / 32];
  __syncthreads();
  return out;
}

__device__ double BlockSum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kSampleThreads / 32; ++w) s += scratch[w];
    scratch[kSampleThreads / 32] = s;
  }
  __syncthreads();
  const double out = scratch[kSampleThreads / 32];
  __syncthreads();
  return out;
}

struct Row {
  const float* x;
  int64_t vocab;
  float mx;      // the largest logit
  double inv_t;  // 1 / temperature
};

__device__ __forceinline__ double Weight(const Row& r, int64_t i, bool counts) {
  return counts ? 1.0 : exp((static_cast<double>(r.x[i]) - r.mx) * r.inv_t);
}

// The key of the candidate (key >= floor) where the cumulative weight in descending key order
// first reaches `target` (inclusive) or exceeds it (strict); the last candidate if rounding
// leaves it unreached. All threads call it and get the same key.
__device__ uint64_t Descend(const Row& r, bool counts, uint64_t floor, double target, bool inclusive, double* hist,
                            uint64_t* shared_prefix, double* shared_above) {
  uint64_t prefix = 0, mask = 0;
  double above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kSampleThreads) hist[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < r.vocab; i += kSampleThreads) {
      const uint64_t k = OrderKey(r.x[i], i);
      if (k >= floor && (k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 0xFF], Weight(r, i, counts));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = ChooseKeyByte(hist, target, inclusive, &above);
      if (chosen < 0) chosen = 0;  // no candidate at all: cannot happen (the first key always is one)
      *shared_prefix = prefix | (static_cast<uint64_t>(chosen) << shift);
      *shared_above = above;
    }
    __syncthreads();
    prefix = *shared_prefix;
    above = *shared_above;
    mask |= uint64_t{0xFF} << shift;
    __syncthreads();
  }
  return prefix;
}

__device__ double CandidateMass(const Row& r, uint64_t floor, double* scratch) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < r.vocab; i += kSampleThreads) {
    if (OrderKey(r.x[i], i) >= floor) s += Weight(r, i, false);
  }
  return BlockSum(s, scratch);
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* logits, int64_t vocab, const SampleSpecDevice* specs, int32_t* tokens) {
  __shared__ double hist[256];
  __shared__ double sum_scratch[kSampleThreads / 32 + 1];
  __shared__ uint64_t key_scratch[kSampleThreads / 32 + 1];
  __shared__ uint64_t shared_prefix;
  __shared__ double shared_above;
  const int64_t row = blockIdx.x;
  const SampleSpecDevice s = specs[row];
  Row r{logits + row * vocab, vocab, 0.0f, 0.0};
  // The first key in the order: the largest logit, the lowest id among ties (greedy's pick).
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kSampleThreads) {
    const uint64_t k = OrderKey(r.x[i], i);
    best = k > best ? k : best;
  }
  best = BlockMaxKey(best, key_scratch);
  const auto id_of = [](uint64_t key) { return static_cast<int32_t>(~static_cast<uint32_t>(key & 0xFFFFFFFFu)); };
  if (s.temperature == 0.0f) {
    if (threadIdx.x == 0) tokens[row] = id_of(best);
    return;
  }
  r.mx = r.x[id_of(best)];
  r.inv_t = 1.0 / static_cast<double>(s.temperature);
  // top_k, and min_p as the count of logits at or above its floor.
  int64_t k = s.top_k > 0 && s.top_k < vocab ? s.top_k : vocab;
  if (s.min_p > 0.0f) {
    const double min_p_floor = MinPLogitFloor(r.mx, s.temperature, s.min_p);
    double n = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kSampleThreads) n += static_cast<double>(r.x[i]) >= min_p_floor;
    const int64_t above = static_cast<int64_t>(BlockSum(n, sum_scratch));
    k = above < k ? above : k;
  }
  uint64_t floor = 0;
  if (k < vocab) {
    floor = Descend(r, /*counts=*/true, 0, static_cast<double>(k), true, hist, &shared_prefix, &shared_above);
  }
  double sum = CandidateMass(r, floor, sum_scratch);
  if (s.top_p < 1.0f) {
    floor = Descend(r, false, floor, static_cast<double>(s.top_p) * sum, true, hist, &shared_prefix, &shared_above);
    sum = CandidateMass(r, floor, sum_scratch);
  }
  const uint64_t key = Descend(r, false, floor, s.u * sum, /*inclusive=*/false, hist, &shared_prefix, &shared_above);
  if (threadIdx.x == 0) tokens[row] = id_of(key);
}

__global__ void EditLogitsKernel(float* logits, int64_t vocab, const LogitEditDevice* edits, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const LogitEditDevice e = edits[i];
  float& l = logits[static_cast<int64_t>(e.row) * vocab + e.token];
  l = EditedLogit(l, e.bias, e.repetition, e.subtract);
}

}  // namespace

cudaError_t LaunchEditLogits(float* logits, int64_t vocab, const LogitEditDevice* edits, int64_t n,
                             cudaStream_t stream) {
  constexpr int kThreads = 256;
  if (n > 0) {
    EditLogitsKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        logits, vocab, edits, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpecDevice* specs,
                             int32_t* tokens, cudaStream_t stream) {
  if (rows > 0 && vocab > 0) {
    SampleRowsKernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(logits, vocab, specs, tokens);
  }
  return cudaGetLastError();
}

}  // namespace moeserve::cuda
