// The flash tier's directory: private (0700, records 0600), one server per directory (a second
// is refused naming the holder), junk and other format versions skipped and counted at start-up.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "kvcache/flash_store.h"
#include "tests/kvcache/flash_store_fixture.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using namespace flash_test;  // NOLINT: the shared pieces

// The directory is private: created 0700, records 0600 (even while being written), and a
// directory that group or others can reach is refused, naming the path and its mode.
TEST(FlashStoreTest, DirectoryIsPrivateAndOthersCannotReachIt) {
  const std::string parent = FreshDir("private");
  const std::string dir = parent + "/a/b/flash";  // parents created too
  {
    auto s = OpenStore(dir, 1 << 20);
    ASSERT_NE(s, nullptr);
    Write(s.get(), 1, 256);
    EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
    EXPECT_EQ(fs::status(s->PathOf(HashOf(1))).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_EQ(fs::status(dir + "/" + FlashDirLock::kLockFile).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
  }
  for (const auto& [mode, name] : {std::pair{fs::perms(0755), "0755"}, {fs::perms(0770), "0770"},
                                   {fs::perms(0702), "0702"}, {fs::perms(0710), "0710"}}) {
    fs::permissions(dir, mode);
    auto s = FlashStore::Open({dir, 1 << 20, kFingerprint});
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(s.status().message().find(dir), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(name), std::string::npos) << s.status();
  }
  fs::permissions(dir, fs::perms(0700));
  auto s = OpenStore(dir, 1 << 20);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(ReadsBack(s.get(), 1, 256));
  // Under a directory anyone may write (without the sticky bit), someone could swap it: refused,
  // naming that ancestor; with the sticky bit (as /tmp) it is fine.
  const std::string open_parent = parent + "/shared";
  fs::create_directories(open_parent);
  fs::permissions(open_parent, fs::perms(0777));
  auto swappable = FlashStore::Open({open_parent + "/flash", 1 << 20, kFingerprint});
  ASSERT_FALSE(swappable.ok());
  EXPECT_NE(swappable.status().message().find(open_parent), std::string::npos) << swappable.status();
  fs::permissions(open_parent, fs::perms(01777));
  EXPECT_TRUE(FlashStore::Open({open_parent + "/flash", 1 << 20, kFingerprint}).ok());
  // A path that is a file, not a directory.
  const std::string file = parent + "/plain";
  std::ofstream(file) << "x";
  auto f = FlashStore::Open({file, 1 << 20, kFingerprint});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a directory"), std::string::npos) << f.status();
  fs::remove_all(parent);
}

// One server per directory: a second store, in this process or another, is refused with the
// holder's pid while the first lives; the lock goes with the holder (exit or kill -9).
TEST(FlashStoreTest, ASecondServerOnTheDirectoryIsRefusedWithTheHoldersPid) {
  const std::string dir = FreshDir("lock");
  {
    auto first = OpenStore(dir, 1 << 20);
    Write(first.get(), 1, 256);
    auto second = FlashStore::Open({dir, 1 << 20, kFingerprint + 1});
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find(dir), std::string::npos) << second.status();
    EXPECT_NE(second.status().message().find("pid " + std::to_string(getpid())), std::string::npos)
        << second.status();
    EXPECT_TRUE(ReadsBack(first.get(), 1, 256)) << "the refused store touched the first one's records";
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto s = FlashStore::Open({dir, 1 << 20, kFingerprint});
    const char c = s.ok() ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(2);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto refused = FlashStore::Open({dir, 1 << 20, kFingerprint});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(child)), std::string::npos) << refused.status();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  auto after = OpenStore(dir, 1 << 20);
  ASSERT_NE(after, nullptr) << "the lock outlived its holder";
  EXPECT_TRUE(ReadsBack(after.get(), 1, 256));
  fs::remove_all(dir);
}

// Start-up never fails on junk: a non-empty directory named like a record, a symlink and a
// FIFO named like records, other files and a directory named like a temp file are skipped,
// counted and left alone, and the real records are served.
TEST(FlashStoreTest, JunkInTheDirectoryIsSkippedAndCounted) {
  const std::string dir = FreshDir("junk");
  const std::string elsewhere = FreshDir("junk_target");
  {
    auto s = OpenStore(dir, 1 << 20);
    Write(s.get(), 1, 512);
    Write(s.get(), 2, 512);
  }
  fs::create_directories(dir + "/0000000000000000000000000000abcd.kvb/inner");
  std::ofstream(dir + "/0000000000000000000000000000abcd.kvb/inner/file") << "data";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere + "/target") << "not a record";
  fs::create_symlink(elsewhere + "/target", dir + "/00000000000000000000000000001234.kvb");
  ASSERT_EQ(mkfifo((dir + "/00000000000000000000000000005678.kvb").c_str(), 0600), 0);
  std::ofstream(dir + "/README") << "operator notes";
  fs::create_directories(dir + "/x.kvb.tmp.1");
  auto s = FlashStore::Open({dir, 1 << 20, kFingerprint});
  ASSERT_TRUE(s.ok()) << s.status();
  const FlashStoreStats st = (*s)->stats();
  EXPECT_EQ(st.skipped_other, 5);
  EXPECT_EQ(st.records, 2);
  EXPECT_EQ(st.dropped_corrupt + st.dropped_truncated + st.dropped_incomplete + st.dropped_foreign, 0);
  EXPECT_TRUE(ReadsBack(s->get(), 1, 512));
  EXPECT_TRUE(ReadsBack(s->get(), 2, 512));
  EXPECT_TRUE(fs::exists(dir + "/0000000000000000000000000000abcd.kvb/inner/file"));
  EXPECT_TRUE(fs::exists(elsewhere + "/target")) << "a symlink's target was deleted";
  EXPECT_TRUE(fs::exists(dir + "/README"));
  fs::remove_all(dir);
  fs::remove_all(elsewhere);
}

// A record of another format version (its header of another length, so its checksum is not
// where this build looks) is foreign: skipped and left, not deleted as corrupt. A trailing "/"
// names the same directory and finds the same records.
TEST(FlashStoreTest, OtherVersionsAreSkippedAndATrailingSlashIsTheSameDirectory) {
  const std::string dir = FreshDir("version");
  std::string other_version;
  {
    auto s = OpenStore(dir, 1 << 20);
    Write(s.get(), 1, 512);
    Write(s.get(), 2, 512);
    other_version = s->PathOf(HashOf(2));
  }
  {  // record 2 becomes version 3 with a 96-byte header
    std::fstream f(other_version, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t v[2] = {3, 96};
    f.write(reinterpret_cast<const char*>(v), sizeof(v));
  }
  auto s = OpenStore(dir + "/", 1 << 20);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->stats().skipped_foreign, 1);
  EXPECT_EQ(s->stats().dropped_corrupt, 0) << "another version was deleted as corrupt";
  EXPECT_TRUE(fs::exists(other_version));
  EXPECT_EQ(s->stats().records, 1);
  EXPECT_TRUE(ReadsBack(s.get(), 1, 512)) << "a trailing slash lost the records";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
