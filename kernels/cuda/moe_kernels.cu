// The MoE layer's kernels that keep expert routing on the device: the routing plan (a stable
// counting sort of the assignments by expert) and a grouped expert GEMM that reads the group
// offsets from device memory, so a layer enqueues its experts without waiting for the host.
// Simple and exact rather than fast (fp32 accumulation in the CPU reference's order of terms is
// not promised; results agree within fp32 rounding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"

namespace moeserve::cuda {
namespace {

// One block; thread e (strided) owns expert e: counts its assignments, then, after a prefix sum
// over experts, writes them in assignment order. Work O(experts x assignments) but every read is
// a broadcast from L1; a decode step has a few hundred assignments.
__global__ void PlanRoutingKernel(const int32_t* ids, int64_t assignments, int64_t k, int64_t experts,
                                  int64_t* offsets, int32_t* gather_rows, int32_t* combine_rows) {
  extern __shared__ int64_t counts[];  // [experts + 1]
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t c = 0;
    for (int64_t i = 0; i < assignments; ++i) c += ids[i] == e ? 1 : 0;
    counts[e + 1] = c;
  }
  if (threadIdx.x == 0) counts[0] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int64_t e = 0; e < experts; ++e) counts[e + 1] += counts[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e <= experts; e += blockDim.x) offsets[e] = counts[e];
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t row = counts[e];
    for (int64_t i = 0; i < assignments; ++i) {
      if (ids[i] != e) continue;
      gather_rows[row] = static_cast<int32_t>(i / k);
      combine_rows[i] = static_cast<int32_t>(row);
      ++row;
    }
  }
}

template <typename W>
__device__ __forceinline__ float ToFloat(W v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) { return __half2float(v); }

constexpr int kTileRows = 16;   // rows of x (tokens) per block
constexpr int kTileOut = 64;    // output features per block
constexpr int kTileK = 32;      // reduction chunk
constexpr int kMaxExperts = 1024;

// y[r, o] = sum_c x[r, c] * w_g[o, c] for the rows r of group g. Grid: x over output tiles, y over
// row tiles (strided); a row tile is found by walking the groups' tile counts. 256 threads:
// thread (ty, tx) computes rows ty*4 .. ty*4+3 of output tx.
template <typename W>
__global__ void GroupedGemmKernel(const float* x, const void* const* weights, int64_t out_features, int64_t in_features,
                                  const int64_t* offsets, int64_t groups, int64_t tile_bound, float* y) {
  __shared__ int64_t off[kMaxExperts + 1];
  __shared__ float xs[kTileRows][kTileK + 1];
  __shared__ float ws[kTileOut][kTileK + 1];
  for (int64_t g = threadIdx.x; g <= groups; g += blockDim.x) off[g] = offsets[g];
  __syncthreads();
  const int tx = threadIdx.x % kTileOut, ty = threadIdx.x / kTileOut;  // ty in [0, 4)
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileOut;
  for (int64_t tile = blockIdx.y; tile < tile_bound; tile += gridDim.y) {
    // Which group and which of its row tiles this is.
    int64_t g = 0, rest = tile;
    for (; g < groups; ++g) {
      const int64_t tiles = (off[g + 1] - off[g] + kTileRows - 1) / kTileRows;
      if (rest < tiles) break;
      rest -= tiles;
    }
    if (g == groups) return;  // past the last group's tiles (uniform across the block)
    const int64_t r0 = off[g] + rest * kTileRows, r_end = off[g + 1];
    const W* w = static_cast<const W*>(weights[g]);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t c0 = 0; c0 < in_features; c0 += kTileK) {
      for (int i = threadIdx.x; i < kTileRows * kTileK; i += blockDim.x) {
        const int rr = i / kTileK, cc = i % kTileK;
        const int64_t r = r0 + rr, c = c0 + cc;
        xs[rr][cc] = (r < r_end && c < in_features) ? x[r * in_features + c] : 0.f;
      }
      for (int i = threadIdx.x; i < kTileOut * kTileK; i += blockDim.x) {
        const int oo = i / kTileK, cc = i % kTileK;
        const int64_t o = o0 + oo, c = c0 + cc;
        ws[oo][cc] = (o < out_features && c < in_features) ? ToFloat<W>(w[o * in_features + c]) : 0.f;
      }
      __syncthreads();
#pragma unroll 8
      for (int cc = 0; cc < kTileK; ++cc) {
        const float wv = ws[tx][cc];
        for (int j = 0; j < 4; ++j) acc[j] += xs[ty * 4 + j][cc] * wv;
      }
      __syncthreads();
    }
    const int64_t o = o0 + tx;
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + ty * 4 + j;
      if (r < r_end && o < out_features) y[r * out_features + o] = acc[j];
    }
  }
}

}  // namespace

cudaError_t LaunchPlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts, int64_t* offsets,
                              int32_t* gather_rows, int32_t* combine_rows, cudaStream_t stream) {
  if (num_experts < 1 || num_experts > kMaxExperts) return cudaErrorInvalidValue;
  const int threads = num_experts >= 256 ? 256 : static_cast<int>((num_experts + 31) / 32 * 32);
  const size_t shared = static_cast<size_t>(num_experts + 1) * sizeof(int64_t);
  PlanRoutingKernel<<<1, threads, shared, stream>>>(expert_ids, n * k, k, num_experts, offsets, gather_rows,
                                                    combine_rows);
  return cudaGetLastError();
}

cudaError_t LaunchGroupedGemm(const float* x, const void* const* weights, int elem, int64_t out_features,
                              int64_t in_features, const int64_t* offsets, int64_t groups, int64_t max_rows,
                              float* y, cudaStream_t stream) {
  if (groups < 1 || groups > kMaxExperts) return cudaErrorInvalidValue;
  if (max_rows == 0) return cudaSuccess;
  // Every group's row tiles together: at most max_rows / kTileRows plus one partial per group.
  const int64_t tile_bound = (max_rows + kTileRows - 1) / kTileRows + groups;
  const dim3 grid(static_cast<unsigned>((out_features + kTileOut - 1) / kTileOut),
                  static_cast<unsigned>(tile_bound < 65535 ? tile_bound : 65535));
  const int threads = kTileOut * (kTileRows / 4);
  switch (elem) {
    case kElemBF16:
      GroupedGemmKernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(x, weights, out_features, in_features, offsets,
                                                                     groups, tile_bound, y);
      break;
    case kElemF16:
      GroupedGemmKernel<__half><<<grid, threads, 0, stream>>>(x, weights, out_features, in_features, offsets, groups,
                                                              tile_bound, y);
      break;
    default:
      GroupedGemmKernel<float><<<grid, threads, 0, stream>>>(x, weights, out_features, in_features, offsets, groups,
                                                             tile_bound, y);
  }
  return cudaGetLastError();
}

}  // namespace moeserve::cuda
