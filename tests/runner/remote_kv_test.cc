// runner/remote_kv: the KV tiers' copies of pieces that worker processes hold, against a fake job
// whose "workers" answer in this process from arenas of their own (ServeKvPieces on CPU
// backends): fetched pieces are the arenas' bytes, committed writes land in the arenas, a read
// after a write in the same list sees the write, lists larger than one message go in several
// rounds, and a worker that cannot be reached or answers short loses the job once, after which
// nothing more is sent.
#include "runner/remote_kv.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>

#include "kernels/cpu/cpu_backend.h"

namespace moeserve {
namespace {

// Ranks 1..n-1 serve KV piece copies from their arenas; everything else is refused.
class FakeJob final : public ProcessRanks {
 public:
  FakeJob(int size, const KvLayout& layout) : size_(size) {
    for (int r = 1; r < size; ++r) arenas_.emplace(r, *KvStorage::Create(&backend_, layout));
  }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  absl::StatusOr<std::unique_ptr<CommGroup>> Split(int, int) override { return absl::UnimplementedError("fake"); }
  absl::StatusOr<std::unique_ptr<CommGroup>> SplitNccl(int, int, int) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<double>> AllGather(double) override { return absl::UnimplementedError("fake"); }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string&) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status SendMessage(int peer, const std::string& bytes) override {
    ++sent_;
    if (peer == unreachable_) return absl::UnavailableError("rank 2 is gone");
    std::vector<SubStep> subs;
    KvPieceOp op;
    ReplaceOp replace;
    auto kind = DecodeWorkerMessage(bytes, &subs, &op, &replace);
    if (!kind.ok() || *kind != WorkerMessage::kKvPieces) return absl::InternalError("not a KV piece copy");
    std::string data;
    const absl::Status s = ServeKvPieces(op, &backend_, arenas_.at(peer), &data);
    if (peer == short_reply_ && !data.empty()) data.pop_back();
    replies_[peer].push_back(EncodeKvPieceReply(s, data));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReceiveMessage(int peer) override {
    if (replies_[peer].empty()) return absl::UnavailableError("no reply");
    std::string r = std::move(replies_[peer].front());
    replies_[peer].pop_front();
    return r;
  }
  void StepBegins() override {}
  void WaitingFor(int) override {}
  void StepEnds() override {}
  AbortSignal* abort_signal() override { return &abort_; }
  std::string DescribeRank(int rank) const override { return "rank " + std::to_string(rank); }

  uint8_t* Piece(int rank, int32_t block) {
    const KvStorage& a = arenas_.at(rank);
    return static_cast<uint8_t*>(a.data()) + static_cast<size_t>(block) * a.layout().BlockBytes();
  }
  size_t piece_bytes() const { return arenas_.begin()->second.layout().BlockBytes(); }
  int sent_ = 0;
  int unreachable_ = -1, short_reply_ = -1;

 private:
  int size_;
  CpuBackend backend_;
  std::map<int, KvStorage> arenas_;
  std::map<int, std::deque<std::string>> replies_;
  AbortSignal abort_;
};

KvLayout SmallLayout() {
  KvLayout l;
  l.num_blocks = 8;
  l.num_layers = 2;
  l.block_size = 4;
  l.kv_heads = 2;
  l.head_dim = 8;
  l.dtype = DType::kF32;
  return l;
}

std::vector<uint8_t> RandomBytes(std::mt19937& gen, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

TEST(RemoteKvPiecesTest, FetchesWritesBackAndSeesItsOwnWritesInSeveralRounds) {
  std::mt19937 gen(std::random_device{}());
  FakeJob job(3, SmallLayout());
  const size_t n = job.piece_bytes();
  for (int r = 1; r < 3; ++r) {
    for (int32_t b = 0; b < 8; ++b) {
      const auto bytes = RandomBytes(gen, n);
      std::copy(bytes.begin(), bytes.end(), job.Piece(r, b));
    }
  }
  ProcessChannel channel(&job);
  int lost = 0;
  // Two pieces per message at most: a list of five pieces per worker takes three rounds.
  RemoteKvPieces pieces(&channel, [&](const absl::Status&) { ++lost; }, 2 * n);
  std::vector<KvBlockPart> parts;
  for (int r = 1; r < 3; ++r) {
    for (int32_t b : {0, 3, 5, 6, 7, 3}) parts.push_back({nullptr, nullptr, n, r, b});  // block 3 twice
  }
  ASSERT_TRUE(pieces.Fetch(parts).ok());
  EXPECT_EQ(job.sent_, 6) << "5 pieces per worker, 2 a message: 3 rounds of 2 workers";
  std::vector<uint8_t> got(n);
  for (const KvBlockPart& p : parts) {
    ASSERT_TRUE(pieces.Read(p, got.data()));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), job.Piece(p.remote_rank, p.remote_block)))
        << "rank " << p.remote_rank << " block " << p.remote_block;
  }
  const KvBlockPart unfetched{nullptr, nullptr, n, 1, 1};
  EXPECT_FALSE(pieces.Read(unfetched, got.data())) << "a piece never fetched is not served";
  // Writes: seen by a later read of the same list, in the arenas only after Commit.
  std::map<std::pair<int, int32_t>, std::vector<uint8_t>> written;
  for (int r = 1; r < 3; ++r) {
    for (int32_t b : {3, 4}) {
      written[{r, b}] = RandomBytes(gen, n);
      pieces.Write({nullptr, nullptr, n, r, b}, written[{r, b}].data());
    }
  }
  ASSERT_TRUE(pieces.Read({nullptr, nullptr, n, 2, 3}, got.data()));
  EXPECT_EQ(got, written[std::make_pair(2, int32_t{3})]) << "a read after a write in the same list sees the write";
  EXPECT_FALSE(std::equal(got.begin(), got.end(), job.Piece(2, 3))) << "written back before Commit";
  ASSERT_TRUE(pieces.Commit().ok());
  for (const auto& [key, bytes] : written) {
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), job.Piece(key.first, key.second)))
        << "rank " << key.first << " block " << key.second << " not written back";
  }
  EXPECT_FALSE(pieces.Read({nullptr, nullptr, n, 1, 0}, got.data())) << "Commit forgets the list's pieces";
  EXPECT_EQ(lost, 0);
}

TEST(RemoteKvPiecesTest, AnUnreachableOrShortAnsweringWorkerLosesTheJobOnce) {
  for (bool unreachable : {true, false}) {
    FakeJob job(3, SmallLayout());
    (unreachable ? job.unreachable_ : job.short_reply_) = 2;
    ProcessChannel channel(&job);
    int lost = 0;
    RemoteKvPieces pieces(&channel, [&](const absl::Status&) { ++lost; });
    const size_t n = job.piece_bytes();
    const absl::Status s = pieces.Fetch({{nullptr, nullptr, n, 1, 0}, {nullptr, nullptr, n, 2, 1}});
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find(unreachable ? "gone" : "expected"), std::string::npos) << s;
    EXPECT_EQ(lost, 1);
    std::vector<uint8_t> got(n);
    EXPECT_FALSE(pieces.Read({nullptr, nullptr, n, 1, 0}, got.data())) << "nothing is served after a loss";
    const int sent = job.sent_;
    pieces.Write({nullptr, nullptr, n, 1, 0}, got.data());
    EXPECT_EQ(pieces.Commit().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(job.sent_, sent) << "nothing more is sent once the job is lost";
    EXPECT_EQ(lost, 1);
  }
}

// A worker refuses a block outside its arena and data of the wrong size, naming them.
TEST(RemoteKvPiecesTest, AWorkerRefusesBlocksOutsideItsArenaAndMissizedData) {
  CpuBackend backend;
  auto arena = KvStorage::Create(&backend, SmallLayout());
  ASSERT_TRUE(arena.ok());
  std::string out;
  KvPieceOp op;
  op.blocks = {8};
  EXPECT_NE(ServeKvPieces(op, &backend, *arena, &out).message().find("block 8 outside"), std::string::npos);
  op.blocks = {1};
  op.write = true;
  op.data = "short";
  EXPECT_NE(ServeKvPieces(op, &backend, *arena, &out).message().find("5 bytes of data"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
