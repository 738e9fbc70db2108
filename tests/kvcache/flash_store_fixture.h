// The flash tier tests' shared pieces (flash_store_test.cc, flash_dir_test.cc): a store's
// fingerprint, fresh directories, reproducible blocks and a byte flipper.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/flash_store.h"
#include "tests/test_util.h"

namespace moeserve::flash_test {

inline constexpr uint64_t kFingerprint = 0x1234abcd5678ef01ull;

inline std::string FreshDir(const std::string& tag) { return testing::FreshTempPath("flash_" + tag); }

inline BlockHash HashOf(uint64_t i) { return BlockHash{0x9e3779b97f4a7c15ull * (i + 1), i}; }

// The payload of block i, reproducible from i alone (so a parent can check a child's writes).
inline std::vector<uint8_t> PayloadOf(uint64_t i, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  std::mt19937_64 gen(i * 7919 + 17);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

inline std::unique_ptr<FlashStore> OpenStore(const std::string& dir, uint64_t budget, uint64_t fp = kFingerprint) {
  auto s = FlashStore::Open({dir, budget, fp});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

inline void Write(FlashStore* s, uint64_t i, size_t bytes) {
  const auto p = PayloadOf(i, bytes);
  ASSERT_TRUE(s->Put(HashOf(i), 0, 4, DType::kBF16, 16, p.data(), p.size()).ok());
}

inline bool ReadsBack(FlashStore* s, uint64_t i, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (!s->Get(HashOf(i), out.data(), out.size()).ok()) return false;
  EXPECT_EQ(out, PayloadOf(i, bytes)) << "block " << i << " served with wrong contents";
  return true;
}

inline void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace moeserve::flash_test
