// MpiCommunicator.
#include "parallel/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {
namespace {

absl::Status Aborted() { return absl::AbortedError("communicator: this rank aborted the group"); }

// Counts and displacements for MPI's int-sized interfaces.
absl::Status ToInts(const std::vector<int64_t>& counts, std::vector<int>* out,
                    std::vector<int>* displs, const char* what) {
  out->resize(counts.size());
  displs->resize(counts.size());
  int64_t offset = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] < 0 || counts[p] > INT_MAX || offset > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-to-all: ", what, "[", p, "] = ", counts[p],
                       " is negative or beyond MPI's 2 GiB per call"));
    }
    (*out)[p] = static_cast<int>(counts[p]);
    (*displs)[p] = static_cast<int>(offset);
    offset += counts[p];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WaitForMpi(MPI_Request* request, MPI_Status* status, const AbortSignal* signal,
                        const char* what) {
  // Spin first (a decode step's exchanges take microseconds), then yield, then sleep briefly:
  // oversubscribed ranks must leave the cores to the peers they wait for.
  for (int64_t spins = 0;; ++spins) {
    int done = 0;
    const int err = MPI_Test(request, &done, status);
    if (err != MPI_SUCCESS) {
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(err, text, &len);
      return absl::UnavailableError(
          absl::StrCat(what, " failed: ", std::string(text, static_cast<size_t>(len))));
    }
    if (done) return absl::OkStatus();
    if (signal != nullptr && signal->raised()) {
      return absl::UnavailableError(absl::StrCat(what, " gave up: ", signal->message()));
    }
    if (spins > 200000) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (spins > 2000) {
      std::this_thread::yield();
    }
  }
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return absl::FailedPreconditionError("MPI is not initialised (MPI_Init_thread first)");
  MPI_Comm dup;
  if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS) return absl::UnavailableError("MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0, size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, rank, size));
}

MpiCommunicator::~MpiCommunicator() {
  if (!aborted_) (void)ReapSends(/*wait=*/true);
  MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::Check(int err, const char* what) const {
  if (err == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  return absl::UnavailableError(
      absl::StrCat("communicator: ", what, " on rank ", rank_,
                   " failed: ", std::string(text, static_cast<size_t>(len))));
}

absl::Status MpiCommunicator::CheckPeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer, " is not another rank of a group of ", size_));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Wait(MPI_Request* request, MPI_Status* status, const char* what) {
  absl::Status s = WaitForMpi(request, status, signal_, what);
  if (absl::IsUnavailable(s)) aborted_ = true;  // the group is unusable, the job is ending
  return s.ok() ? s : absl::Status(s.code(), absl::StrCat("communicator: rank ", rank_, ": ", s.message()));
}

absl::Status MpiCommunicator::ReapSends(bool wait) {
  for (size_t i = 0; i < sends_.size();) {
    int done = 0;
    MPI_Status st;
    if (wait) {
      RETURN_IF_ERROR(Wait(&sends_[i]->request, &st, "send"));
    } else {
      RETURN_IF_ERROR(Check(MPI_Test(&sends_[i]->request, &done, &st), "send"));
    }
    if (wait || done) {
      sends_.erase(sends_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::ExchangeCounts(const std::vector<int64_t>& send_counts,
                                             std::vector<int64_t>* recv_counts, bool count_traffic) {
  const int m = static_cast<int>(send_counts.size() / static_cast<size_t>(size_));  // per peer, equal on every rank
  recv_counts->assign(send_counts.size(), 0);
  MPI_Request req;
  RETURN_IF_ERROR(Check(MPI_Ialltoall(send_counts.data(), m, MPI_INT64_T, recv_counts->data(), m,
                                      MPI_INT64_T, comm_, &req),
                        "MPI_Ialltoall"));
  RETURN_IF_ERROR(Wait(&req, MPI_STATUS_IGNORE, "MPI_Ialltoall"));
  if (count_traffic) {
    stats_.bytes_sent += static_cast<int64_t>(sizeof(int64_t)) * m * (size_ - 1);
    stats_.bytes_received += static_cast<int64_t>(sizeof(int64_t)) * m * (size_ - 1);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllToAllCounts(const std::vector<int64_t>& send_counts,
                                             std::vector<int64_t>* recv_counts) {
  if (aborted_) return Aborted();
  const size_t n = static_cast<size_t>(size_);
  if (send_counts.empty() || send_counts.size() % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-to-all counts: ", send_counts.size(), " counts for a group of ", size_));
  }
  Stopwatch sw;
  RETURN_IF_ERROR(ExchangeCounts(send_counts, recv_counts, /*count_traffic=*/true));
  ++stats_.calls;
  stats_.seconds += sw.Seconds();
  return absl::OkStatus();
}

absl::Status MpiCommunicator::CheckCounts(const std::vector<int64_t>& send_counts,
                                          const std::vector<int64_t>& recv_counts) {
  const size_t n = static_cast<size_t>(size_);
  // Every rank learns whether any rank's counts are malformed or disagree with its peers', and
  // all return the same error before any data moves.
  int64_t bad = (send_counts.size() != n || recv_counts.size() != n) ? 1 : 0;
  std::vector<int64_t> expected;
  // A rank with malformed counts still takes part in the exchange (with zeros).
  RETURN_IF_ERROR(ExchangeCounts(bad == 0 ? send_counts : std::vector<int64_t>(n, 0), &expected,
                                 /*count_traffic=*/false));
  if (bad == 0) {
    for (size_t p = 0; p < n; ++p) {
      if (expected[p] != recv_counts[p]) bad = 2 + static_cast<int64_t>(p);
    }
  }
  int64_t any_bad = 0;
  MPI_Request req;
  RETURN_IF_ERROR(Check(MPI_Iallreduce(&bad, &any_bad, 1, MPI_INT64_T, MPI_MAX, comm_, &req),
                        "MPI_Iallreduce"));
  RETURN_IF_ERROR(Wait(&req, MPI_STATUS_IGNORE, "MPI_Iallreduce"));
  if (any_bad != 0) {
    if (bad == 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-to-all: counts must have ", n, " entries"));
    }
    if (bad >= 2) {
      const size_t p = static_cast<size_t>(bad - 2);
      return absl::InvalidArgumentError(absl::StrCat("all-to-all: rank ", p, " sends ", expected[p],
                                                     " bytes to rank ", rank_, ", which expects ",
                                                     recv_counts[p]));
    }
    return absl::InvalidArgumentError(
        "all-to-all: another rank passed counts that disagree with its peers'");
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllToAll(const void* send, const std::vector<int64_t>& send_counts,
                                       void* recv, const std::vector<int64_t>& recv_counts, Counts counts) {
  if (aborted_) return Aborted();
  Stopwatch sw;  // the counts check included
  const size_t n = static_cast<size_t>(size_);
  if (counts == Counts::kChecked) {
    RETURN_IF_ERROR(CheckCounts(send_counts, recv_counts));
  } else if (send_counts.size() != n || recv_counts.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: counts must have ", n, " entries"));
  }
  MPI_Request req;
  std::vector<int> sc, sd, rc, rd;
  RETURN_IF_ERROR(ToInts(send_counts, &sc, &sd, "send_counts"));
  RETURN_IF_ERROR(ToInts(recv_counts, &rc, &rd, "recv_counts"));
  RETURN_IF_ERROR(Check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(),
                                       rd.data(), MPI_BYTE, comm_, &req),
                        "MPI_Ialltoallv"));
  RETURN_IF_ERROR(Wait(&req, MPI_STATUS_IGNORE, "MPI_Ialltoallv"));
  ++stats_.calls;
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == rank_) continue;
    stats_.bytes_sent += send_counts[p];
    stats_.bytes_received += recv_counts[p];
  }
  stats_.seconds += sw.Seconds();
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGather(const void* send, int64_t bytes, void* recv) {
  if (aborted_) return Aborted();
  if (bytes < 0 || bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-gather: ", bytes, " bytes is beyond MPI's 2 GiB per call"));
  }
  Stopwatch sw;
  MPI_Request req;
  RETURN_IF_ERROR(Check(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                       static_cast<int>(bytes), MPI_BYTE, comm_, &req),
                        "MPI_Iallgather"));
  RETURN_IF_ERROR(Wait(&req, MPI_STATUS_IGNORE, "MPI_Iallgather"));
  ++stats_.calls;
  stats_.bytes_sent += bytes * (size_ - 1);
  stats_.bytes_received += bytes * (size_ - 1);
  stats_.seconds += sw.Seconds();
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllReduceSum(float* data, int64_t count) {
  if (aborted_) return Aborted();
  std::vector<float> all(static_cast<size_t>(count * size_));
  RETURN_IF_ERROR(AllGather(data, count * static_cast<int64_t>(sizeof(float)), all.data()));
  for (int64_t i = 0; i < count; ++i) {
    float sum = all[static_cast<size_t>(i)];
    for (int p = 1; p < size_; ++p) sum += all[static_cast<size_t>(p * count + i)];
    data[i] = sum;
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Send(const void* data, int64_t bytes, int peer) {
  if (aborted_) return Aborted();
  RETURN_IF_ERROR(CheckPeer(peer));
  if (bytes < 0 || bytes > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("send: ", bytes, " bytes"));
  RETURN_IF_ERROR(ReapSends(/*wait=*/false));
  auto s = std::make_unique<PendingSend>();
  s->data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  RETURN_IF_ERROR(Check(
      MPI_Isend(s->data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &s->request),
      "MPI_Isend"));
  sends_.push_back(std::move(s));
  ++stats_.calls;
  stats_.bytes_sent += bytes;
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Recv(void* data, int64_t bytes, int peer) {
  if (aborted_) return Aborted();
  RETURN_IF_ERROR(CheckPeer(peer));
  if (bytes < 0 || bytes > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("recv: ", bytes, " bytes"));
  Stopwatch sw;
  MPI_Status st;
  MPI_Request req;
  RETURN_IF_ERROR(Check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &req),
                        "MPI_Irecv"));
  RETURN_IF_ERROR(Wait(&req, &st, "MPI_Irecv"));
  int got = 0;
  MPI_Get_count(&st, MPI_BYTE, &got);
  if (got != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("recv: rank ", peer, " sent ", got,
                                                   " bytes, rank ", rank_, " expected ", bytes));
  }
  ++stats_.calls;
  stats_.bytes_received += bytes;
  stats_.seconds += sw.Seconds();
  return ReapSends(/*wait=*/false);
}

absl::Status MpiCommunicator::Barrier() {
  if (aborted_) return Aborted();
  Stopwatch sw;
  RETURN_IF_ERROR(ReapSends(/*wait=*/true));
  MPI_Request req;
  RETURN_IF_ERROR(Check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier"));
  RETURN_IF_ERROR(Wait(&req, MPI_STATUS_IGNORE, "MPI_Ibarrier"));
  ++stats_.calls;
  stats_.seconds += sw.Seconds();
  return absl::OkStatus();
}

void MpiCommunicator::Abort() {
  aborted_ = true;
  MPI_Abort(comm_, 1);
}

}  // namespace moeserve
