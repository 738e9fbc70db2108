// core/: dtype conversions against independent computations, the thread pool, atomic files.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.015625f);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  // Rounding to 8 significant bits errs by at most half an ulp: 2^-8 relative.
  for (float v : testing::RandomFloats(10000, 3, 100.0f)) {
    const float r = Bf16ToF32(F32ToBf16(v));
    EXPECT_LE(std::fabs(r - v), std::ldexp(std::fabs(v), -8)) << v;
  }
}

TEST(DTypeTest, F16RoundTripsAndMatchesKnownEncodings) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  // Every finite half value converts to fp32 and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / nan
    EXPECT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(DTypeTest, NamesParseAndReject) {
  EXPECT_EQ(*DTypeFromSafetensorsName("BF16"), DType::kBF16);
  EXPECT_EQ(*DTypeFromTorchName("float32"), DType::kF32);
  EXPECT_EQ(*DTypeFromShortName("f16"), DType::kF16);
  auto bad = DTypeFromSafetensorsName("I8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("I8"), std::string::npos);
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 5, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
  }
}

// Guided chunks: none below the grain but the one that ends the range; the first takes half an
// even share of the job (4 threads: n / 8) and no later one is larger than the one before it.
TEST(ThreadPoolTest, ChunksHoldTheGrainAndShrinkTowardTheEnd) {
  ThreadPool pool(4);
  for (int64_t grain : {1, 3, 16}) {
    for (int64_t n : {2, 17, 100, 5000}) {
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        chunks.emplace_back(b, e);
      });
      std::sort(chunks.begin(), chunks.end());
      ASSERT_FALSE(chunks.empty());
      EXPECT_EQ(chunks.front().first, 0);
      EXPECT_EQ(chunks.back().second, n);
      const auto size = [&](size_t c) { return chunks[c].second - chunks[c].first; };
      if (chunks.size() > 1) {
        EXPECT_EQ(size(0), std::max(grain, n / 8)) << "grain " << grain << " n " << n;
      }
      for (size_t c = 0; c < chunks.size(); ++c) {
        EXPECT_GT(size(c), 0) << "chunk " << c << ", grain " << grain << " n " << n;
        if (c + 1 == chunks.size()) continue;
        EXPECT_EQ(chunks[c].second, chunks[c + 1].first) << "grain " << grain << " n " << n;
        EXPECT_GE(size(c), grain) << "chunk " << c << " of " << chunks.size() << ", grain " << grain << " n " << n;
        EXPECT_GE(size(c), size(c + 1)) << "chunk " << c << " of " << chunks.size() << ", grain " << grain << " n " << n;
      }
    }
  }
}

// A pool sized by default takes the CPUs this thread may run on (as under taskset), not every
// CPU of the machine. The pool's workers inherit the restricted mask; it is restored after.
TEST(ThreadPoolTest, DefaultSizeIsTheAffinityMasksCpus) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(UsableCpus(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int usable = UsableCpus();
  const int threads = ThreadPool(0).num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(usable, 1);
  EXPECT_EQ(threads, 1) << "a pool on one allowed CPU of " << CPU_COUNT(&all);
}

TEST(FileUtilTest, AtomicWriteReplacesWholeFileAndMapsIt) {
  const std::string dir = ::testing::TempDir() + "/moeserve_core_test";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "first version").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  auto m = MappedFile::Open(path);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "second");
  {
    auto w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("abandoned", 9).ok());
  }  // destroyed without Commit: the old file stays
  EXPECT_EQ(*ReadFileToString(path), "second");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "temp file left behind";
  }
  EXPECT_EQ(MappedFile::Open(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moeserve
