#include <immintrin.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
// KV-like scattered read: blocks of `chunk` bytes (one layer's K+V of 16 tokens), `stride` apart.
static double Run(char* base, long nblocks, long chunk, long stride, int dist, int threads, int reps) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  std::vector<float> sink(threads * 16);
  for (int t = 0; t < threads; ++t) th.emplace_back([&, t] {
    __m512 acc = _mm512_setzero_ps();
    for (int r = 0; r < reps; ++r) {
      long b0 = nblocks * t / threads, b1 = nblocks * (t + 1) / threads;
      for (long b = b0; b < b1; ++b) {
        const char* p = base + b * stride + (r % 10) * chunk;
        if (dist > 0 && b + dist < b1) {
          const char* f = base + (b + dist) * stride + (r % 10) * chunk;
          for (long o = 0; o < chunk; o += 64) _mm_prefetch(f + o, _MM_HINT_T0);
        }
        for (long o = 0; o < chunk; o += 64) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(p + o)));
      }
    }
    _mm512_storeu_ps(&sink[t * 16], acc);
  });
  for (auto& x : th) x.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return (double)nblocks * chunk * reps / s / 1e9;
}
int main(int argc, char** argv) {
  long chunk = atol(argv[1]), layers = 10, nblocks = 4096 * 16384 / atol(argv[1]);  // 16 seqs x 256 blocks
  long stride = chunk * layers;
  size_t bytes = nblocks * stride;
  char* base = (char*)aligned_alloc(1 << 21, bytes);
  madvise(base, bytes, MADV_HUGEPAGE);
  memset(base, 1, bytes);
  for (int round = 0; round < 3; ++round) {
    printf("chunk %ld: contiguous %.1f", chunk, Run(base, nblocks * layers, chunk, chunk, 0, 2, 1));
    for (int d : {0, 1, 2, 4}) printf(" | dist%d %.1f", d, Run(base, nblocks, chunk, stride, d, 2, 10));
    printf("\n");
  }
}
