// moeserve's CPU GEMM against oneDNN's matmul (what vLLM's CPU build calls) on the same shapes,
// interleaved round by round: bf16 weights, f32 out. moeserve takes f32 activations and rounds
// them to bf16 itself (counted in its time); oneDNN is given them as bf16 already (not counted).
// Built only where oneDNN is installed (Debian: libdnnl-dev); not part of CI.
//
//   build/benchmarks/onednn_gemm [--rounds R] [--seconds S] [--peak GFLOPS] [m,n,k ...] > out.csv
//
// --peak: the machine's bf16 peak (calibrate's amx-bf16 or bf16-dot-512 line), to print each
// median as a fraction of it. Thread counts: moeserve uses the usable CPUs, oneDNN
// OMP_NUM_THREADS (set it to the same).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/host_buffer.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/weight_layout.h"

namespace {

using moeserve::DType;

struct Shape {
  int64_t m, n, k;
};

// GFLOP/s of `run` repeated for at least `seconds`.
double Rate(const Shape& s, double seconds, const std::function<void()>& run) {
  run();  // warm: first-touch, JIT
  const auto start = std::chrono::steady_clock::now();
  int64_t iters = 0;
  double elapsed = 0;
  do {
    run();
    ++iters;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(s.m * s.n * s.k) * static_cast<double>(iters) / elapsed / 1e9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Pair {
  std::function<void()> moeserve, onednn;
};

// Both GEMMs of one shape over the same random operands.
Pair Make(const Shape& s, moeserve::CpuBackend& backend, dnnl::engine& eng, dnnl::stream& strm,
          std::vector<std::shared_ptr<void>>* keep) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  auto x = std::make_shared<std::vector<float>>(static_cast<size_t>(s.m * s.k));
  auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(s.m * s.n));
  std::vector<float> w(static_cast<size_t>(s.n * s.k));
  for (float& v : *x) v = u(gen);
  for (float& v : w) v = u(gen);
  std::vector<uint8_t> row_major(w.size() * 2);
  moeserve::ConvertFromF32(w.data(), w.size(), DType::kBF16, row_major.data());
  const moeserve::WeightLayout layout = backend.PreferredWeightLayout(DType::kBF16);
  auto packed = std::make_shared<moeserve::HostBuffer>(moeserve::HostBuffer::Plain(
      static_cast<size_t>(moeserve::WeightStorageElems(layout, s.n, s.k)) * 2));
  moeserve::PackWeight(layout, row_major.data(), s.n, s.k, 2, packed->data());
  const moeserve::WeightRef ref{packed->data(), DType::kBF16, s.n, s.k, layout};
  keep->insert(keep->end(), {x, y, packed});
  Pair p;
  p.moeserve = [&backend, x, y, ref, s] { backend.Gemm(x->data(), s.m, ref, y->data(), false); };

  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc a({s.m, s.k}, dt::bf16, tag::ab), b({s.k, s.n}, dt::bf16, tag::any),
      c({s.m, s.n}, dt::f32, tag::ab);
  auto pd = std::make_shared<dnnl::matmul::primitive_desc>(dnnl::matmul::desc(a, b, c), eng);
  auto am = std::make_shared<dnnl::memory>(a, eng), cm = std::make_shared<dnnl::memory>(c, eng);
  auto bm = std::make_shared<dnnl::memory>(pd->weights_desc(), eng);
  {  // the same values: x to bf16, w (as [k, n]) reordered into oneDNN's own layout
    moeserve::ConvertFromF32(x->data(), x->size(), DType::kBF16, am->get_data_handle());
    std::vector<float> wt(static_cast<size_t>(s.k * s.n));
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t j = 0; j < s.k; ++j) wt[static_cast<size_t>(j * s.n + i)] = w[static_cast<size_t>(i * s.k + j)];
    }
    dnnl::memory src({{s.k, s.n}, dt::f32, tag::ab}, eng, wt.data());
    dnnl::reorder(src, *bm).execute(strm, src, *bm);
    strm.wait();
  }
  auto prim = std::make_shared<dnnl::matmul>(*pd);
  keep->insert(keep->end(), {pd, am, cm, bm, prim});
  std::fprintf(stderr, "%lld x %lld x %lld: oneDNN %s\n", static_cast<long long>(s.m), static_cast<long long>(s.n),
               static_cast<long long>(s.k), pd->impl_info_str());
  p.onednn = [prim, am, bm, cm, &strm] {
    prim->execute(strm, {{DNNL_ARG_SRC, *am}, {DNNL_ARG_WEIGHTS, *bm}, {DNNL_ARG_DST, *cm}});
    strm.wait();
  };
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  double seconds = 0.3, peak = 0;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--peak" && i + 1 < argc) {
      peak = std::atof(argv[++i]);
    } else {
      Shape s{};
      if (std::sscanf(a.c_str(), "%ld,%ld,%ld", &s.m, &s.n, &s.k) != 3 || s.m < 1 || s.n < 1 || s.k < 1) {
        std::fprintf(stderr, "usage: onednn_gemm [--rounds R] [--seconds S] [--peak GFLOPS] [m,n,k ...]: bad '%s'\n",
                     a.c_str());
        return 2;
      }
      shapes.push_back(s);
    }
  }
  if (shapes.empty()) {  // the small preset's prefill of 2000 tokens: an expert's w13 and w2, qkv, and the issue's
    shapes = {{512, 2048, 512}, {512, 512, 1024}, {2048, 768, 512}, {256, 2048, 1024}, {1024, 2048, 1024}};
  }
  moeserve::CpuBackend backend;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::fprintf(stderr, "moeserve: %s\n", backend.Name().c_str());
  std::vector<std::shared_ptr<void>> keep;
  std::vector<Pair> pairs;
  for (const Shape& s : shapes) pairs.push_back(Make(s, backend, eng, strm, &keep));
  std::vector<std::vector<double>> ours(shapes.size()), theirs(shapes.size());
  std::printf("round,m,n,k,moeserve_gflops,onednn_gflops\n");
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const bool first = (r + static_cast<int>(i)) % 2 == 0;  // alternate who goes first
      double a = 0, b = 0;
      if (first) a = Rate(shapes[i], seconds, pairs[i].moeserve);
      // oneDNN on a thread of its own: it releases the AMX tiles after its kernels, and
      // moeserve's kernels keep their thread's tile configuration (kernels/cpu/amx_tiles.h).
      std::thread([&] { b = Rate(shapes[i], seconds, pairs[i].onednn); }).join();
      if (!first) a = Rate(shapes[i], seconds, pairs[i].moeserve);
      ours[i].push_back(a), theirs[i].push_back(b);
      std::printf("%d,%ld,%ld,%ld,%.1f,%.1f\n", r, shapes[i].m, shapes[i].n, shapes[i].k, a, b);
      std::fflush(stdout);
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const double a = Median(ours[i]), b = Median(theirs[i]);
    std::fprintf(stderr, "%ld x %ld x %ld: moeserve %.0f, oneDNN %.0f GFLOP/s (median of %d), ratio %.2f", shapes[i].m,
                 shapes[i].n, shapes[i].k, a, b, rounds, a / b);
    if (peak > 0) std::fprintf(stderr, "; of the %.0f GFLOP/s peak: %.3f / %.3f", peak, a / peak, b / peak);
    std::fprintf(stderr, "\n");
  }
  return 0;
}
