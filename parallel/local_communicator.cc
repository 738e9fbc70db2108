// Local (in-process) communicator.
#include "parallel/local_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/clock.h"

namespace moeserve {

LocalGroup::LocalGroup(int size) : size_(size), slots_(size) {
  for (int i = 0; i < size * size; ++i) channels_.push_back(std::make_unique<Channel>());
}

bool LocalGroup::ArriveAndWait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return false;
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  return generation_ != gen;
}

void LocalGroup::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
  for (auto& ch : channels_) {
    { std::lock_guard<std::mutex> lock(ch->mu); }  // a waiter checks the flag under this lock
    ch->cv.notify_all();
  }
}

bool LocalGroup::aborted() const { return aborted_.load(); }

void LocalGroup::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  arrived_ = 0;
  for (auto& ch : channels_) {
    std::lock_guard<std::mutex> ch_lock(ch->mu);
    ch->messages.clear();
  }
}

LocalComms MakeLocalComms(int size) {
  LocalComms c;
  c.group = std::make_unique<LocalGroup>(size);
  for (int r = 0; r < size; ++r) c.ranks.push_back(std::make_unique<LocalCommunicator>(c.group.get(), r));
  return c;
}

namespace {
absl::Status Aborted() { return absl::AbortedError("communicator: the group was aborted (a peer failed)"); }
}  // namespace

absl::Status LocalCommunicator::CheckPeer(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " is not another rank of a group of ", size()));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                         const std::vector<int64_t>& recv_counts, Counts /*counts*/) {
  // Threads see each other's counts in shared memory: the check costs nothing, so it always runs.
  Stopwatch sw;
  const int n = size();
  const bool shape_ok = static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n;
  // Every rank meets at both barriers, errors or not, so a bad call never hangs its peers.
  group_->slots_[rank_] = {send, shape_ok ? &send_counts : nullptr, nullptr, 0};
  if (!group_->ArriveAndWait()) return Aborted();
  absl::Status status = shape_ok ? absl::OkStatus()
                                 : absl::InvalidArgumentError(absl::StrCat("all-to-all: counts must have ", n,
                                                                           " entries, got ", send_counts.size(),
                                                                           " and ", recv_counts.size()));
  int64_t received = 0, sent = 0;
  if (shape_ok) {
    auto* out = static_cast<uint8_t*>(recv);
    int64_t out_offset = 0;
    for (int p = 0; p < n; ++p) {
      const LocalGroup::Slot& peer = group_->slots_[p];
      if (peer.send_counts == nullptr) {
        status = absl::InvalidArgumentError(absl::StrCat("all-to-all: rank ", p, " passed malformed counts"));
        break;
      }
      int64_t offset = 0;
      for (int q = 0; q < rank_; ++q) offset += (*peer.send_counts)[q];
      const int64_t len = (*peer.send_counts)[rank_];
      if (len != recv_counts[p]) {
        status = absl::InvalidArgumentError(absl::StrCat("all-to-all: rank ", p, " sends ", len,
                                                         " bytes to rank ", rank_, ", which expects ", recv_counts[p]));
        break;
      }
      if (len > 0) std::memcpy(out + out_offset, static_cast<const uint8_t*>(peer.send) + offset, len);
      out_offset += len;
      if (p != rank_) {
        received += len;
        sent += send_counts[p];
      }
    }
  }
  if (!group_->ArriveAndWait()) return Aborted();
  Book(sent, received, sw.Seconds());
  return status;
}

absl::Status LocalCommunicator::AllToAllCounts(const std::vector<int64_t>& send_counts,
                                               std::vector<int64_t>* recv_counts) {
  Stopwatch sw;
  const size_t n = static_cast<size_t>(size());
  const size_t m = send_counts.size() / n;  // counts per peer
  const bool shape_ok = m > 0 && send_counts.size() == n * m;
  group_->slots_[rank_] = {nullptr, shape_ok ? &send_counts : nullptr, nullptr, 0};
  if (!group_->ArriveAndWait()) return Aborted();
  absl::Status status = absl::OkStatus();
  recv_counts->assign(n * std::max<size_t>(m, 1), 0);
  for (size_t p = 0; p < n; ++p) {
    const auto* counts = group_->slots_[p].send_counts;
    if (counts == nullptr || counts->size() != n * m) {
      status = absl::InvalidArgumentError(absl::StrCat("all-to-all counts: rank ", p, " passed ",
                                                       counts == nullptr ? 0 : counts->size(),
                                                       " entries, not a multiple of ", n, " equal to this rank's ", n * m));
      continue;
    }
    for (size_t i = 0; i < m; ++i) (*recv_counts)[p * m + i] = (*counts)[static_cast<size_t>(rank_) * m + i];
  }
  if (!group_->ArriveAndWait()) return Aborted();
  const int64_t bytes = static_cast<int64_t>(sizeof(int64_t) * m * (n - 1));
  Book(bytes, bytes, sw.Seconds());
  return status;
}

absl::Status LocalCommunicator::AllGather(const void* send, int64_t bytes, void* recv) {
  Stopwatch sw;
  const int n = size();
  group_->slots_[rank_] = {send, nullptr, nullptr, bytes};
  if (!group_->ArriveAndWait()) return Aborted();
  absl::Status status = absl::OkStatus();
  for (int p = 0; p < n; ++p) {
    const LocalGroup::Slot& peer = group_->slots_[p];
    if (peer.bytes != bytes) {
      status = absl::InvalidArgumentError(absl::StrCat("all-gather: rank ", p, " sends ", peer.bytes,
                                                       " bytes, rank ", rank_, " ", bytes));
      break;
    }
    if (bytes > 0) std::memcpy(static_cast<uint8_t*>(recv) + p * bytes, peer.send, bytes);
  }
  if (!group_->ArriveAndWait()) return Aborted();
  Book(bytes * (n - 1), bytes * (n - 1), sw.Seconds());
  return status;
}

absl::Status LocalCommunicator::AllReduceSum(float* data, int64_t count) {
  Stopwatch sw;
  const int n = size();
  group_->slots_[rank_] = {nullptr, nullptr, data, count};
  if (!group_->ArriveAndWait()) return Aborted();
  absl::Status status = absl::OkStatus();
  std::vector<float> sum(static_cast<size_t>(count), 0.0f);
  for (int p = 0; p < n && status.ok(); ++p) {  // rank order: the same bits everywhere
    const LocalGroup::Slot& peer = group_->slots_[p];
    if (peer.bytes != count) {
      status = absl::InvalidArgumentError(absl::StrCat("all-reduce: rank ", p, " has ", peer.bytes,
                                                       " elements, rank ", rank_, " ", count));
      break;
    }
    for (int64_t i = 0; i < count; ++i) sum[i] += peer.reduce[i];
  }
  if (!group_->ArriveAndWait()) return Aborted();  // everyone has read every buffer: now overwrite our own
  if (status.ok() && count > 0) std::memcpy(data, sum.data(), count * sizeof(float));
  const int64_t moved = count * static_cast<int64_t>(sizeof(float)) * (n - 1);
  Book(moved, moved, sw.Seconds());
  return status;
}

absl::Status LocalCommunicator::Send(const void* data, int64_t bytes, int peer) {
  if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
  Stopwatch sw;
  LocalGroup::Channel& ch = *group_->channels_[rank_ * size() + peer];
  {
    std::lock_guard<std::mutex> lock(ch.mu);
    const auto* p = static_cast<const uint8_t*>(data);
    ch.messages.emplace_back(p, p + bytes);
  }
  ch.cv.notify_all();
  Book(bytes, 0, sw.Seconds());
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Recv(void* data, int64_t bytes, int peer) {
  if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
  Stopwatch sw;
  LocalGroup::Channel& ch = *group_->channels_[peer * size() + rank_];
  std::vector<uint8_t> msg;
  {
    std::unique_lock<std::mutex> lock(ch.mu);
    ch.cv.wait(lock, [&] { return !ch.messages.empty() || group_->aborted(); });
    if (ch.messages.empty()) return Aborted();
    msg = std::move(ch.messages.front());
    ch.messages.pop_front();
  }
  if (static_cast<int64_t>(msg.size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("recv: rank ", peer, " sent ", msg.size(), " bytes, rank ",
                                                   rank_, " expected ", bytes));
  }
  if (bytes > 0) std::memcpy(data, msg.data(), bytes);
  Book(0, bytes, sw.Seconds());
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Barrier() {
  Stopwatch sw;
  if (!group_->ArriveAndWait()) return Aborted();
  Book(0, 0, sw.Seconds());
  return absl::OkStatus();
}

void LocalCommunicator::Book(int64_t sent, int64_t received, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.calls;
  stats_.bytes_sent += sent;
  stats_.bytes_received += received;
  stats_.seconds += seconds;
}

CommStats LocalCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace moeserve
