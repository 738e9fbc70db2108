// Communicators for ranks that are threads of one process (the CPU backend's virtual devices).
//
// A LocalGroup is shared by its ranks; each rank gets its own LocalCommunicator. Collectives
// publish each rank's buffers in a table, meet at a barrier, copy what they need straight from
// the peers' buffers, and meet again so no buffer is reused early. Send/Recv go through one
// queue per (source, destination) pair.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/communicator.h"

namespace moeserve {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  int size() const { return size_; }
  // Makes every pending and later collective or Recv of the group return ABORTED, so that the
  // peers of a rank that failed halfway through a step do not wait for it forever.
  void Abort();
  bool aborted() const;
  // Clears an aborted group for reuse: flags, barrier, queued messages. Only while no rank is
  // inside a call.
  void Reset();

 private:
  friend class LocalCommunicator;
  // A reusable barrier that an abort releases; false when the group was aborted.
  bool ArriveAndWait();
  struct Slot {  // what a rank publishes for the collective in progress
    const void* send = nullptr;
    const std::vector<int64_t>* send_counts = nullptr;
    float* reduce = nullptr;
    int64_t bytes = 0;
  };
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint8_t>> messages;
  };
  int size_;
  std::mutex mu_;  // barrier state
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  // Read by Recv under a channel's lock, so not guarded by mu_ (one lock at a time there).
  std::atomic<bool> aborted_{false};
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Channel>> channels_;  // [src * size + dst]
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts, Counts counts) override;
  absl::Status AllToAllCounts(const std::vector<int64_t>& send_counts, std::vector<int64_t>* recv_counts) override;
  absl::Status AllGather(const void* send, int64_t bytes, void* recv) override;
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status Send(const void* data, int64_t bytes, int peer) override;
  absl::Status Recv(void* data, int64_t bytes, int peer) override;
  absl::Status Barrier() override;
  CommStats stats() const override;
  void Abort() override { group_->Abort(); }

 private:
  absl::Status CheckPeer(int peer) const;
  // Adds one call's traffic to the stats (read by other threads).
  void Book(int64_t sent, int64_t received, double seconds);
  LocalGroup* group_;
  int rank_;
  mutable std::mutex mu_;  // stats are read by other threads
  CommStats stats_;
};

// A group of `size` local ranks and their communicators (index = rank).
struct LocalComms {
  std::unique_ptr<LocalGroup> group;
  std::vector<std::unique_ptr<LocalCommunicator>> ranks;
};
LocalComms MakeLocalComms(int size);

}  // namespace moeserve
