// CpuBackend's arena accounting, allocations and copies (the ops' dispatch: cpu_backend.cc).
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"

namespace moeserve {
namespace {

constexpr size_t kAlignment = 64;
// Buffers of 2 MiB or more (the KV arena, weight matrices) start on a 2 MiB boundary, and their
// whole 2 MiB pages are offered to the kernel as transparent huge pages (its madvise mode, the
// common default): decode attention then reads a DRAM-resident cache's scattered 8 KiB block rows
// with far fewer TLB misses (kernels_bench 1.11-1.24x on the Zen 5; the weights' streams gained
// nothing measurable, nor lost). A buffer's tail past its last whole 2 MiB keeps 4 KiB pages, so
// no memory goes to rounding. The advice changes no result; where refused, pages stay 4 KiB.
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  const size_t align = rounded >= kHugePage ? kHugePage : kAlignment;
  size_t used = used_.load();
  do {
    if (used + rounded > options_.capacity_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cpu device arena: cannot allocate %d bytes, %d of %d bytes in use", bytes, used,
          options_.capacity_bytes));
    }
  } while (!used_.compare_exchange_weak(used, used + rounded));
  void* p = nullptr;  // posix_memalign: the size need not be a multiple of the alignment
  if (posix_memalign(&p, align, rounded) != 0) {
    used_ -= rounded;
    return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " bytes failed"));
  }
  if (align == kHugePage) madvise(p, rounded / kHugePage * kHugePage, MADV_HUGEPAGE);  // a refusal changes nothing
  return DeviceBuffer(this, p, rounded);
}

void CpuBackend::Free(void* data, size_t bytes) {
  std::free(data);
  used_ -= bytes;
}

absl::Status CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  RunOrderedCopies();
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  ++copies_to_host_;
  RunOrderedCopies();
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  RunOrderedCopies();
  if (bytes) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::Synchronize() {
  RunOrderedCopies();
  return absl::OkStatus();
}

absl::StatusOr<HostBuffer> CpuBackend::AllocateHost(size_t bytes) {
  HostBuffer b = HostBuffer::Plain(bytes);
  if (b.empty()) return absl::ResourceExhaustedError(absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
  return b;
}

absl::StatusOr<uint64_t> CpuBackend::CopyAsync(void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(copy_mu_);
  const uint64_t ticket = ++copies_issued_;
  if (!options_.defer_copies) {
    if (bytes) std::memcpy(dst, src, bytes);  // compute is synchronous here: nothing to order
  } else {
    copies_.push_back({ticket, dst, src, bytes});
  }
  return ticket;
}

void CpuBackend::RunCopies(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(copy_mu_);
  while (!copies_.empty() && copies_.front().ticket <= ticket) {
    const QueuedCopy c = copies_.front();
    copies_.pop_front();
    if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
  }
}

void CpuBackend::RunOrderedCopies() {
  if (!options_.defer_copies) return;
  uint64_t ordered;
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    ordered = copies_ordered_;
  }
  RunCopies(ordered);
}

absl::Status CpuBackend::WaitCopy(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    if (ticket > copies_issued_) {
      return absl::InvalidArgumentError(absl::StrCat("wait for copy ", ticket, ": only ", copies_issued_, " issued"));
    }
  }
  RunCopies(ticket);
  return absl::OkStatus();
}

void CpuBackend::OrderComputeAfterCopies() {
  std::lock_guard<std::mutex> lock(copy_mu_);
  copies_ordered_ = copies_issued_;
}

}  // namespace moeserve
