// CpuBackend: dispatch to the reference or fast op implementations (its arena and copies:
// cpu_backend_memory.cc).
#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_select.h"
#include "kernels/cpu/latent_ops.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/sample_ops.h"

namespace moeserve {
namespace {

constexpr int64_t kBf16FusedMinRows = 16;  // rows per expert hit from which avx512-bf16 fuses the MLP

size_t DefaultCapacity() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return size_t{8} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size) / 4 * 3;
}

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options) : options_(options) {
  if (options_.capacity_bytes == 0) options_.capacity_bytes = DefaultCapacity();
  if (fast()) {
    const absl::StatusOr<CpuIsa> isa = ChooseCpuIsa(options_.isa, options_.numerics);
    MS_CHECK_OK(isa.status());
    isa_ = *isa;
    pool_ = std::make_unique<ThreadPool>(options_.num_threads);
    // Our pool parallelises across GEMM tiles; each tile is a single-threaded sgemm.
    openblas_set_num_threads(1);
  }
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::Name() const {
  if (!fast()) return "cpu (reference)";
  return absl::StrCat("cpu (fast", options_.batch_invariant ? ", batch-invariant" : ", OpenBLAS", ", ",
                      CpuIsaName(isa_), ", ", num_threads(), " threads)");
}

std::string CpuBackend::KernelNumerics() const {
  if (!fast()) return "cpu-reference-1";
  // -3: attention over contexts past 512 keys in chunks, weighed together (attention_chunks.h);
  // -4: the chunks folded in order as they come (FoldChunk), not weighed once all are done.
  const std::string base = options_.batch_invariant ? "cpu-fast-4" : "cpu-fast-blas-4";
  // -2: attention over a bf16 cache rounds queries and probabilities to bf16 (Bf16Attention);
  // -3: its products on AMX tiles; -4: on vdpbf16ps with the AMX kernel's 16-lane softmax (the
  // exact kernel's 8-lane one before, -2); -5: contexts past 512 keys in chunks, weighed together
  // (attention_chunks.h); -6 (amx: -4): latent (MLA) attention on vdpbf16ps too (attention_latent.h);
  // -7 (amx: -5): its contexts past 512 keys in chunks; -8 (amx: -6): its scores over whole rows,
  // each lane's chain summed by a tree (ScoreLatentKeysBf16), not four chains over key pairs;
  // amx -7: its multi-head attention's contexts past 512 keys in chunks too (attention_amx.h);
  // amx -8: its latent attention on tiles (AttendLatentAmx).
  if (!RoundsActivations(isa_)) return base;
  return absl::StrCat(base, "-", CpuIsaName(isa_), Bf16Attention() ? "-8" : "-1");
}

bool CpuBackend::AmxAttention() const {
  return Bf16Attention() && IsAmx(isa_);
}

bool CpuBackend::Bf16Attention() const {
  return fast() && options_.batch_invariant && RoundsActivations(isa_) && DetectCpuFeatures().avx512_bf16;
}

WeightLayout CpuBackend::PreferredWeightLayout(DType dtype) const {
  if (!fast()) return WeightLayout::kRowMajor;
  return IsAmx(isa_) && dtype == DType::kBF16 ? WeightLayout::kAmxTiles : WeightLayout::kTiled8;
}

void CpuBackend::Embedding(const int32_t* ids, int64_t n, const WeightRef& table, float* out) {
  if (fast()) return cpu_fast::Embedding(*pool_, ids, n, table, out);
  cpu_ref::Embedding(ids, n, table, out);
}

void CpuBackend::Gemm(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) {
  if (fast() && w.dtype == DType::kF8E4M3) {
    return cpu_fast::GemmFp8On(isa_, *pool_, x, m, w, y, accumulate);
  }
  if (fast()) return cpu_fast::Gemm(*pool_, x, m, w, y, accumulate, options_.batch_invariant, isa_);
  cpu_ref::Gemm(x, m, w, y, accumulate);
}

void CpuBackend::Gemms(const float* x, int64_t m, std::span<const WeightRef> w, std::span<float* const> y) {
  const bool fp8 = std::any_of(w.begin(), w.end(), [](const WeightRef& r) { return r.dtype == DType::kF8E4M3; });
  if (!fast() || fp8) return Backend::Gemms(x, m, w, y);
  cpu_fast::Gemms(*pool_, x, m, w, y, options_.batch_invariant, isa_);
}

void CpuBackend::GroupedGemm(const float* x, std::span<const WeightRef> w, const int64_t* offsets_data,
                             int64_t max_rows, float* y) {
  // Device memory is host memory here: the offsets are read in place.
  const std::span<const int64_t> offsets(offsets_data, w.size() + 1);
  MS_CHECK(offsets.back() <= max_rows);
  if (fast() && !w.empty() && w[0].dtype == DType::kF8E4M3) {
    return cpu_fast::GroupedGemmFp8On(isa_, *pool_, x, w, offsets, y);
  }
  if (fast()) return cpu_fast::GroupedGemm(*pool_, x, w, offsets, y, options_.batch_invariant, isa_);
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    Gemm(x + offsets[g] * w[g].cols, rows, w[g], y + offsets[g] * w[g].rows, false);
  }
}

bool CpuBackend::RoundsActivationsToBf16(DType weight_dtype) const {
  // As GroupedGemm chooses: FP8 experts under a rounding variant always; bf16 experts on the
  // batch-invariant kernels (OpenBLAS multiplies fp32 activations).
  if (!fast() || !RoundsActivations(isa_)) return false;
  return weight_dtype == DType::kF8E4M3 || (weight_dtype == DType::kBF16 && options_.batch_invariant);
}

void CpuBackend::RoundToBf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(x[i]);
}

void CpuBackend::WidenBf16(const uint16_t* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(x[i]);
}

void CpuBackend::RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                         float* y) {
  if (fast()) return cpu_fast::RmsNorm(*pool_, x, weight, rows, dim, eps, y);
  cpu_ref::RmsNorm(x, weight, rows, dim, eps, y);
}

void CpuBackend::Add(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::AddBias(float* y, const float* bias, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) Add(y + r * dim, bias, dim);
}

void CpuBackend::Rope(float* q, float* k, const int32_t* positions, int64_t n, int64_t q_heads,
                      int64_t kv_heads, int64_t head_dim, float theta) {
  if (fast()) return cpu_fast::Rope(*pool_, q, k, positions, n, q_heads, kv_heads, head_dim, theta, &rope_table_);
  cpu_ref::Rope(q, k, positions, n, q_heads, kv_heads, head_dim, theta);
}

bool CpuBackend::FusesGateUpSilu(std::span<const WeightRef> w13, int64_t inter) const {
  // As GroupedGemm would run them: the batch-invariant kernels of this variant. An EP rank's
  // list holds placeholders (no data, never given rows) for the experts of other ranks: its
  // own experts decide.
  const auto held = std::find_if(w13.begin(), w13.end(), [](const WeightRef& w) { return w.data != nullptr; });
  return fast() && options_.batch_invariant && held != w13.end() && cpu_fast::SwiGluFusable(isa_, *held, inter);
}

void CpuBackend::GroupedSwiGluMlp(const float* x, std::span<const WeightRef> w13, std::span<const WeightRef> w2,
                                  const int64_t* offsets, int64_t max_rows, int64_t inter, float* gate_up, float* act,
                                  float* out) {
  // The fused path runs the w2 GEMMs itself: bf16 experts only (FP8 ones keep GroupedGemm's).
  const bool bf16_w2 = std::all_of(w2.begin(), w2.end(), [&](const WeightRef& w) {
    return w.data == nullptr || (w.dtype == DType::kBF16 && w.cols == inter);
  });
  // avx512-bf16 fuses where the experts average kBf16FusedMinRows rows or more: a decode step's
  // few rows per expert streamed the weights faster unfused (batch-1 steps 1.1x slower fused,
  // Zen 5). Fused or not, every output has the same bits.
  int64_t experts_hit = 0;
  for (size_t g = 0; g < w13.size(); ++g) experts_hit += offsets[g + 1] > offsets[g] ? 1 : 0;
  const bool enough_rows = IsAmx(isa_) || offsets[w13.size()] >= kBf16FusedMinRows * experts_hit;
  if (bf16_w2 && enough_rows && FusesGateUpSilu(w13, inter)) {
    const std::span<const int64_t> groups(offsets, w13.size() + 1);
    MS_CHECK(groups.back() <= max_rows);
    return cpu_fast::GroupedSwiGluMlp(*pool_, x, w13, w2, groups, inter, act, out, isa_);
  }
  Backend::GroupedSwiGluMlp(x, w13, w2, offsets, max_rows, inter, gate_up, act, out);
}

void CpuBackend::SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  if (fast()) return cpu_fast::SiluMul(*pool_, gate_up, rows, inter, out);
  cpu_ref::SiluMul(gate_up, rows, inter, out);
}

void CpuBackend::RouterTopK(const float* logits, int64_t n, int64_t num_experts, int64_t k,
                            bool renormalize, int32_t* expert_ids, float* expert_weights) {
  if (fast()) return cpu_fast::RouterTopK(logits, n, num_experts, k, renormalize, expert_ids, expert_weights);
  cpu_ref::RouterTopK(logits, n, num_experts, k, renormalize, expert_ids, expert_weights);
}

void CpuBackend::PlanRouting(const int32_t* expert_ids, int64_t n, int64_t k, int64_t num_experts,
                             int64_t* offsets, int32_t* gather_rows, int32_t* combine_rows) {
  cpu_ref::PlanRouting(expert_ids, n, k, num_experts, offsets, gather_rows, combine_rows);  // integers only
}

void CpuBackend::GatherRows(const float* x, const int32_t* src_rows, int64_t n, int64_t dim,
                            float* out) {
  auto copy = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      std::memcpy(out + i * dim, x + static_cast<int64_t>(src_rows[i]) * dim, dim * sizeof(float));
    }
  };
  // A prefill's expert gather is megabytes a layer: from 1 MiB on, on every thread in chunks of
  // at least 64 KiB (a plain copy: the split changes no bits). A decode step's is kilobytes,
  // where waking the pool costs more than it saves (kernels_bench's BM_GatherRows).
  if (fast() && n * dim >= (int64_t{1} << 18)) {
    return pool_->ParallelFor(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim)), copy);
  }
  copy(0, n);
}

void CpuBackend::ComposeIndices(const int32_t* first, const int32_t* second, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = first[second[i]];
}

void CpuBackend::ScatterCombine(const float* y, const int32_t* rows, const float* weights,
                                int64_t n, int64_t k, int64_t dim, float* out, bool accumulate) {
  if (fast()) return cpu_fast::ScatterCombine(*pool_, y, rows, weights, n, k, dim, out, accumulate);
  cpu_ref::ScatterCombine(y, rows, weights, n, k, dim, out, accumulate);
}

void CpuBackend::SigmoidScaleRows(float* x, const float* gate, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gate[r]));
    for (int64_t c = 0; c < dim; ++c) x[r * dim + c] *= s;
  }
}

void CpuBackend::WriteKv(const float* k, const float* v, const int64_t* slots, int64_t n,
                         const KvLayout& layout, int64_t layer, void* cache) {
  RunOrderedCopies();
  if (fast()) return cpu_fast::WriteKv(*pool_, k, v, slots, n, layout, layer, cache);
  cpu_ref::WriteKv(k, v, slots, n, layout, layer, cache);
}

void CpuBackend::RopeScaled(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                            int64_t rotary_dim, const float* inv_freq, float cos_sin_scale) {
  cpu_ref::RopeScaled(x, positions, n, heads, head_dim, rotary_dim, inv_freq, cos_sin_scale);
}

void CpuBackend::RouterGroupedTopK(const float* logits, int64_t n, const GroupedRouting& spec, const float* bias,
                                   int32_t* expert_ids, float* expert_weights) {
  cpu_ref::RouterGroupedTopK(logits, n, spec, bias, expert_ids, expert_weights);
}

void CpuBackend::WriteLatentKv(const float* latent, const float* rope, const int64_t* slots, int64_t n,
                               int64_t latent_dim, const KvLayout& layout, int64_t layer, void* cache) {
  RunOrderedCopies();
  cpu_ref::WriteLatentKv(latent, rope, slots, n, latent_dim, layout, layer, cache);
}

void CpuBackend::PagedLatentAttention(const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                                      const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                                      int64_t latent_dim, float scale, float* out) {
  RunOrderedCopies();
  if (fast()) {
    const cpu_fast::AttentionKernel kernel =
        Bf16Attention() ? cpu_fast::AttentionKernelOf(isa_) : cpu_fast::AttentionKernel::kExact;
    return cpu_fast::PagedLatentAttention(*pool_, q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim,
                                          scale, out, kernel);
  }
  cpu_ref::PagedLatentAttention(q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim, scale, out);
}

void CpuBackend::PagedAttention(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                                int64_t layer, const void* cache, int64_t q_heads, float scale,
                                float* out) {
  MS_CHECK(layout.kv_heads > 0 && q_heads % layout.kv_heads == 0);
  RunOrderedCopies();
  if (fast()) {
    const cpu_fast::AttentionKernel kernel =
        Bf16Attention() ? cpu_fast::AttentionKernelOf(isa_) : cpu_fast::AttentionKernel::kExact;
    return cpu_fast::PagedAttention(*pool_, q, batch, layout, layer, cache, q_heads, scale, out, kernel);
  }
  cpu_ref::PagedAttention(q, batch, layout, layer, cache, q_heads, scale, out);
}

}  // namespace moeserve

namespace moeserve {

void CpuBackend::EditLogits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const LogitEdit& e = edits[i];
    float& l = logits[static_cast<int64_t>(e.row) * vocab + e.token];
    l = EditedLogit(l, e.bias, e.repetition, e.subtract);
  }
}

void CpuBackend::SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleSpec* specs,
                            int32_t* tokens) {
  for (int64_t r = 0; r < rows; ++r) tokens[r] = cpu_sample::SortSampleRow(logits + r * vocab, vocab, specs[r]);
}

}  // namespace moeserve
