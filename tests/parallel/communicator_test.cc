// parallel/: the local communicator against independent computations, with uneven and zero
// counts and fresh random data: every byte lands where the peer-order packing says, the
// all-reduce equals the rank-order sum, malformed calls fail on every rank without hanging.
// The NCCL communicator runs only with two or more GPUs.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "parallel/comm_group.h"
#include "parallel/local_communicator.h"
#if MOESERVE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#include "parallel/nccl_communicator.h"
#endif

namespace moeserve {
namespace {

// Runs fn(rank) on `n` threads and waits.
template <typename Fn>
void OnRanks(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// The byte that rank `src` sends as the i-th byte of its message to `dst`.
uint8_t ByteOf(int src, int dst, int64_t i, uint32_t salt) {
  return static_cast<uint8_t>((src * 131 + dst * 31 + i * 7 + salt) & 0xff);
}

TEST(LocalCommunicatorTest, AllToAllWithUnevenAndZeroCounts) {
  std::mt19937 gen(std::random_device{}());
  for (int n : {1, 2, 3, 4}) {
    for (int round = 0; round < 5; ++round) {
      // counts[src][dst]: random, with about a third zero.
      std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(n));
      for (auto& row : counts) {
        for (auto& c : row) c = gen() % 3 == 0 ? 0 : 1 + gen() % 300;
      }
      const uint32_t salt = gen();
      LocalComms comms = MakeLocalComms(n);
      std::vector<std::string> errors(n);
      OnRanks(n, [&](int r) {
        Communicator& c = *comms.ranks[r];
        std::vector<int64_t> send_counts = counts[r], recv_counts;
        std::vector<uint8_t> send;
        for (int dst = 0; dst < n; ++dst) {
          for (int64_t i = 0; i < counts[r][dst]; ++i) send.push_back(ByteOf(r, dst, i, salt));
        }
        if (absl::Status s = c.AllToAllCounts(send_counts, &recv_counts); !s.ok()) {
          errors[r] = std::string(s.message());
          return;
        }
        int64_t total = 0;
        for (int src = 0; src < n; ++src) {
          if (recv_counts[src] != counts[src][r]) errors[r] += "wrong count from " + std::to_string(src) + "; ";
          total += recv_counts[src];
        }
        std::vector<uint8_t> recv(total, 0xee);
        if (absl::Status s = c.AllToAll(send.data(), send_counts, recv.data(), recv_counts, Counts::kChecked); !s.ok()) {
          errors[r] = std::string(s.message());
          return;
        }
        int64_t off = 0;
        for (int src = 0; src < n; ++src) {
          for (int64_t i = 0; i < counts[src][r]; ++i) {
            if (recv[off + i] != ByteOf(src, r, i, salt)) {
              errors[r] += "byte " + std::to_string(i) + " from " + std::to_string(src) + " wrong; ";
              break;
            }
          }
          off += counts[src][r];
        }
        int64_t expect_sent = 0;
        for (int dst = 0; dst < n; ++dst) expect_sent += dst == r ? 0 : counts[r][dst];
        if (c.stats().bytes_sent != expect_sent + 8 * (n - 1)) errors[r] += "bytes_sent wrong; ";
      });
      for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "size " << n << " rank " << r;
    }
  }
}

// Several counts per peer (the expert dispatch sends one per expert the peer holds): each lands
// at its sender's place; a call whose size is not a multiple of the group fails on every rank.
TEST(LocalCommunicatorTest, CountsExchangeCarriesSeveralCountsPerPeer) {
  std::mt19937 gen(std::random_device{}());
  for (int n : {1, 2, 3}) {
    for (int64_t m : {1, 3}) {
      const uint32_t salt = gen() % 1000;
      auto count = [&](int src, int dst, int64_t i) { return int64_t{src * 1000 + dst * 10 + i + salt}; };
      const auto group = MakeLocalGroup(n);
      std::vector<std::string> errors(n);
      OnRanks(n, [&](int r) {
        std::vector<int64_t> send(static_cast<size_t>(n * m)), recv;
        for (int p = 0; p < n; ++p) {
          for (int64_t i = 0; i < m; ++i) send[p * m + i] = count(r, p, i);
        }
        if (absl::Status s = group->rank(r)->AllToAllCounts(send, &recv); !s.ok()) {
          errors[r] = std::string(s.message());
          return;
        }
        for (int p = 0; p < n; ++p) {
          for (int64_t i = 0; i < m; ++i) {
            if (recv[p * m + i] != count(p, r, i)) errors[r] += "wrong count " + std::to_string(i) + " from " + std::to_string(p) + "; ";
          }
        }
      });
      for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << n << " ranks, " << m << " per peer, rank " << r;
    }
  }
  const auto group = MakeLocalGroup(2);
  std::vector<absl::Status> status(2);
  OnRanks(2, [&](int r) {
    std::vector<int64_t> recv;
    status[r] = group->rank(r)->AllToAllCounts(std::vector<int64_t>(r == 0 ? 3 : 4, 1), &recv);
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInvalidArgument) << status[1];
}

TEST(LocalCommunicatorTest, MismatchedCountsFailOnEveryAffectedRankWithoutHanging) {
  LocalComms comms = MakeLocalComms(3);
  std::vector<absl::Status> status(3);
  OnRanks(3, [&](int r) {
    std::vector<uint8_t> send(30, 1), recv(30);
    std::vector<int64_t> counts = {10, 10, 10};
    std::vector<int64_t> recv_counts = counts;
    if (r == 2) recv_counts = {10, 5, 10};  // rank 1 really sends 10
    status[r] = comms.ranks[r]->AllToAll(send.data(), counts, recv.data(), recv_counts, Counts::kChecked);
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(status[2].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status[2].message()).find("rank 1 sends 10 bytes to rank 2, which expects 5"),
            std::string::npos)
      << status[2];
  // A count vector of the wrong length: the caller and its peers fail, nobody hangs.
  OnRanks(3, [&](int r) {
    std::vector<uint8_t> buf(30);
    std::vector<int64_t> counts = r == 0 ? std::vector<int64_t>{10, 10} : std::vector<int64_t>{10, 10, 10};
    status[r] = comms.ranks[r]->AllToAll(buf.data(), counts, buf.data(), std::vector<int64_t>(3, 10), Counts::kChecked);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << r;
}

TEST(LocalCommunicatorTest, AllGatherAllReduceSendRecvAndBarrier) {
  std::mt19937 gen(std::random_device{}());
  const int n = 4;
  const int64_t count = 1 + gen() % 1000;
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : data) {
    for (auto& x : v) x = u(gen);
  }
  // Oracle: the rank-order sum, computed independently.
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) sum[i] += data[r][i];
  }
  LocalComms comms = MakeLocalComms(n);
  std::vector<std::string> errors(n);
  OnRanks(n, [&](int r) {
    Communicator& c = *comms.ranks[r];
    std::vector<float> gathered(n * count);
    if (!c.AllGather(data[r].data(), count * sizeof(float), gathered.data()).ok()) errors[r] += "gather failed; ";
    for (int p = 0; p < n; ++p) {
      if (!std::equal(data[p].begin(), data[p].end(), gathered.begin() + p * count)) errors[r] += "gather wrong; ";
    }
    std::vector<float> mine = data[r];
    if (!c.AllReduceSum(mine.data(), count).ok()) errors[r] += "reduce failed; ";
    if (mine != sum) errors[r] += "reduce differs from the rank-order sum; ";
    // A ring: send to the next rank, receive from the previous, twice (messages keep order).
    for (int round = 0; round < 2; ++round) {
      const std::vector<float> out(count, static_cast<float>(r * 10 + round));
      if (!c.Send(out.data(), count * sizeof(float), (r + 1) % n).ok()) errors[r] += "send failed; ";
    }
    for (int round = 0; round < 2; ++round) {
      std::vector<float> in(count);
      if (!c.Recv(in.data(), count * sizeof(float), (r + n - 1) % n).ok()) errors[r] += "recv failed; ";
      if (in[count - 1] != static_cast<float>(((r + n - 1) % n) * 10 + round)) errors[r] += "recv wrong; ";
    }
    if (!c.Barrier().ok()) errors[r] += "barrier failed; ";
    if (c.Send(nullptr, 0, r).ok()) errors[r] += "send to self accepted; ";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

#if MOESERVE_HAVE_CUDA
TEST(NcclCommunicatorTest, AllToAllAcrossGpus) {
  const int n = static_cast<int>(cuda::ListDevices().size());
  if (n < 2) GTEST_SKIP() << "needs two or more GPUs, found " << n;
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::string> errors(n);
  OnRanks(n, [&](int r) {
    auto comm = NcclCommunicator::Create(*id, r, n, r);
    if (!comm.ok()) {
      errors[r] = std::string(comm.status().message());
      return;
    }
    // Rank r sends (r + p) % 3 * 64 bytes to peer p (some zero).
    std::vector<int64_t> send_counts(n), recv_counts(n);
    std::vector<uint8_t> host_send;
    for (int p = 0; p < n; ++p) {
      send_counts[p] = (r + p) % 3 * 64;
      recv_counts[p] = (p + r) % 3 * 64;
      for (int64_t i = 0; i < send_counts[p]; ++i) host_send.push_back(ByteOf(r, p, i, 5));
    }
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    void *d_send = nullptr, *d_recv = nullptr;
    cudaSetDevice(r);
    cudaMalloc(&d_send, host_send.size() + 1);
    cudaMalloc(&d_recv, total + 1);
    cudaMemcpy(d_send, host_send.data(), host_send.size(), cudaMemcpyHostToDevice);
    if (absl::Status s = (*comm)->AllToAll(d_send, send_counts, d_recv, recv_counts, Counts::kChecked); !s.ok()) {
      errors[r] = std::string(s.message());
    }
    std::vector<uint8_t> got(total);
    cudaMemcpy(got.data(), d_recv, total, cudaMemcpyDeviceToHost);
    int64_t off = 0;
    for (int p = 0; p < n; ++p) {
      for (int64_t i = 0; i < recv_counts[p]; ++i) {
        if (got[off + i] != ByteOf(p, r, i, 5)) {
          errors[r] += "wrong byte; ";
          break;
        }
      }
      off += recv_counts[p];
    }
    cudaFree(d_send);
    cudaFree(d_recv);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}
#endif

}  // namespace
}  // namespace moeserve
