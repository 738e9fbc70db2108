// Flash tier: round trips, restart, LRU within the budget, and fault injection (flipped bytes,
// truncation, foreign records, a writer killed mid-write): nothing corrupt is ever served and
// every dropped record is counted. (flash_dir_test.cc: the directory itself.)
#include "kvcache/flash_store.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/kvcache/flash_store_fixture.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using namespace flash_test;  // NOLINT: the shared pieces

TEST(FlashStoreTest, RoundTripsAndSurvivesARestart) {
  const std::string dir = FreshDir("restart");
  const size_t bytes = 4096 + std::random_device{}() % 4096;
  {
    auto s = OpenStore(dir, 1 << 20);
    for (uint64_t i = 0; i < 20; ++i) Write(s.get(), i, bytes);
    for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(ReadsBack(s.get(), i, bytes));
    EXPECT_FALSE(s->Contains(HashOf(99)));
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(s->Get(HashOf(99), out.data(), bytes).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s->stats().hits, 20);
    EXPECT_EQ(s->stats().misses, 1);
  }
  auto again = OpenStore(dir, 1 << 20);
  EXPECT_EQ(again->stats().records, 20);
  EXPECT_EQ(again->stats().bytes, 20 * (FlashRecordHeader::kBytes + bytes));
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(ReadsBack(again.get(), i, bytes));
  fs::remove_all(dir);
}

TEST(FlashStoreTest, StaysWithinItsBudgetByLru) {
  const std::string dir = FreshDir("budget");
  const size_t bytes = 1000;
  const uint64_t record = FlashRecordHeader::kBytes + bytes;
  auto s = OpenStore(dir, 5 * record);
  for (uint64_t i = 0; i < 5; ++i) Write(s.get(), i, bytes);
  EXPECT_TRUE(ReadsBack(s.get(), 0, bytes));  // 0 becomes the most recently used
  Write(s.get(), 5, bytes);                   // evicts 1, the least recently used
  EXPECT_TRUE(s->Contains(HashOf(0)));
  EXPECT_FALSE(s->Contains(HashOf(1)));
  EXPECT_LE(s->stats().bytes, 5 * record);
  EXPECT_EQ(s->stats().evictions, 1);
  const auto big = PayloadOf(9, 6 * record);
  EXPECT_EQ(s->Put(HashOf(9), 0, 4, DType::kBF16, 16, big.data(), big.size()).code(),
            absl::StatusCode::kInvalidArgument);
  // A smaller budget on reopening evicts down to it.
  s.reset();
  auto smaller = OpenStore(dir, 2 * record);
  EXPECT_EQ(smaller->stats().records, 2);
  size_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != FlashDirLock::kLockFile) on_disk += e.file_size();
  }
  EXPECT_LE(on_disk, 2 * record);
  fs::remove_all(dir);
}

TEST(FlashStoreTest, CorruptPayloadIsFoundOnReadAndForeignRecordsOnOpen) {
  const std::string dir = FreshDir("faults");
  const size_t bytes = 2048;
  std::mt19937_64 gen(std::random_device{}());
  {
    auto s = OpenStore(dir, 1 << 20);
    for (uint64_t i = 0; i < 4; ++i) Write(s.get(), i, bytes);
    // A flipped payload byte passes the open-time checks and is caught by the read.
    FlipByte(s->PathOf(HashOf(0)), FlashRecordHeader::kBytes + gen() % bytes);
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(s->Get(HashOf(0), out.data(), bytes).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s->stats().dropped_corrupt, 1);
    EXPECT_FALSE(fs::exists(s->PathOf(HashOf(0))));
    EXPECT_TRUE(ReadsBack(s.get(), 1, bytes));
    // Asking with the wrong size (another block shape) is refused, not served; the record
    // is forgotten but left in place.
    std::vector<uint8_t> small(bytes / 2);
    EXPECT_FALSE(s->Get(HashOf(2), small.data(), small.size()).ok());
    EXPECT_EQ(s->stats().dropped_foreign, 1);
    EXPECT_FALSE(s->Contains(HashOf(2)));
    // A record of another model copied into this directory.
    auto theirs = OpenStore(dir + "_theirs", 1 << 20, kFingerprint + 1);
    Write(theirs.get(), 7, bytes);
    fs::copy_file(theirs->PathOf(HashOf(7)), s->PathOf(HashOf(7)));
    fs::remove_all(dir + "_theirs");
  }
  {
    auto reopened = OpenStore(dir, 1 << 20);
    EXPECT_EQ(reopened->stats().skipped_foreign, 1) << "the other model's record is skipped";
    EXPECT_EQ(reopened->stats().dropped_foreign, 0);
    EXPECT_EQ(reopened->stats().records, 3);  // 1, 2 (only asked with the wrong size) and 3
    EXPECT_TRUE(ReadsBack(reopened.get(), 1, bytes));
    EXPECT_TRUE(ReadsBack(reopened.get(), 2, bytes));
    EXPECT_TRUE(ReadsBack(reopened.get(), 3, bytes));
    EXPECT_FALSE(reopened->Contains(HashOf(7)));
    EXPECT_TRUE(fs::exists(reopened->PathOf(HashOf(7)))) << "a foreign record was deleted";
  }
  // Purged when the operator asks.
  FlashStoreOptions purge{dir, 1 << 20, kFingerprint};
  purge.purge_foreign = true;
  auto purged = FlashStore::Open(purge);
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ((*purged)->stats().dropped_foreign, 1);
  EXPECT_EQ((*purged)->stats().records, 3);
  EXPECT_FALSE(fs::exists((*purged)->PathOf(HashOf(7))));
  fs::remove_all(dir);
}

TEST(FlashStoreTest, HeaderAndLengthDamageIsFoundOnOpen) {
  const std::string dir = FreshDir("open");
  const size_t bytes = 1024;
  {
    auto s = OpenStore(dir, 1 << 20);
    for (uint64_t i = 0; i < 6; ++i) Write(s.get(), i, bytes);
    FlipByte(s->PathOf(HashOf(1)), 20);                                     // header
    fs::resize_file(s->PathOf(HashOf(2)), FlashRecordHeader::kBytes + 10);  // payload cut
    fs::resize_file(s->PathOf(HashOf(3)), 10);                             // header cut
    { std::ofstream(s->PathOf(HashOf(4)), std::ios::app | std::ios::binary) << "trailing"; }
    std::ofstream(dir + "/" + fs::path(s->PathOf(HashOf(9))).filename().string() + ".tmp.123") << "half";
  }
  auto s = OpenStore(dir, 1 << 20);
  const FlashStoreStats st = s->stats();
  EXPECT_EQ(st.dropped_corrupt, 1);
  EXPECT_EQ(st.dropped_truncated, 3);
  EXPECT_EQ(st.dropped_incomplete, 1);
  EXPECT_EQ(st.records, 2);
  EXPECT_TRUE(ReadsBack(s.get(), 0, bytes));
  EXPECT_TRUE(ReadsBack(s.get(), 5, bytes));
  for (uint64_t i = 1; i <= 4; ++i) EXPECT_FALSE(s->Contains(HashOf(i)));
  fs::remove_all(dir);
}

TEST(FlashStoreTest, AWriterKilledMidWriteLeavesNothingCorrupt) {
  const std::string dir = FreshDir("killed");
  const size_t bytes = 512 << 10;  // big enough that a kill lands inside a write
  // The writer says when its first record is committed (a slow disk's fsync can take long); the
  // kill then lands at a random moment of the writes that follow.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    auto s = FlashStore::Open({dir, 1ull << 30, kFingerprint});
    if (!s.ok()) _exit(3);
    for (uint64_t i = 0;; ++i) {
      const auto p = PayloadOf(i, bytes);
      if (!(*s)->Put(HashOf(i), 0, 4, DType::kBF16, 16, p.data(), p.size()).ok()) _exit(4);
      if (i == 0 && write(ready[1], "1", 1) != 1) _exit(5);
    }
  }
  close(ready[1]);
  pollfd pfd{ready[0], POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 60000), 1) << "the writer committed nothing in 60 s";
  close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(std::random_device{}() % 50));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer must have been killed, not have failed: " << status;
  auto s = OpenStore(dir, 1ull << 30);
  const FlashStoreStats st = s->stats();
  ASSERT_GT(st.records, 0) << "the writer's first record must be there";
  EXPECT_LE(st.dropped_incomplete, 1) << "one writer leaves at most one temporary file";
  // Every indexed record reads back exactly; nothing else is in the directory.
  int64_t served = 0;
  for (uint64_t i = 0; i < static_cast<uint64_t>(st.records) + 2; ++i) served += ReadsBack(s.get(), i, bytes);
  EXPECT_EQ(served, st.records);
  EXPECT_EQ(s->stats().dropped_corrupt + s->stats().dropped_truncated, 0) << "rename makes records all-or-nothing";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() == FlashDirLock::kLockFile) continue;
    EXPECT_EQ(e.path().extension(), ".kvb") << e.path() << " left behind";
  }
  fs::remove_all(dir);
}

// A record of another block shape (KV dtype, tokens per block, layer count) is foreign, at open
// and on read, even when its payload happens to have the expected length.
TEST(FlashStoreTest, RecordsOfAnotherBlockShapeAreForeign) {
  const std::string dir = FreshDir("shape");
  const size_t bytes = 2048;
  {
    auto s = OpenStore(dir, 1 << 20);
    Write(s.get(), 1, bytes);  // 4 layers, bf16, 16 tokens
    const auto p = PayloadOf(2, bytes);
    ASSERT_TRUE(s->Put(HashOf(2), 0, 4, DType::kF32, 8, p.data(), p.size()).ok());  // same bytes, other shape
  }
  FlashStoreOptions o{dir, 1 << 20, kFingerprint};
  o.expect_layers = 4;
  o.expect_block_tokens = 16;
  o.expect_dtype = static_cast<int>(DType::kBF16);
  auto s = FlashStore::Open(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().skipped_foreign, 1);
  EXPECT_TRUE(ReadsBack(s->get(), 1, bytes));
  EXPECT_FALSE((*s)->Contains(HashOf(2)));
  fs::remove_all(dir);
}

// Retention: retained records outlive LRU pressure within the budget; once only retained ones
// are left, an ordinary write is refused (and counted) while a retained one still gets in;
// deadlines survive a restart (they are in the header) and expire into ordinary records.
TEST(FlashStoreTest, RetainedRecordsOutliveLruPressureAndRestarts) {
  const std::string dir = FreshDir("retain");
  const size_t bytes = 1000;
  const uint64_t record = FlashRecordHeader::kBytes + bytes;
  double now = 5000.0;
  FlashStoreOptions o{dir, 4 * record, kFingerprint, [&] { return now; }};
  auto put = [&](FlashStore* s, uint64_t i, double until) {
    const auto p = PayloadOf(i, bytes);
    return s->Put(HashOf(i), 0, 4, DType::kBF16, 16, p.data(), p.size(), until);
  };
  {
    auto s = std::move(*FlashStore::Open(o));
    ASSERT_TRUE(put(s.get(), 0, now + 100).ok());
    ASSERT_TRUE(put(s.get(), 1, now + 200).ok());
    for (uint64_t i = 2; i < 10; ++i) ASSERT_TRUE(put(s.get(), i, 0).ok());  // ordinary ones rotate
    EXPECT_TRUE(s->Contains(HashOf(0)));
    EXPECT_TRUE(s->Contains(HashOf(1)));
    EXPECT_TRUE(s->Contains(HashOf(9)));
    EXPECT_FALSE(s->Contains(HashOf(2)));
    EXPECT_EQ(s->stats().retained, 2);
  }
  auto s = std::move(*FlashStore::Open(o));  // restart: deadlines come back from the headers
  ASSERT_TRUE(put(s.get(), 20, now + 300).ok());
  ASSERT_TRUE(put(s.get(), 21, now + 300).ok());  // the budget is now all retained
  EXPECT_EQ(s->stats().retained, 4);
  const absl::Status refused = put(s.get(), 22, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(s->stats().refused_retained, 1);
  EXPECT_TRUE(ReadsBack(s.get(), 0, bytes));
  double until = 0;
  std::vector<uint8_t> out(bytes);
  ASSERT_TRUE(s->Get(HashOf(1), out.data(), bytes, &until).ok());
  EXPECT_EQ(until, 5200.0);
  now += 150;  // record 0 expires: the next ordinary write takes its place
  ASSERT_TRUE(put(s.get(), 22, 0).ok());
  EXPECT_FALSE(s->Contains(HashOf(0)));
  EXPECT_TRUE(s->Contains(HashOf(1)));
  EXPECT_LE(s->stats().bytes, 4 * record);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
