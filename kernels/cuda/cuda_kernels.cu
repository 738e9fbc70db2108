// The CUDA backend's kernels. Simple and exact rather than fast: one thread per output element
// or row, fp32 arithmetic, the same formulas as the CPU reference (kernels/cpu/reference_ops.cc).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const void* p, int elem, int64_t i) {
  switch (elem) {
    case kElemBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kElemF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void Store(void* p, int elem, int64_t i, float v) {
  switch (elem) {
    case kElemBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case kElemF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// Element offset of (block, layer, k_or_v, slot) as in KvLayout::Offset.
__device__ __forceinline__ int64_t KvOffset(const KvGeometry& g, int64_t block, int64_t layer, int kv, int64_t slot) {
  const int64_t te = g.kv_heads * g.head_dim;
  return ((block * g.num_layers + layer) * 2 + kv) * g.block_size * te + slot * te;
}

int Blocks(int64_t n, int threads = kThreads) { return static_cast<int>((n + threads - 1) / threads); }

__global__ void EmbeddingKernel(const int32_t* ids, const void* table, int elem, int64_t cols, float* out) {
  const int64_t i = blockIdx.x;
  const int64_t row = ids[i];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[i * cols + c] = Load(table, elem, row * cols + c);
}

__global__ void ConvertKernel(const float* x, int64_t n, int elem, void* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) Store(out, elem, i, x[i]);
}

static_assert((kThreads & (kThreads - 1)) == 0, "the RMSNorm reduction halves the block");

__global__ void RmsNormKernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  __shared__ float partial[kThreads];
  const int64_t r = blockIdx.x;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) ss += x[r * dim + c] * x[r * dim + c];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) y[r * dim + c] = x[r * dim + c] * inv * w[c];
}

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t n, int64_t dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += bias[i % dim];
}

// One block per token; threads over (head, pair) of q and k.
__global__ void RopeKernel(float* q, float* k, const int32_t* positions, int64_t q_heads, int64_t kv_heads,
                           int64_t head_dim, float theta) {
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  const double pos = positions[t];
  for (int64_t idx = threadIdx.x; idx < (q_heads + kv_heads) * half; idx += blockDim.x) {
    const int64_t head = idx / half, i = idx % half;
    float* v = head < q_heads ? q + (t * q_heads + head) * head_dim : k + (t * kv_heads + head - q_heads) * head_dim;
    const double angle = pos * pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / head_dim);
    const double c = cos(angle), s = sin(angle);
    const double a = v[i], b = v[i + half];
    v[i] = static_cast<float>(a * c - b * s);
    v[i + half] = static_cast<float>(b * c + a * s);
  }
}

__global__ void SiluMulKernel(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, c = i % inter;
  const float g = gate_up[r * 2 * inter + c], u = gate_up[r * 2 * inter + inter + c];
  out[i] = g / (1.0f + expf(-g)) * u;
}

// One thread per token: softmax, then k rounds of argmax (ties to the lower index).
__global__ void RouterTopKKernel(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                                 int32_t* expert_ids, float* expert_weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  const float* row = logits + t * num_experts;
  float mx = row[0];
  for (int64_t e = 1; e < num_experts; ++e) mx = fmaxf(mx, row[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) sum += expf(row[e] - mx);
  uint64_t taken[4] = {0, 0, 0, 0};  // up to 256 experts
  float top_sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    float best_p = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (taken[e / 64] >> (e % 64) & 1) continue;
      const float p = expf(row[e] - mx) / sum;
      if (best < 0 || p > best_p) {  // the first untaken expert, then strictly better ones (NaN-safe)
        best_p = p;
        best = e;
      }
    }
    taken[best / 64] |= uint64_t{1} << (best % 64);
    expert_ids[t * k + j] = static_cast<int32_t>(best);
    expert_weights[t * k + j] = best_p;
    top_sum += best_p;
  }
  if (renormalize) {
    for (int64_t j = 0; j < k; ++j) expert_weights[t * k + j] /= top_sum;
  }
}

__global__ void RoundToBf16Kernel(const float* x, int64_t n, uint16_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t bits = __float_as_uint(x[i]);
  // As the CPU's F32ToBf16: nearest even; a NaN stays a quiet NaN.
  out[i] = (bits & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((bits >> 16) | 0x40u)
                                              : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__global__ void WidenBf16Kernel(const uint16_t* x, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

__global__ void GatherRowsKernel(const float* x, const int32_t* src_rows, int64_t dim, float* out) {
  const int64_t i = blockIdx.x;
  const int64_t src = src_rows[i];
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out[i * dim + c] = x[src * dim + c];
}

__global__ void ComposeIndicesKernel(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = first[second[i]];
}

__global__ void ScatterCombineKernel(const float* y, const int32_t* rows, const float* weights, int64_t k,
                                     int64_t dim, float* out, bool accumulate) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float acc = accumulate ? out[t * dim + c] : 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights[t * k + j] * y[static_cast<int64_t>(rows[t * k + j]) * dim + c];
    out[t * dim + c] = acc;
  }
}

__global__ void SigmoidScaleRowsKernel(float* x, const float* gate, int64_t dim) {
  const int64_t r = blockIdx.x;
  const float s = 1.0f / (1.0f + expf(-gate[r]));
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) x[r * dim + c] *= s;
}

// blockIdx.x: token, blockIdx.y: 0 for K, 1 for V.
__global__ void WriteKvKernel(const float* k, const float* v, const int64_t* slots, KvGeometry g, int64_t layer,
                              void* cache) {
  const int64_t i = blockIdx.x;
  const int kv = static_cast<int>(blockIdx.y);
  const int64_t te = g.kv_heads * g.head_dim;
  const int64_t block = slots[i] / g.block_size, slot = slots[i] % g.block_size;
  const float* src = (kv == 0 ? k : v) + i * te;
  const int64_t off = KvOffset(g, block, layer, kv, slot);
  for (int64_t e = threadIdx.x; e < te; e += blockDim.x) Store(cache, g.elem, off + e, src[e]);
}

constexpr int kMaxHeadDim = 256;
// Warps that split one (token, query head)'s context: a decode token's attention is a chain of
// dependent loads per position, so the context is spread over the block's warps (warp w takes
// positions w, w + kAttnWarps, ...) and their partial softmax states are merged at the end
// (flash-decoding within one block). One warp per pair walked 1024 positions in 1.26 ms on an
// H100 (docs/gpu-check.md).
constexpr int kAttnWarps = 16;

// Block b handles pair b = token * q_heads + head; lane l holds dimensions l, l + 32, ... of the
// output.
__global__ void __launch_bounds__(kAttnWarps * 32)
    PagedAttentionKernel(const float* q, const int32_t* token_seq, const int32_t* token_pos,
                         const int32_t* block_tables, int64_t max_blocks_per_seq, KvGeometry g, int64_t layer,
                         const void* cache, int64_t q_heads, float scale, float* out) {
  constexpr int kPerLane = kMaxHeadDim / 32;
  __shared__ float part_m[kAttnWarps], part_l[kAttnWarps];
  __shared__ float part_acc[kAttnWarps][kMaxHeadDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t pair = blockIdx.x;
  const int64_t t = pair / q_heads, h = pair % q_heads;
  const int64_t hd = g.head_dim;
  const int64_t kv_head = h / (q_heads / g.kv_heads);
  const int64_t ctx = token_pos[t] + 1;
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * max_blocks_per_seq;
  const float* qv = q + (t * q_heads + h) * hd;
  float qreg[kPerLane], acc[kPerLane];
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    qreg[i] = d < hd ? qv[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < ctx; j += kAttnWarps) {
    const int64_t block = table[j / g.block_size], slot = j % g.block_size;
    const int64_t koff = KvOffset(g, block, layer, 0, slot) + kv_head * hd;
    const int64_t voff = KvOffset(g, block, layer, 1, slot) + kv_head * hd;
    float dot = 0.0f;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < hd) dot += qreg[i] * Load(cache, g.elem, koff + d);
    }
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * scale;
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new);  // 0 on the warp's first position (m = -inf)
    const float p = expf(s - m_new);
    l = l * rescale + p;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * rescale + (d < hd ? p * Load(cache, g.elem, voff + d) : 0.0f);
    }
    m = m_new;
  }
  // Merge: every warp's (max, sum, weighted values) rescaled to the block's max. A warp with no
  // position (context shorter than kAttnWarps) has sum 0 and adds nothing.
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
  for (int i = 0; i < kPerLane; ++i) part_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float mx = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, part_m[w]);
  float sum = 0.0f, o[kPerLane] = {};
  for (int w = 0; w < kAttnWarps; ++w) {
    if (part_l[w] == 0.0f) continue;
    const float f = expf(part_m[w] - mx);
    sum += part_l[w] * f;
    for (int i = 0; i < kPerLane; ++i) o[i] += part_acc[w][lane + 32 * i] * f;
  }
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < hd) out[(t * q_heads + h) * hd + d] = o[i] / sum;
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int elem, int64_t cols, float* out,
                            cudaStream_t stream) {
  if (n > 0) EmbeddingKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(ids, table, elem, cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const float* x, int64_t n, int elem, void* out, cudaStream_t stream) {
  if (n > 0) ConvertKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, elem, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                          cudaStream_t stream) {
  if (rows > 0) RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, w, dim, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n > 0) AddKernel<<<Blocks(n), kThreads, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  const int64_t n = rows * dim;
  if (n > 0) AddBiasKernel<<<Blocks(n), kThreads, 0, stream>>>(y, bias, n, dim);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float theta, cudaStream_t stream) {
  if (n > 0) {
    RopeKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(q, k, positions, q_heads, kv_heads, head_dim, theta);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out, cudaStream_t stream) {
  if (rows * inter > 0) SiluMulKernel<<<Blocks(rows * inter), kThreads, 0, stream>>>(gate_up, rows, inter, out);
  return cudaGetLastError();
}

cudaError_t LaunchRouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k, bool renormalize,
                             int32_t* expert_ids, float* expert_weights, cudaStream_t stream) {
  if (num_experts > 256 || k > num_experts) return cudaErrorInvalidValue;
  if (n > 0) {
    RouterTopKKernel<<<Blocks(n, 128), 128, 0, stream>>>(logits, n, num_experts, k, renormalize, expert_ids,
                                                          expert_weights);
  }
  return cudaGetLastError();
}

cudaError_t LaunchRoundToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n > 0) RoundToBf16Kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchWidenBf16(const uint16_t* x, int64_t n, float* out, cudaStream_t stream) {
  if (n > 0) WidenBf16Kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim, float* out,
                             cudaStream_t stream) {
  if (n > 0) GatherRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, src_rows, dim, out);
  return cudaGetLastError();
}

cudaError_t LaunchComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out,
                                 cudaStream_t stream) {
  if (n > 0) {
    ComposeIndicesKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(first, second, n, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchScatterCombine(const float* y, const int32_t* rows, const float* weights, int64_t n, int64_t k,
                                 int64_t dim, float* out, bool accumulate, cudaStream_t stream) {
  if (n > 0) {
    ScatterCombineKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(y, rows, weights, k, dim, out, accumulate);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows > 0) SigmoidScaleRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, gate, dim);
  return cudaGetLastError();
}

cudaError_t LaunchWriteKv(const float* k, const float* v, const int64_t* slots, int64_t n, KvGeometry g,
                          int64_t layer, void* cache, cudaStream_t stream) {
  if (n > 0) WriteKvKernel<<<dim3(static_cast<unsigned>(n), 2), kThreads, 0, stream>>>(k, v, slots, g, layer, cache);
  return cudaGetLastError();
}

cudaError_t LaunchPagedAttention(const float* q, const int32_t* token_seq, const int32_t* token_pos,
                                 const int32_t* block_tables, int64_t num_tokens, int64_t max_blocks_per_seq,
                                 KvGeometry g, int64_t layer, const void* cache, int64_t q_heads, float scale,
                                 float* out, cudaStream_t stream) {
  if (g.head_dim > kMaxHeadDim || g.kv_heads <= 0 || q_heads % g.kv_heads != 0) return cudaErrorInvalidValue;
  const int64_t pairs = num_tokens * q_heads;
  if (pairs > 0) {
    PagedAttentionKernel<<<static_cast<unsigned>(pairs), kAttnWarps * 32, 0, stream>>>(
        q, token_seq, token_pos, block_tables, max_blocks_per_seq, g, layer, cache, q_heads, scale, out);
  }
  return cudaGetLastError();
}

}  // namespace moeserve::cuda
