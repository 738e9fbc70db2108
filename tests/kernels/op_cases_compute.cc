// The op cases that compute (see op_cases.h): GEMMs, the routing a grouped GEMM runs on, paged
// attention, logit edits and sampling.
#include <algorithm>
#include <array>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "tests/kernels/op_case_io.h"
#include "tests/kernels/op_cases.h"

namespace moeserve::testing {
namespace {

// A weight [rows, cols] of `dt` (row-major) in the backend's memory; bf16 rounds the values.
WeightRef UpWeight(DeviceIo& io, const std::vector<float>& values, DType dt, int64_t rows, int64_t cols) {
  WeightRef w;
  w.dtype = dt;
  w.rows = rows;
  w.cols = cols;
  if (dt == DType::kF32) {
    w.data = io.Up(values);
    return w;
  }
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) half[i] = F32ToBf16(values[i]);
  w.data = io.Up(half);
  return w;
}

// The activations of bf16-weight GEMMs may be rounded to bf16 (avx512-bf16, AMX, the GPU):
// about 2^-9 of each product, over k products of 0.1-scaled weights.
double GemmAtol(DType dt) { return dt == DType::kF32 ? 1e-4 : 4e-2; }
double GemmRtol(DType dt) { return dt == DType::kF32 ? 1e-4 : 2e-2; }

void AddGemmCases(std::vector<OpCase>* cases) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 96, 80}, {7, 65, 300}, {64, 129, 64}}) {
      for (bool acc : {false, true}) {
        cases->push_back({absl::StrCat("Gemm ", m, "x", k, " by ", n, "x", k, " ", DTypeShortName(dt), acc ? ", accumulating" : ""),
                          GemmAtol(dt), GemmRtol(dt), [dt, m, n, k, acc](Backend& b, std::mt19937& g) {
                            DeviceIo io(b);
                            const float* x = io.Up(Normal(g, m * k));
                            const WeightRef w = UpWeight(io, Normal(g, n * k, 0.1f), dt, n, k);
                            float* y = io.Up(Normal(g, m * n));
                            b.Gemm(x, m, w, y, acc);
                            return io.Down(y, m * n);
                          }});
      }
    }
  }
}

// A random routing of n tokens to top-4 of 16 experts (the last 3 never chosen), planned by the
// backend: its expert offsets, gather rows and combine rows, on the device.
constexpr int64_t kPlanExperts = 16, kPlanTopK = 4;
struct PlannedRouting {
  int64_t* offsets;
  int32_t* gather;
  int32_t* combine;
};
PlannedRouting PlanRandomRouting(Backend& b, DeviceIo& io, std::mt19937& g, int64_t n) {
  std::vector<int32_t> ids(n * kPlanTopK);
  for (auto& e : ids) e = static_cast<int32_t>(g() % (kPlanExperts - 3));
  PlannedRouting r{io.Up(std::vector<int64_t>(kPlanExperts + 1)), io.Up(std::vector<int32_t>(n * kPlanTopK)),
                   io.Up(std::vector<int32_t>(n * kPlanTopK))};
  b.PlanRouting(io.Up(ids), n, kPlanTopK, kPlanExperts, r.offsets, r.gather, r.combine);
  return r;
}

// Routing planned on the backend: its offsets, gather and combine rows, exactly. 16 experts, the
// last 3 empty; 700 x 4 rows is past the GPU's device-planned grouped GEMM (kHostPlanRows).
void AddRoutingPlanCases(std::vector<OpCase>* cases) {
  for (int64_t n : {5, 70, 700}) {
    cases->push_back({absl::StrCat("PlanRouting, ", n, " tokens x top-4 of 16"), 0, 0, [n](Backend& b, std::mt19937& g) {
                        DeviceIo io(b);
                        const PlannedRouting r = PlanRandomRouting(b, io, g, n);
                        std::vector<double> out = io.Down(r.offsets, kPlanExperts + 1);
                        Append(&out, io.Down(r.gather, n * kPlanTopK));
                        Append(&out, io.Down(r.combine, n * kPlanTopK));
                        return out;
                      }});
  }
}

// The grouped GEMM over the device offsets such a plan writes (its outputs only, so that the
// tolerance is the GEMM's).
void AddGroupedGemmCases(std::vector<OpCase>* cases) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {5, 700}) {
      cases->push_back({absl::StrCat("GroupedGemm over a planned routing, ", n, " tokens x top-4 of 16, ", DTypeShortName(dt)),
                        GemmAtol(dt), GemmRtol(dt), [dt, n](Backend& b, std::mt19937& g) {
                          const int64_t rows = 48, cols = 80, k = kPlanTopK;
                          DeviceIo io(b);
                          const PlannedRouting r = PlanRandomRouting(b, io, g, n);
                          std::vector<WeightRef> w;
                          for (int64_t e = 0; e < kPlanExperts; ++e) w.push_back(UpWeight(io, Normal(g, rows * cols, 0.1f), dt, rows, cols));
                          const float* x = io.Up(Normal(g, n * k * cols));
                          float* y = io.Up(std::vector<float>(n * k * rows));
                          b.GroupedGemm(x, w, r.offsets, n * k, y);
                          return io.Down(y, n * k * rows);
                        }});
    }
  }
}

// Two sequences in a paged cache of scattered blocks: one prefilling 37 tokens, one decoding its
// 22nd. K and V are written by the backend's own WriteKv (a case of its own).
std::vector<double> RunAttention(Backend& b, std::mt19937& g, DType dt, int64_t head_dim) {
  KvLayout layout;
  layout.num_blocks = 12;
  layout.num_layers = 2;
  layout.block_size = 16;
  layout.kv_heads = 2;
  layout.head_dim = head_dim;
  layout.dtype = dt;
  const int64_t q_heads = 4, te = layout.TokenElems(), max_blocks = 3;
  std::vector<int32_t> blocks(12);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), g);
  const std::vector<int32_t> tables = {blocks[0], blocks[1], blocks[2], blocks[3], blocks[4], 0};
  const int64_t lengths[2] = {37, 22};
  std::vector<int64_t> slots;
  std::vector<int32_t> seq, pos;  // the tokens that ask: all of the first, the last of the second
  for (int32_t s = 0; s < 2; ++s) {
    for (int32_t p = 0; p < lengths[s]; ++p) {
      slots.push_back(int64_t{tables[s * max_blocks + p / 16]} * 16 + p % 16);
      if (s == 0 || p == lengths[s] - 1) {
        seq.push_back(s);
        pos.push_back(p);
      }
    }
  }
  DeviceIo io(b);
  const int64_t written = static_cast<int64_t>(slots.size()), n = static_cast<int64_t>(seq.size());
  const size_t bytes = layout.BlockBytes() * 12;
  uint8_t* cache = io.Up(std::vector<uint8_t>(bytes));
  b.WriteKv(io.Up(Normal(g, written * te)), io.Up(Normal(g, written * te)), io.Up(slots), written, layout, 1, cache);
  const float* q = io.Up(Normal(g, n * q_heads * head_dim));
  AttentionBatch batch{io.Up(seq), io.Up(pos), io.Up(tables), n, 2, max_blocks};
  float* out = io.Up(std::vector<float>(n * q_heads * head_dim));
  b.PagedAttention(q, batch, layout, 1, cache, q_heads, 1.0f / std::sqrt(static_cast<float>(head_dim)), out);
  return io.Down(out, n * q_heads * head_dim);
}

}  // namespace

void AddMatmulCases(std::vector<OpCase>* cases) {
  AddGemmCases(cases);
  AddRoutingPlanCases(cases);
  AddGroupedGemmCases(cases);
}

void AddAttentionCases(std::vector<OpCase>* cases) {
  // A bf16 cache of head size 32/64/128/256 may run on vdpbf16ps (queries and probabilities
  // rounded to bf16, kernels/cpu/attention_bf16.h): outputs within about 2^-8 of |v| ~ 1.
  for (auto [dt, hd] : std::vector<std::pair<DType, int64_t>>{
           {DType::kF32, 16}, {DType::kF32, 128}, {DType::kBF16, 80}, {DType::kBF16, 64}, {DType::kBF16, 128}}) {
    const bool rounded = dt == DType::kBF16 && hd != 80;
    cases->push_back({absl::StrCat("PagedAttention, ", DTypeShortName(dt), " cache, head size ", hd),
                      rounded ? 2e-2 : 1e-5, rounded ? 2e-2 : 1e-4,
                      [dt, hd](Backend& b, std::mt19937& g) { return RunAttention(b, g, dt, hd); }});
  }
}

void AddSamplingCases(std::vector<OpCase>* cases) {
  // Penalties, biases and bans (-inf: reported as a 0 logit and a 1 in the bans that follow).
  cases->push_back({"EditLogits 9 rows of 1001", 1e-6, 1e-6, [](Backend& b, std::mt19937& g) {
                      const int64_t rows = 9, vocab = 1001;
                      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                      std::vector<LogitEdit> edits;
                      for (int32_t r = 0; r < rows; ++r) {
                        for (int32_t t = static_cast<int32_t>(g() % 7); t < vocab; t += 1 + static_cast<int32_t>(g() % 50)) {
                          LogitEdit e{r, t, 50 * u(g), 1.0f + std::fabs(u(g)), 2 * u(g)};
                          if (g() % 10 == 0) e.bias = -std::numeric_limits<float>::infinity();
                          edits.push_back(e);
                        }
                      }
                      DeviceIo io(b);
                      float* logits = io.Up(Normal(g, rows * vocab, 4.0f));
                      b.EditLogits(logits, vocab, io.Up(edits), static_cast<int64_t>(edits.size()));
                      std::vector<double> out = io.Down(logits, rows * vocab), banned(out.size());
                      for (size_t i = 0; i < out.size(); ++i) {
                        banned[i] = std::isinf(out[i]) && out[i] < 0 ? 1 : 0;
                        if (banned[i] != 0) out[i] = 0;
                      }
                      Append(&out, banned);
                      return out;
                    }});
  // Rows whose token does not depend on the draw: greedy (ties to the lowest id) and top-1 at a
  // temperature. (Draws against the host rule: sample_ops_test, and cuda_test on the GPU.)
  cases->push_back({"SampleRows greedy and top-1, 64 rows of 3001 with ties", 0, 0, [](Backend& b, std::mt19937& g) {
                      const int64_t rows = 64, vocab = 3001;
                      std::vector<float> logits = Normal(g, rows * vocab, 3.0f);
                      for (int64_t i = 0; i < rows * vocab; i += 2) logits[i] = std::round(logits[i]);  // ties
                      std::vector<SampleSpec> specs(rows);
                      std::uniform_real_distribution<double> unit(0.0, 1.0);
                      for (int64_t r = 0; r < rows; ++r) {
                        specs[r].temperature = r % 2 ? 0.8f : 0.0f;
                        specs[r].top_k = r % 2 ? 1 : 0;
                        specs[r].u = unit(g);
                      }
                      DeviceIo io(b);
                      int32_t* tokens = io.Up(std::vector<int32_t>(rows));
                      b.SampleRows(io.Up(logits), rows, vocab, io.Up(specs), tokens);
                      return io.Down(tokens, rows);
                    }});
}

}  // namespace moeserve::testing
