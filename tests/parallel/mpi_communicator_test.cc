// MpiCommunicator under mpirun (ctest starts 3 and 4 processes, over Open MPI's TCP and
// shared-memory transports): every rank computes what it must receive from formulas of the
// sender, receiver and byte index, so each checks its own results with no oracle process.
// Uneven and zero all-to-all counts, counts that disagree (refused on every rank, and the group
// still works after), all-gather, the rank-ordered all-reduce (bit-identical everywhere),
// non-blocking sends around a ring, and the traffic statistics.
#include "parallel/mpi_communicator.h"

#include <mpi.h>

#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace moeserve {
namespace {

// Bytes rank `from` sends to rank `to` in round `round`, and their contents.
int64_t Count(int from, int to, int round) {
  return (from * 3 + to * 5 + round * 7) % 9 == 0 ? 0 : (from * 37 + to * 11 + round) % 50;
}
char Byte(int from, int to, int64_t i) {
  return static_cast<char>((from * 31 + to * 17 + i) & 0xff);
}

std::unique_ptr<MpiCommunicator> Make() {
  auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(MpiCommunicatorTest, AllToAllWithUnevenAndZeroCounts) {
  auto comm = Make();
  const int me = comm->rank(), n = comm->size();
  for (int round = 0; round < 5; ++round) {
    std::vector<int64_t> send_counts(n), want_recv(n);
    std::vector<char> send;
    for (int p = 0; p < n; ++p) {
      send_counts[p] = Count(me, p, round);
      want_recv[p] = Count(p, me, round);
      for (int64_t i = 0; i < send_counts[p]; ++i) send.push_back(Byte(me, p, i));
    }
    std::vector<int64_t> recv_counts;
    ASSERT_TRUE(comm->AllToAllCounts(send_counts, &recv_counts).ok());
    EXPECT_EQ(recv_counts, want_recv);
    // Three counts per peer, as the expert dispatch sends one per expert of the peer.
    std::vector<int64_t> triple(3 * n), want_triple(3 * n), got_triple;
    for (int p = 0; p < n; ++p) {
      for (int i = 0; i < 3; ++i) {
        triple[3 * p + i] = Count(me, p, round) * 10 + i;
        want_triple[3 * p + i] = Count(p, me, round) * 10 + i;
      }
    }
    ASSERT_TRUE(comm->AllToAllCounts(triple, &got_triple).ok());
    EXPECT_EQ(got_triple, want_triple);
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    std::vector<char> recv(static_cast<size_t>(total) + 1, '?');
    const CommStats before = comm->stats();
    // Checked counts in even rounds; in odd ones the counts just exchanged, agreed (no check).
    const Counts mode = round % 2 == 0 ? Counts::kChecked : Counts::kAgreed;
    ASSERT_TRUE(comm->AllToAll(send.data(), send_counts, recv.data(), recv_counts, mode).ok());
    int64_t at = 0, wrong = 0, sent_to_others = 0;
    for (int p = 0; p < n; ++p) {
      for (int64_t i = 0; i < recv_counts[p]; ++i) wrong += recv[at++] != Byte(p, me, i);
      if (p != me) sent_to_others += send_counts[p];
    }
    EXPECT_EQ(wrong, 0) << "rank " << me << " round " << round;
    EXPECT_EQ(recv[total], '?') << "wrote past the receive buffer";
    // The payload only: the check of the counts inside AllToAll is not the model's traffic.
    EXPECT_EQ(comm->stats().bytes_sent - before.bytes_sent, sent_to_others);
  }
}

TEST(MpiCommunicatorTest, CountsThatDisagreeAreRefusedOnEveryRankAndTheGroupGoesOn) {
  auto comm = Make();
  const int me = comm->rank(), n = comm->size();
  std::vector<int64_t> send_counts(n, 4), recv_counts(n, 4);
  if (me == 0) recv_counts[n - 1] = 5;  // rank n-1 sends 4
  std::vector<char> send(4 * n, 'x'), recv(5 * n);
  const absl::Status s = comm->AllToAll(send.data(), send_counts, recv.data(), recv_counts, Counts::kChecked);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << me << ": " << s;
  if (me == 0)
    EXPECT_NE(s.message().find("sends 4 bytes to rank 0, which expects 5"), std::string::npos) << s;
  recv_counts[n - 1] = 4;
  EXPECT_TRUE(comm->AllToAll(send.data(), send_counts, recv.data(), recv_counts, Counts::kChecked).ok());
  EXPECT_EQ(comm->AllToAll(send.data(), {1}, recv.data(), {1}, Counts::kChecked).code(),
            n == 1 ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->Barrier().ok());
}

TEST(MpiCommunicatorTest, AllGatherAndARankOrderedAllReduce) {
  auto comm = Make();
  const int me = comm->rank(), n = comm->size();
  const int64_t count = 1000;
  std::vector<std::vector<float>> per_rank(n, std::vector<float>(count));
  for (int p = 0; p < n; ++p) {
    std::mt19937 gen(1000 + p);
    std::normal_distribution<float> d(0.0f, 1e3f);
    for (float& v : per_rank[p]) v = d(gen);
  }
  std::vector<float> gathered(count * n);
  ASSERT_TRUE(comm->AllGather(per_rank[me].data(), count * sizeof(float), gathered.data()).ok());
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(std::memcmp(gathered.data() + p * count, per_rank[p].data(), count * sizeof(float)),
              0)
        << p;
  }
  std::vector<float> data = per_rank[me], want(count);
  for (int64_t i = 0; i < count; ++i) {
    float sum = per_rank[0][i];
    for (int p = 1; p < n; ++p) sum += per_rank[p][i];
    want[i] = sum;
  }
  ASSERT_TRUE(comm->AllReduceSum(data.data(), count).ok());
  EXPECT_EQ(std::memcmp(data.data(), want.data(), count * sizeof(float)), 0)
      << "not the rank-order sum, bit for bit";
}

TEST(MpiCommunicatorTest, SendsDoNotWaitForTheirReceivesAroundARing) {
  auto comm = Make();
  const int me = comm->rank(), n = comm->size();
  const int64_t bytes = 4 << 20;  // far past any eager limit: a blocking send would deadlock
  std::vector<char> out(bytes), in(bytes);
  for (int64_t i = 0; i < bytes; ++i) out[i] = Byte(me, (me + 1) % n, i);
  ASSERT_TRUE(comm->Send(out.data(), bytes, (me + 1) % n).ok());
  std::fill(out.begin(), out.end(), 0);  // the communicator kept its own copy
  ASSERT_TRUE(comm->Recv(in.data(), bytes, (me + n - 1) % n).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < bytes; ++i) wrong += in[i] != Byte((me + n - 1) % n, me, i);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(comm->Send(out.data(), 1, me).code(), absl::StatusCode::kInvalidArgument)
      << "not to itself";
  EXPECT_EQ(comm->Recv(in.data(), 1, n).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->Barrier().ok());
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank prints the report; every rank's failures still fail its exit code
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any != 0 && failed == 0) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any;
}
