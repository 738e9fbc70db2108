// NCCL communicator.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr, " failed: ", ncclGetErrorString(r)));
}

#define NCCL_RETURN_IF_ERROR(expr)                                              \
  do {                                                                          \
    ::absl::Status _s = NcclStatus((expr), #expr, __FILE__, __LINE__);          \
    if (!_s.ok()) return _s;                                                    \
  } while (0)

// The first failure among the calls of an NCCL group, which is closed whatever happens: an open
// group would defer every later NCCL call of this thread.
struct FirstError {
  absl::Status status;
  void Note(ncclResult_t r, const char* what) {
    if (status.ok() && r != ncclSuccess) status = NcclStatus(r, what, __FILE__, __LINE__);
  }
};

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int64_t* counts_send = nullptr;  // device scratch for count exchanges and barriers
  int64_t* counts_recv = nullptr;
  size_t counts_capacity = 0;      // int64 values of each
  std::shared_ptr<std::atomic<bool>> abort_flag;  // shared by the group's ranks; never null

  // Also frees a half-built rank whose creation failed.
  ~Impl() {
    cudaSetDevice(device);
    if (comm != nullptr) {
      // After a peer's failure this rank's work may never complete: abort rather than wait.
      if (abort_flag != nullptr && abort_flag->load()) {
        ncclCommAbort(comm);
      } else {
        ncclCommDestroy(comm);
      }
    }
    cudaFree(counts_send);
    cudaFree(counts_recv);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

absl::StatusOr<std::unique_ptr<NcclCommunicator::Impl>> NcclCommunicator::NewImpl(
    int device, int size, std::shared_ptr<std::atomic<bool>> abort_flag) {
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->abort_flag = abort_flag != nullptr ? std::move(abort_flag) : std::make_shared<std::atomic<bool>>(false);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->counts_send, sizeof(int64_t) * size));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->counts_recv, sizeof(int64_t) * size));
  CUDA_RETURN_IF_ERROR(cudaMemset(impl->counts_send, 0, sizeof(int64_t) * size));
  impl->counts_capacity = static_cast<size_t>(size);
  return impl;
}

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const std::string& unique_id, int rank, int size, int device, std::shared_ptr<std::atomic<bool>> abort_flag) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: unique id has ", unique_id.size(), " bytes, not ", sizeof(id)));
  }
  if (rank < 0 || rank >= size) return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", rank, " of ", size));
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, NewImpl(device, size, std::move(abort_flag)));
  NCCL_RETURN_IF_ERROR(ncclCommInitRank(&impl->comm, size, id, rank));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl), rank, size));
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateAll(
    const std::vector<int>& devices) {
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  std::vector<NcclCommunicator*> ranks;
  const int n = static_cast<int>(devices.size());
  for (int r = 0; r < n; ++r) {
    out.push_back(std::unique_ptr<NcclCommunicator>(new NcclCommunicator(nullptr, r, n)));
    ranks.push_back(out.back().get());
  }
  RETURN_IF_ERROR(ReinitAll(devices, ranks));
  return out;
}

absl::Status NcclCommunicator::ReinitAll(const std::vector<int>& devices, const std::vector<NcclCommunicator*>& ranks) {
  const int n = static_cast<int>(devices.size());
  if (n < 1) return absl::InvalidArgumentError("nccl: a group needs at least one GPU");
  if (static_cast<int>(ranks.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", ranks.size(), " ranks for ", n, " GPUs"));
  }
  for (NcclCommunicator* r : ranks) r->impl_.reset();  // the old communicators go first (aborted ones too)
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::unique_ptr<Impl>> impls;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, NewImpl(devices[r], n, flag));
    impls.push_back(std::move(impl));
  }
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_RETURN_IF_ERROR(ncclCommInitAll(comms.data(), n, devices.data()));
  for (int r = 0; r < n; ++r) impls[r]->comm = comms[r];
  // Connect every pair and the collectives' rings now, from this one thread: NCCL connects peers
  // lazily by default, and a rank blocked in such a handshake with a peer that has already failed
  // would never reach the loop in Wait() that watches the abort flag.
  FirstError first;
  first.Note(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      first.Note(ncclSend(impls[r]->counts_send, 1, ncclInt8, p, impls[r]->comm, impls[r]->stream),
                 "warm-up ncclSend");
      first.Note(ncclRecv(reinterpret_cast<char*>(impls[r]->counts_recv) + p, 1, ncclInt8, p, impls[r]->comm,
                          impls[r]->stream),
                 "warm-up ncclRecv");
    }
  }
  first.Note(ncclGroupEnd(), "ncclGroupEnd");
  first.Note(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < n; ++r) {
    first.Note(ncclAllReduce(impls[r]->counts_send, impls[r]->counts_recv, 1, ncclInt64, ncclSum, impls[r]->comm,
                             impls[r]->stream),
               "warm-up ncclAllReduce");
  }
  first.Note(ncclGroupEnd(), "ncclGroupEnd");
  RETURN_IF_ERROR(first.status);
  for (int r = 0; r < n; ++r) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impls[r]->stream));
    ranks[r]->impl_ = std::move(impls[r]);
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Usable() {
  if (impl_ == nullptr || impl_->comm == nullptr) {
    return absl::AbortedError("nccl: the communicator was aborted (or could not be rebuilt)");
  }
  if (impl_->abort_flag->load(std::memory_order_acquire)) {  // a peer failed: launch nothing more
    ncclCommAbort(impl_->comm);
    impl_->comm = nullptr;
    return absl::AbortedError("nccl: the group was aborted (a peer failed)");
  }
  return absl::OkStatus();
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int size)
    : impl_(std::move(impl)), rank_(rank), size_(size) {}

NcclCommunicator::~NcclCommunicator() = default;

absl::Status NcclCommunicator::Wait() {
  for (;;) {
    const cudaError_t e = cudaStreamQuery(impl_->stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) CUDA_RETURN_IF_ERROR(e);
    ncclResult_t async = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(impl_->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) NCCL_RETURN_IF_ERROR(async);
    RETURN_IF_ERROR(Usable());  // a peer failed: abort, which stops kernels waiting for it
    std::this_thread::yield();
  }
}

absl::Status NcclCommunicator::Finish(double seconds_before, int64_t sent, int64_t received) {
  ++stats_.calls;
  stats_.bytes_sent += sent;
  stats_.bytes_received += received;
  stats_.seconds += seconds_before;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllToAll(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                        const std::vector<int64_t>& recv_counts, Counts /*counts*/) {
  // NCCL has no cheap way to check counts across ranks: they are always the caller's word.
  RETURN_IF_ERROR(Usable());
  if (static_cast<int>(send_counts.size()) != size_ || static_cast<int>(recv_counts.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: counts must have ", size_, " entries"));
  }
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  int64_t send_off = 0, recv_off = 0, sent = 0, received = 0;
  FirstError first;
  first.Note(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < size_; ++p) {
    if (send_counts[p] > 0) {
      first.Note(ncclSend(static_cast<const char*>(send) + send_off, send_counts[p], ncclInt8, p, impl_->comm,
                          impl_->stream),
                 "ncclSend");
    }
    if (recv_counts[p] > 0) {
      first.Note(ncclRecv(static_cast<char*>(recv) + recv_off, recv_counts[p], ncclInt8, p, impl_->comm,
                          impl_->stream),
                 "ncclRecv");
    }
    send_off += send_counts[p];
    recv_off += recv_counts[p];
    if (p != rank_) {
      sent += send_counts[p];
      received += recv_counts[p];
    }
  }
  first.Note(ncclGroupEnd(), "ncclGroupEnd");
  RETURN_IF_ERROR(first.status);
  RETURN_IF_ERROR(Wait());
  return Finish(sw.Seconds(), sent, received);
}

absl::Status NcclCommunicator::AllToAllCounts(const std::vector<int64_t>& send_counts,
                                              std::vector<int64_t>* recv_counts) {
  RETURN_IF_ERROR(Usable());
  const size_t n = static_cast<size_t>(size_), total = send_counts.size();
  if (total == 0 || total % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-to-all counts: ", total, " entries, not a multiple of ", size_));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  if (total > impl_->counts_capacity) {  // m counts per peer: the scratch grows (never shrinks)
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
    cudaFree(impl_->counts_send);
    cudaFree(impl_->counts_recv);
    impl_->counts_send = impl_->counts_recv = nullptr;
    impl_->counts_capacity = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&impl_->counts_send, sizeof(int64_t) * total));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&impl_->counts_recv, sizeof(int64_t) * total));
    impl_->counts_capacity = total;
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl_->counts_send, send_counts.data(), sizeof(int64_t) * total,
                                       cudaMemcpyHostToDevice, impl_->stream));
  const std::vector<int64_t> bytes(n, static_cast<int64_t>(sizeof(int64_t) * (total / n)));
  RETURN_IF_ERROR(AllToAll(impl_->counts_send, bytes, impl_->counts_recv, bytes, Counts::kAgreed));
  recv_counts->resize(total);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv_counts->data(), impl_->counts_recv, sizeof(int64_t) * total,
                                       cudaMemcpyDeviceToHost, impl_->stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* send, int64_t bytes, void* recv) {
  RETURN_IF_ERROR(Usable());
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, bytes, ncclInt8, impl_->comm, impl_->stream));
  RETURN_IF_ERROR(Wait());
  return Finish(sw.Seconds(), bytes * (size_ - 1), bytes * (size_ - 1));
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t count) {
  RETURN_IF_ERROR(Usable());
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, count, ncclFloat, ncclSum, impl_->comm, impl_->stream));
  RETURN_IF_ERROR(Wait());
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  return Finish(sw.Seconds(), bytes * (size_ - 1), bytes * (size_ - 1));
}

absl::Status NcclCommunicator::Send(const void* data, int64_t bytes, int peer) {
  RETURN_IF_ERROR(Usable());
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("nccl send: peer ", peer, " is not another rank of ", size_));
  }
  if (bytes == 0) return Finish(0, 0, 0);  // both sides skip an empty hand-off
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  NCCL_RETURN_IF_ERROR(ncclSend(data, bytes, ncclInt8, peer, impl_->comm, impl_->stream));
  RETURN_IF_ERROR(Wait());
  return Finish(sw.Seconds(), bytes, 0);
}

absl::Status NcclCommunicator::Recv(void* data, int64_t bytes, int peer) {
  RETURN_IF_ERROR(Usable());
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("nccl recv: peer ", peer, " is not another rank of ", size_));
  }
  if (bytes == 0) return Finish(0, 0, 0);
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  NCCL_RETURN_IF_ERROR(ncclRecv(data, bytes, ncclInt8, peer, impl_->comm, impl_->stream));
  RETURN_IF_ERROR(Wait());
  return Finish(sw.Seconds(), 0, bytes);
}

void NcclCommunicator::Abort() {
  if (impl_ == nullptr) return;  // never built, or its rebuild failed
  impl_->abort_flag->store(true, std::memory_order_release);
  if (impl_->comm != nullptr) {
    ncclCommAbort(impl_->comm);
    impl_->comm = nullptr;
  }
}

absl::Status NcclCommunicator::Barrier() {
  RETURN_IF_ERROR(Usable());
  Stopwatch sw;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  NCCL_RETURN_IF_ERROR(ncclAllReduce(impl_->counts_send, impl_->counts_recv, 1, ncclInt64, ncclSum, impl_->comm,
                                     impl_->stream));
  RETURN_IF_ERROR(Wait());
  return Finish(sw.Seconds(), 0, 0);
}

}  // namespace moeserve
