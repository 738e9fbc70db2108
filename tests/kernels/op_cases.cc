// The op cases (see op_cases.h).
#include "tests/kernels/op_cases.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "tests/kernels/op_case_io.h"

namespace moeserve::testing {
namespace {

void AddNormCases(std::vector<OpCase>* cases) {
  for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {5, 64}, {67, 1000}}) {
    cases->push_back({absl::StrCat("RmsNorm ", rows, "x", dim), 1e-5, 1e-5, [rows, dim](Backend& b, std::mt19937& g) {
                        DeviceIo io(b);
                        const float* x = io.Up(Normal(g, rows * dim, 3.0f));
                        const float* w = io.Up(Normal(g, dim));
                        float* y = io.Up(std::vector<float>(rows * dim));
                        b.RmsNorm(x, w, rows, dim, 1e-5f, y);
                        return io.Down(y, rows * dim);
                      }});
  }
  cases->push_back({"RmsNorm in place, 60-wide heads", 1e-5, 1e-5, [](Backend& b, std::mt19937& g) {
                      DeviceIo io(b);
                      float* x = io.Up(Normal(g, 9 * 300));
                      const float* w = io.Up(Normal(g, 60));
                      b.RmsNorm(x, w, 9 * 300 / 60, 60, 1e-6f, x);
                      return io.Down(x, 9 * 300);
                    }});
}

void AddElementwiseCases(std::vector<OpCase>* cases) {
  for (auto [rows, inter] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {40, 300}}) {
    cases->push_back({absl::StrCat("SiluMul ", rows, "x", inter), 1e-6, 1e-5, [rows, inter](Backend& b, std::mt19937& g) {
                        DeviceIo io(b);
                        const float* gu = io.Up(Normal(g, rows * 2 * inter, 4.0f));
                        float* y = io.Up(std::vector<float>(rows * inter));
                        b.SiluMul(gu, rows, inter, y);
                        return io.Down(y, rows * inter);
                      }});
  }
  cases->push_back({"Add and AddBias 9x300", 1e-6, 1e-6, [](Backend& b, std::mt19937& g) {
                      DeviceIo io(b);
                      const auto x = Normal(g, 9 * 300), w = Normal(g, 300);
                      float* y = io.Up(x);
                      b.Add(y, io.Up(w), 300);
                      float* z = io.Up(x);
                      b.AddBias(z, io.Up(w), 9, 300);
                      std::vector<double> out = io.Down(y, x.size());
                      Append(&out, io.Down(z, x.size()));
                      return out;
                    }});
  cases->push_back({"SigmoidScaleRows 9x300", 1e-6, 1e-5, [](Backend& b, std::mt19937& g) {
                      DeviceIo io(b);
                      float* x = io.Up(Normal(g, 9 * 300));
                      b.SigmoidScaleRows(x, io.Up(Normal(g, 9)), 9, 300);
                      return io.Down(x, 9 * 300);
                    }});
  cases->push_back({"RoundToBf16 and WidenBf16, 1001 values", 0, 0, [](Backend& b, std::mt19937& g) {
                      DeviceIo io(b);
                      const float* x = io.Up(Normal(g, 1001, 100.0f));
                      uint16_t* h = io.Up(std::vector<uint16_t>(1001));
                      b.RoundToBf16(x, 1001, h);
                      float* w = io.Up(std::vector<float>(1001));
                      b.WidenBf16(h, 1001, w);
                      std::vector<double> out = io.Down(h, 1001);
                      Append(&out, io.Down(w, 1001));
                      return out;
                    }});
}

void AddRopeCases(std::vector<OpCase>* cases) {
  for (auto [n, qh, kh, hd] : std::vector<std::array<int64_t, 4>>{{13, 6, 2, 32}, {9, 4, 2, 80}}) {
    cases->push_back({absl::StrCat("Rope ", n, " tokens, ", qh, "/", kh, " heads of ", hd), 1e-5, 1e-5,
                      [n, qh, kh, hd](Backend& b, std::mt19937& g) {
                        DeviceIo io(b);
                        float* q = io.Up(Normal(g, n * qh * hd));
                        float* k = io.Up(Normal(g, n * kh * hd));
                        std::vector<int32_t> pos(static_cast<size_t>(n));
                        for (auto& p : pos) p = static_cast<int32_t>(g() % 5000);
                        b.Rope(q, k, io.Up(pos), n, qh, kh, hd, 10000.0f);
                        std::vector<double> out = io.Down(q, n * qh * hd);
                        Append(&out, io.Down(k, n * kh * hd));
                        return out;
                      }});
  }
}

void AddRoutingCases(std::vector<OpCase>* cases) {
  for (auto [n, e, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {5, 8, 2}, {33, 16, 4}, {7, 64, 8}}) {
    for (bool renorm : {true, false}) {
      // Ids compared as numbers: a different expert is off by at least 1 of at most 63.
      cases->push_back({absl::StrCat("RouterTopK ", n, " tokens, top-", k, " of ", e, renorm ? ", renormalized" : ""),
                        1e-6, 1e-5, [n, e, k, renorm](Backend& b, std::mt19937& g) {
                          DeviceIo io(b);
                          const float* logits = io.Up(Normal(g, n * e, 2.0f));
                          int32_t* ids = io.Up(std::vector<int32_t>(n * k));
                          float* w = io.Up(std::vector<float>(n * k));
                          b.RouterTopK(logits, n, e, k, renorm, ids, w);
                          std::vector<double> out = io.Down(ids, n * k);
                          Append(&out, io.Down(w, n * k));
                          return out;
                        }});
    }
  }
  for (bool accumulate : {false, true}) {
    cases->push_back({absl::StrCat("GatherRows and ScatterCombine 9 tokens x top-3 x 21", accumulate ? ", accumulating" : ""),
                      1e-6, 1e-5, [accumulate](Backend& b, std::mt19937& g) {
                        const int64_t n = 9, k = 3, dim = 21;
                        DeviceIo io(b);
                        const float* x = io.Up(Normal(g, n * dim));
                        std::vector<int32_t> rows(n * k);
                        std::iota(rows.begin(), rows.end(), 0);
                        std::shuffle(rows.begin(), rows.end(), g);
                        for (auto& r : rows) r %= n;
                        const int32_t* src = io.Up(rows);
                        float* gathered = io.Up(std::vector<float>(n * k * dim));
                        b.GatherRows(x, src, n * k, dim, gathered);
                        float* out = io.Up(Normal(g, n * dim));
                        b.ScatterCombine(gathered, src, io.Up(Normal(g, n * k)), n, k, dim, out, accumulate);
                        std::vector<double> all = io.Down(gathered, n * k * dim);
                        Append(&all, io.Down(out, n * dim));
                        return all;
                      }});
  }
  // The expert dispatch composes its send order with the routing plan in place (out = second).
  cases->push_back({"ComposeIndices of two random permutations of 37, in place", 0, 0, [](Backend& b, std::mt19937& g) {
                      const int64_t n = 37;
                      std::vector<int32_t> first(n), second(n);
                      std::iota(first.begin(), first.end(), 0);
                      std::iota(second.begin(), second.end(), 0);
                      std::shuffle(first.begin(), first.end(), g);
                      std::shuffle(second.begin(), second.end(), g);
                      DeviceIo io(b);
                      int32_t* out = io.Up(second);
                      b.ComposeIndices(io.Up(first), out, n, out);
                      return io.Down(out, n);
                    }});
}

// Embedding rows of an f32 or bf16 table (row-major, as the loader stores embeddings), and K/V
// written into scattered slots of a paged cache of either dtype (the whole cache compared).
void AddMemoryCases(std::vector<OpCase>* cases) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string name(DTypeShortName(dt));
    cases->push_back({"Embedding 5 of 37 rows of 19, " + name, 0, 0, [dt](Backend& b, std::mt19937& g) {
                        DeviceIo io(b);
                        const auto values = Normal(g, 37 * 19);
                        std::vector<uint16_t> half(values.size());
                        for (size_t i = 0; i < values.size(); ++i) half[i] = F32ToBf16(values[i]);
                        WeightRef table;
                        table.data = dt == DType::kF32 ? static_cast<const void*>(io.Up(values)) : io.Up(half);
                        table.dtype = dt;
                        table.rows = 37;
                        table.cols = 19;
                        const int32_t* ids = io.Up(std::vector<int32_t>{0, 36, 5, 5, 17});
                        float* out = io.Up(std::vector<float>(5 * 19));
                        b.Embedding(ids, 5, table, out);
                        return io.Down(out, 5 * 19);
                      }});
    cases->push_back({"WriteKv 11 tokens into scattered slots, " + name, 0, 0, [dt](Backend& b, std::mt19937& g) {
                        KvLayout layout;
                        layout.num_blocks = 12;
                        layout.num_layers = 2;
                        layout.block_size = 4;
                        layout.kv_heads = 2;
                        layout.head_dim = 24;
                        layout.dtype = dt;
                        std::vector<int64_t> slots(48);
                        std::iota(slots.begin(), slots.end(), 0);
                        std::shuffle(slots.begin(), slots.end(), g);
                        slots.resize(11);
                        DeviceIo io(b);
                        const size_t elems = layout.BlockBytes() * 12 / DTypeSize(dt);
                        const int64_t n = 11, te = layout.TokenElems();
                        const float* k = io.Up(Normal(g, n * te));
                        const float* v = io.Up(Normal(g, n * te));
                        if (dt == DType::kF32) {
                          float* cache = io.Up(std::vector<float>(elems));
                          b.WriteKv(k, v, io.Up(slots), n, layout, 1, cache);
                          return io.Down(cache, elems);
                        }
                        uint16_t* cache = io.Up(std::vector<uint16_t>(elems));
                        b.WriteKv(k, v, io.Up(slots), n, layout, 1, cache);
                        return io.Down(cache, elems);
                      }});
  }
}

}  // namespace

std::vector<OpCase> OpCases() {
  std::vector<OpCase> cases;
  AddNormCases(&cases);
  AddElementwiseCases(&cases);
  AddRopeCases(&cases);
  AddRoutingCases(&cases);
  AddMemoryCases(&cases);
  AddMatmulCases(&cases);
  AddAttentionCases(&cases);
  AddSamplingCases(&cases);
  return cases;
}

}  // namespace moeserve::testing
