// attention_chunks.h's fold of chunk results, against float64 softmax attention over the union
// of the chunks' keys (fresh random scores and values each run), and AttendFolded's promises: the
// chunks in order, two chunks' results held, the bits of folding stored results afterwards.
#include "kernels/cpu/attention_chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace moeserve::cpu_fast {
namespace {

// Random scores and values for `all` rows over `chunks` chunks of `keys` keys each (the last row
// ends after `short_keys` keys, so that its later chunks are empty), and each chunk's result as a
// kernel writes it (ChunkPartFloats): normalized weighted sums, the max and the sum of
// exponentials, computed in float64 then rounded.
struct ChunkedRows {
  int64_t all, width, chunks, keys, short_keys;
  std::vector<double> scores, values;  // [all][chunks * keys], [chunks * keys][width]
  std::vector<float> parts;            // [chunks][ChunkPartFloats]

  int64_t KeysOf(int64_t row) const { return row == all - 1 ? short_keys : chunks * keys; }

  ChunkedRows(int64_t all_, int64_t width_, int64_t chunks_, int64_t keys_, int64_t short_keys_, std::mt19937& gen)
      : all(all_), width(width_), chunks(chunks_), keys(keys_), short_keys(short_keys_) {
    const int64_t ctx = chunks * keys;
    std::normal_distribution<double> score(0.0, 1.0), value(0.0, 1.0);
    scores.resize(static_cast<size_t>(all * ctx));
    values.resize(static_cast<size_t>(ctx * width));
    for (double& s : scores) s = score(gen);
    for (double& v : values) v = value(gen);
    // Chunks of comparable weight, chunk 1 a few times heavier and the last lighter, so that
    // every chunk's weight counts and the running maximum moves up, then not.
    for (int64_t j = 0; j < ctx; ++j) {
      const double shift = j / keys == 1 ? 1.5 : j / keys == chunks - 1 ? -1.0 : 0.0;
      for (int64_t row = 0; row < all; ++row) scores[row * ctx + j] += shift;
    }
    const int64_t stride = ChunkPartFloats(all, width);
    parts.assign(static_cast<size_t>(chunks * stride), 0.0f);
    for (int64_t c = 0; c < chunks; ++c) {
      float* part = parts.data() + c * stride;
      for (int64_t row = 0; row < all; ++row) {
        const int64_t k0 = c * keys, k1 = std::min(KeysOf(row), k0 + keys);
        if (k1 <= k0) {
          part[all * width + row] = -INFINITY;
          part[all * width + all + row] = 0.0f;
          continue;
        }
        const double m = *std::max_element(&scores[row * ctx + k0], &scores[row * ctx + k1]);
        double sum = 0;
        std::vector<double> o(static_cast<size_t>(width));
        for (int64_t j = k0; j < k1; ++j) {
          const double p = std::exp(scores[row * ctx + j] - m);
          sum += p;
          for (int64_t e = 0; e < width; ++e) o[e] += p * values[j * width + e];
        }
        for (int64_t e = 0; e < width; ++e) part[row * width + e] = static_cast<float>(o[e] / sum);
        // The kernels' max is a float score; the test's scores are doubles rounded the same way.
        part[all * width + row] = static_cast<float>(m);
        part[all * width + all + row] = static_cast<float>(sum);
      }
    }
  }

  // Row `row`'s attention over all of its keys, in float64.
  std::vector<double> Expected(int64_t row) const {
    const int64_t ctx = chunks * keys, n = KeysOf(row);
    const double m = *std::max_element(&scores[row * ctx], &scores[row * ctx + n]);
    double sum = 0;
    std::vector<double> o(static_cast<size_t>(width));
    for (int64_t j = 0; j < n; ++j) {
      const double p = std::exp(scores[row * ctx + j] - m);
      sum += p;
      for (int64_t e = 0; e < width; ++e) o[e] += p * values[j * width + e];
    }
    for (double& x : o) x /= sum;
    return o;
  }
};

TEST(FoldChunkTest, FoldedChunksAreTheAttentionOverAllTheirKeys) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (int64_t chunks : {2, 7, 65}) {
    SCOPED_TRACE(::testing::Message() << chunks << " chunks");
    const ChunkedRows rows(/*all=*/5, /*width=*/24, chunks, /*keys=*/32, /*short_keys=*/40, gen);
    const int64_t stride = ChunkPartFloats(rows.all, rows.width);
    std::vector<float> acc(rows.parts.begin(), rows.parts.begin() + stride);
    for (int64_t c = 1; c < chunks; ++c) FoldChunk(rows.parts.data() + c * stride, rows.all, rows.width, acc.data());
    for (int64_t row = 0; row < rows.all; ++row) {
      const std::vector<double> want = rows.Expected(row);
      double scale = 0, worst = 0;
      for (int64_t e = 0; e < rows.width; ++e) {
        scale = std::max(scale, std::fabs(want[e]));
        worst = std::max(worst, std::fabs(acc[row * rows.width + e] - want[e]));
      }
      // Each part carries its own float rounding (2^-24 relative); each fold adds a few more
      // (two exponentials, the weights, a product and an FMA): 16 ulp a chunk is generous, and
      // either weight off by 1%, or the sum of the two weights taken as their maximum, fails it
      // by 1e-3 to 0.5 relative (checked by mutation).
      const double bound = 16.0 * static_cast<double>(chunks) * 0x1p-24 * scale;
      EXPECT_LE(worst, bound) << "row " << row << ": max-abs error " << worst << ", relative " << worst / scale;
    }
  }
}

TEST(FoldChunkTest, AnEmptyPartKeepsTheRowAndAnEmptyRowTakesThePartsBits) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const ChunkedRows rows(/*all=*/3, /*width=*/16, /*chunks=*/4, /*keys=*/32, /*short_keys=*/20, gen);
  const int64_t stride = ChunkPartFloats(rows.all, rows.width), last = rows.all - 1;
  // Row `last` has keys in chunk 0 only: folding chunks 1-3 leaves its bits.
  std::vector<float> acc(rows.parts.begin(), rows.parts.begin() + stride);
  for (int64_t c = 1; c < rows.chunks; ++c) FoldChunk(rows.parts.data() + c * stride, rows.all, rows.width, acc.data());
  EXPECT_EQ(0, std::memcmp(acc.data() + last * rows.width, rows.parts.data() + last * rows.width,
                           static_cast<size_t>(rows.width) * sizeof(float)));
  // An accumulator with nothing folded yet (max -inf, sum 0) takes a part's bits.
  std::vector<float> empty(static_cast<size_t>(stride), 7.0f);
  std::fill(empty.begin() + rows.all * rows.width, empty.begin() + rows.all * rows.width + rows.all, -INFINITY);
  std::fill(empty.begin() + rows.all * rows.width + rows.all, empty.end(), 0.0f);
  FoldChunk(rows.parts.data() + 2 * stride, rows.all, rows.width, empty.data());
  for (int64_t row = 0; row < last; ++row) {
    EXPECT_EQ(0, std::memcmp(empty.data() + row * rows.width, rows.parts.data() + 2 * stride + row * rows.width,
                             static_cast<size_t>(rows.width) * sizeof(float)))
        << "row " << row;
  }
  EXPECT_EQ(empty[last * rows.width], 7.0f) << "a row without keys in either stays as it was";
}

TEST(AttendFoldedTest, TakesChunksInOrderHoldsTwoAndMatchesFoldingStoredResults) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const ChunkedRows rows(/*all=*/4, /*width=*/32, /*chunks=*/65, /*keys=*/32, /*short_keys=*/100, gen);
  const int64_t stride = ChunkPartFloats(rows.all, rows.width);
  std::vector<float> parts;
  std::vector<int64_t> seen;
  size_t largest = 0;
  AttendFolded(rows.chunks, rows.all, rows.width, &parts, [&](int64_t c, float* part) {
    seen.push_back(c);
    largest = std::max(largest, parts.size());
    std::memcpy(part, rows.parts.data() + c * stride, static_cast<size_t>(stride) * sizeof(float));
  });
  ASSERT_EQ(seen.size(), static_cast<size_t>(rows.chunks));
  for (int64_t c = 0; c < rows.chunks; ++c) EXPECT_EQ(seen[c], c);
  EXPECT_LE(largest, static_cast<size_t>(2 * stride)) << "an item holds two chunks' results";
  // The split plan stores every chunk's result, then folds them in the same order (FoldChunks).
  std::vector<float> stored = rows.parts;
  FoldChunks(stored.data(), rows.chunks, rows.all, rows.width);
  EXPECT_EQ(0, std::memcmp(parts.data(), stored.data(), static_cast<size_t>(stride) * sizeof(float)));
  // One chunk: its result as it is.
  AttendFolded(1, rows.all, rows.width, &parts, [&](int64_t, float* part) {
    std::memcpy(part, rows.parts.data(), static_cast<size_t>(stride) * sizeof(float));
  });
  EXPECT_EQ(0, std::memcmp(parts.data(), rows.parts.data(), static_cast<size_t>(stride) * sizeof(float)));
}

}  // namespace
}  // namespace moeserve::cpu_fast
