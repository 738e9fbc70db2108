// The Backend interface: memory on one device plus the handful of ops the MoE transformer
// needs. Model code is written only against this interface and never includes CUDA headers.
//
// Conventions
// - Every pointer argument of an op is a device pointer (host memory on the CPU backend).
// - Activations are fp32 ([rows, cols], row-major). Weights are fp32 or bf16, stored as
//   Hugging Face does: [out_features, in_features]. KV blocks are fp32 or bf16.
// - Ops are enqueued in order on the device's compute stream and return nothing; a device
//   fault surfaces as a Status from the next Synchronize or copy. Shape preconditions are
//   invariants (MS_CHECK), validated by the caller beforehand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/host_buffer.h"
#include "core/status.h"

namespace moeserve {

class Backend;

// An owned allocation on a backend's device; freed (and returned to the device's capacity)
// on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  bool empty() const { return data_ == nullptr; }

 private:
  void Release();
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// How a weight matrix's elements are ordered in memory (kernels/weight_layout.h).
enum class WeightLayout : int32_t {
  kRowMajor = 0,  // [rows][cols], as checkpoints store it
  kTiled8 = 1,    // tiles of 8 rows, each [cols / 8][8 rows][8 cols] (the CPU fast path's GEMM order)
  kAmxTiles = 2,  // groups of 32 rows, each [cols / 32][2][16 column pairs][16 rows][2]: AMX B tiles
};

// Columns that share one scale in an FP8 weight.
constexpr int64_t kFp8ScaleCols = 128;

// A weight matrix [rows = out_features, cols = in_features] on the device. FP8 weights
// (kF8E4M3, row-major) carry one fp32 scale per row and kFp8ScaleCols columns: element (r, c)
// is fp8[r, c] x scales[r * ceil(cols / 128) + c / 128] (a checkpoint's 128 x 128 block scales
// repeat over the block's rows).
struct WeightRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  WeightLayout layout = WeightLayout::kRowMajor;
  const float* scales = nullptr;
};

// Where a layer's K and V live inside the paged cache. Each block holds, contiguously, the K
// and V of `block_size` tokens for every layer: [num_layers][planes][block_size][kv_heads][head_dim],
// so that a whole block moves between tiers as one contiguous copy. planes is 2 (K, then V) for
// multi-head attention, 1 for latent attention (MLA), whose one row per token holds the latent
// (which serves as the value too) followed by the shared rotary key.
struct KvLayout {
  // Version of what a block's bytes mean (element order above, RoPE applied to K before it is
  // stored): part of every prefix-cache key, so a build that changes it never reads old blocks.
  static constexpr uint32_t kFormatVersion = 1;

  int64_t num_blocks = 0;
  int64_t num_layers = 0;
  int64_t block_size = 16;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t planes = 2;
  DType dtype = DType::kF32;

  int64_t TokenElems() const { return kv_heads * head_dim; }
  int64_t BlockElems() const { return num_layers * planes * block_size * TokenElems(); }
  size_t BlockBytes() const { return static_cast<size_t>(BlockElems()) * DTypeSize(dtype); }
  // Element offset of (block, layer, k_or_v, slot-in-block).
  int64_t Offset(int64_t block, int64_t layer, int kv, int64_t slot) const {
    return ((block * num_layers + layer) * planes + kv) * block_size * TokenElems() +
           slot * TokenElems();
  }
};

// Which query tokens attend to what: token t belongs to sequence seq[t] at position pos[t]
// and attends causally to positions [0, pos[t]] of that sequence, read through the sequence's
// row of the block table. This single form covers prefill, chunked prefill and batched decode.
struct AttentionBatch {
  const int32_t* token_seq = nullptr;     // [num_tokens]
  const int32_t* token_pos = nullptr;     // [num_tokens]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t max_blocks_per_seq = 0;
};

// How one row of logits becomes a token (Backend::SampleRows). Plain data, the same bytes on
// the host and the device.
struct SampleSpec {
  double u = 0;             // uniform in [0, 1), drawn from the request's own random stream
  float temperature = 0;    // 0: greedy (the largest logit, the lowest id among ties)
  float top_p = 1;          // (0, 1]: the smallest most-likely prefix holding this mass
  int32_t top_k = 0;        // 0: no limit
  float min_p = 0;          // [0, 1]: tokens less likely than min_p x the likeliest dropped first
};

// A change to one logit before sampling (Backend::EditLogits), in vLLM's order: the bias first
// (logit_bias; -inf bans a token, as min_tokens does with stop tokens), then the repetition
// penalty (a positive logit divided by it, a negative one multiplied), then `subtract`
// (frequency x count + presence). Plain data, the same bytes on the host and the device.
struct LogitEdit {
  int32_t row = 0;          // the logit row
  int32_t token = 0;        // the column; at most one edit per (row, token)
  float bias = 0;
  float repetition = 1;     // > 0; 1: none
  float subtract = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string Name() const = 0;

  // Names the arithmetic that produces KV values (kernels and their operation order), with a
  // version bumped whenever a change alters the bytes: part of every prefix-cache key, so KV
  // computed by another backend or an older kernel is never served as this one's.
  virtual std::string KernelNumerics() const = 0;

  // The layout this backend's GEMMs read fastest for weights of `dtype`; weights are uploaded in
  // it (kernels/weight_layout.h). Every op also accepts kRowMajor.
  virtual WeightLayout PreferredWeightLayout(DType /*dtype*/) const { return WeightLayout::kRowMajor; }

  // ---- memory ----
  // Allocates `bytes` on the device; RESOURCE_EXHAUSTED when its capacity would be exceeded.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual size_t capacity_bytes() const = 0;
  virtual size_t used_bytes() const = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;

  // ---- host memory and the copy stream (KV tiers: demotion, promotion, swap) ----
  // Host memory that device copies go to and from: pinned (page-locked) under CUDA, so that
  // copies run at the host link's speed and asynchronously; ordinary memory on the CPU.
  virtual absl::StatusOr<HostBuffer> AllocateHost(size_t bytes) = 0;
  // Enqueues a copy between device and host memory (either way) on the device's copy stream,
  // beside the compute stream, and returns its ticket (1, 2, 3, ...). The copy sees everything
  // that compute work enqueued before the call wrote. Compute work sees what it wrote, or stops
  // reading its source, only if enqueued after OrderComputeAfterCopies(); the host may touch
  // the host side only after WaitCopy(ticket).
  virtual absl::StatusOr<uint64_t> CopyAsync(void* dst, const void* src, size_t bytes) = 0;
  // Blocks until the copy with this ticket, and every one before it, is done.
  virtual absl::Status WaitCopy(uint64_t ticket) = 0;
  // Compute work enqueued from now on waits for every copy issued so far (on the device; the
  // host does not block).
  virtual void OrderComputeAfterCopies() = 0;

  // ---- ops ----
  // out[i, :] = table[ids[i], :] as fp32.  table: [vocab, hidden]
  virtual void Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) = 0;

  // y = x @ w^T (+ y when accumulate).  x: [m, w.cols], y: [m, w.rows]
  virtual void Gemm(const float* x, int64_t m, const WeightRef& w, float* y,
                    bool accumulate = false) = 0;

  // Several GEMMs of the same rows, none accumulating: y[i] = x @ w[i]^T, each with Gemm's bits.
  // A backend may share work between them (the CPU rounds x once and runs them in one parallel
  // region); by default, one Gemm each.
  virtual void Gemms(const float* x, int64_t m, std::span<const WeightRef> w, std::span<float* const> y) {
    MS_CHECK(w.size() == y.size());
    for (size_t i = 0; i < w.size(); ++i) Gemm(x, m, w[i], y[i], false);
  }

  // Grouped GEMM for experts: rows [offsets[g], offsets[g+1]) of x are multiplied by w[g].
  // offsets: w.size() + 1 values in device memory (as PlanRouting writes them), so that a MoE
  // layer enqueues its experts without a host round trip; `max_rows` (known on the host, e.g.
  // tokens x top-k) bounds offsets.back(). The w[g] share one shape and dtype.
  // x: [offsets.back(), cols], y: [.., rows]
  virtual void GroupedGemm(const float* x, std::span<const WeightRef> w, const int64_t* offsets,
                           int64_t max_rows, float* y) = 0;

  // y[r, :] = x[r, :] / rms(x[r, :]) * weight.  x, y: [rows, dim]; y may equal x.
  virtual void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                       float* y) = 0;

  // y += x, elementwise over n values.
  virtual void Add(float* y, const float* x, int64_t n) = 0;
  // y[r, :] += bias for each of `rows` rows of `dim`.
  virtual void AddBias(float* y, const float* bias, int64_t rows, int64_t dim) = 0;

  // Rotary embedding, Hugging Face rotate-half convention, applied in place.
  // q: [n, q_heads, head_dim], k: [n, kv_heads, head_dim], positions: [n]
  virtual void Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads,
                    int64_t kv_heads, int64_t head_dim, float theta) = 0;

  // out[r, :] = silu(gate_up[r, :inter]) * gate_up[r, inter:].  gate_up: [rows, 2*inter]
  virtual void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) = 0;

  // The experts' MLP: out = act w2^T with act = silu(x w13_gate^T) * (x w13_up^T) for the rows
  // of each expert (w13 [gate; up], 2*inter rows; w2 [hidden, inter]), as GroupedGemm into
  // gate_up [max_rows, 2*inter], SiluMul into act [max_rows, inter], GroupedGemm into out
  // (offsets.back() == max_rows). A backend that fuses them overrides this with the same bits
  // and may leave gate_up and act unwritten.
  virtual void GroupedSwiGluMlp(const float* x, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                                const int64_t* offsets, int64_t max_rows, int64_t inter, float* gate_up, float* act,
                                float* out) {
    GroupedGemm(x, w13, offsets, max_rows, gate_up);
    SiluMul(gate_up, max_rows, inter, act);
    GroupedGemm(act, w2, offsets, max_rows, out);
  }

  // Router: softmax over logits [n, num_experts], then the top-k experts per row (ties to the
  // lower index), their probabilities renormalised to sum to one when `renormalize`.
  virtual void RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k,
                          bool renormalize, int32_t* expert_ids, float* expert_weights) = 0;

  // Plans the expert dispatch on the device from the router's ids [n, k] (each in
  // [0, num_experts)): the n*k assignments (token i / k, slot i % k) sorted by expert, stably
  // (token order within an expert). offsets [num_experts + 1]: expert e's sorted rows are
  // [offsets[e], offsets[e+1]); gather_rows [n*k]: the token of each sorted row; combine_rows
  // [n*k]: the sorted row of each assignment. All device memory.
  virtual void PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts,
                           int64_t* offsets, int32_t* gather_rows, int32_t* combine_rows) = 0;

  // Gathers rows for expert dispatch: out[i, :] = x[src_rows[i], :].  out: [n, dim]
  virtual void GatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim,
                          float* out) = 0;
  // Composes two row maps: out[i] = first[second[i]] for i < n (out may be `second`).
  virtual void ComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) = 0;

  // Whether the grouped GEMM over expert weights of `weight_dtype` rounds its activations to
  // bf16 before multiplying (the CPU's avx512-bf16 and AMX kernels): rows bound for it may then
  // travel as bf16 without changing a bit of the result.
  virtual bool RoundsActivationsToBf16(DType weight_dtype) const { return false; }
  // out[i] = bf16(x[i]), rounded to nearest even (a NaN stays a quiet NaN), n values.
  virtual void RoundToBf16(const float* x, int64_t n, uint16_t* out) = 0;
  // out[i] = x[i] widened to fp32 (exact), n values.
  virtual void WidenBf16(const uint16_t* x, int64_t n, float* out) = 0;

  // Combines expert outputs: out[t, :] (+)= sum_j weights[t, j] * y[rows[t, j], :].
  // rows, weights: [n, k]; y: [.., dim]; out: [n, dim]
  virtual void ScatterCombine(const float* y, const int32_t* rows, const float* weights,
                              int64_t n, int64_t k, int64_t dim, float* out, bool accumulate) = 0;

  // Multiplies row r of x [rows, dim] by sigmoid(gate[r]) (shared-expert gate).
  virtual void SigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim) = 0;

  // Writes this step's K and V into the paged cache.  k, v: [n, kv_heads, head_dim];
  // slots[i] = block * block_size + offset.
  virtual void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n,
                       const KvLayout& layout, int64_t layer, void* cache) = 0;

  // Picks one token per row of logits [rows, vocab] as engine/sampling.h's Sampler does: in the
  // order (logit descending, lower id first) keep the top_k, then the smallest prefix whose
  // probability at `temperature` reaches top_p, then the token where the cumulative
  // probability first exceeds u. specs: [rows]; tokens: [rows].
  virtual void SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs,
                          int32_t* tokens) = 0;
  // Applies `edits` [n] (device memory, each (row, token) once) to logits [rows, vocab] in place.
  virtual void EditLogits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) = 0;

  // Whether Gemm and GroupedGemm take FP8 weights; a model that has them is refused at load on
  // a backend that does not.
  virtual bool HasFp8Weights() const { return false; }

  // ---- multi-head latent attention (DeepSeek) and its routing ----
  // Whether this backend implements the four ops below (DeepSeek's and GLM's); a model that
  // needs them is refused at load on one that does not.
  virtual bool HasLatentAttention() const { return false; }

  // Rotary embedding with given frequencies (YaRN's, say), rotate-half convention, in place, on
  // the first `rotary_dim` values of each head (GLM rotates half; the rest pass through); cos
  // and sin are multiplied by `cos_sin_scale` (YaRN's attention factor) as transformers does.
  // x: [n, heads, head_dim], inv_freq: [rotary_dim / 2] device memory.
  virtual void RopeScaled(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                          int64_t rotary_dim, const float* inv_freq, float cos_sin_scale);

  // DeepSeek's router: scores = softmax or sigmoid of logits [n, num_experts]; the choice
  // ranks scores + bias (bias: [num_experts] or null), limited to the best `topk_group` of
  // `n_group` equal groups (a group scored by its best member, or its best two summed); the
  // weights are the unbiased scores of the chosen, renormalised when asked, times `scaling`.
  struct GroupedRouting {
    int64_t num_experts = 0, top_k = 0, n_group = 1, topk_group = 1;
    bool sigmoid = false;
    bool group_top_two_sum = false;  // false: a group's score is its best member's
    bool renormalize = false;
    float scaling = 1.0f;
  };
  virtual void RouterGroupedTopK(const float* logits, int64_t n, const GroupedRouting& spec, const float* bias,
                                 int32_t* expert_ids, float* expert_weights);

  // Writes this step's latent [n, latent_dim] and rotary key [n, head_dim - latent_dim] as one
  // row per token into a planes == 1 cache (kv_heads 1).
  virtual void WriteLatentKv(const float* latent, const float* rope, const int64_t* slots, int64_t n,
                             int64_t latent_dim, const KvLayout& layout, int64_t layer, void* cache);

  // Paged causal attention of `heads` query heads against the cached rows (MLA's absorbed
  // form): a head's score against a token is q_latent . latent + q_rope . rotary key, and its
  // output the softmax-weighted sum of the latents.
  // q_latent: [n, heads, latent_dim], q_rope: [n, heads, head_dim - latent_dim],
  // out: [n, heads, latent_dim]
  virtual void PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                                    const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                                    int64_t latent_dim, float scale, float* out);

  // Paged causal attention with grouped-query heads.
  // q: [num_tokens, q_heads, head_dim] -> out: [num_tokens, q_heads, head_dim]
  virtual void PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                              int64_t layer, const void* cache, int64_t q_heads, float scale,
                              float* out) = 0;

 protected:
  friend class DeviceBuffer;
  virtual void Free(void* data, size_t bytes) = 0;
};

}  // namespace moeserve
