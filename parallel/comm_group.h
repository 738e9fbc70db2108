// The communicators of one group of ranks (an EP group of a pipeline stage, or the stages of one
// EP index), whatever carries them, and how the group becomes usable again after a failed step.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace moeserve {

class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
  virtual Communicator* rank(int r) = 0;
  // Once every rank has returned from a step that some rank aborted: clears the group (local)
  // or rebuilds it (NCCL, whose aborted communicators cannot be reused).
  virtual absl::Status Reset() = 0;
};

// In-process ranks that exchange host memory (the CPU backend's device memory).
std::unique_ptr<CommGroup> MakeLocalGroup(int size);

// NCCL ranks in this process, rank r on GPU devices[r] (ncclCommInitAll). Buffers are device
// memory. UNIMPLEMENTED in a build without CUDA.
absl::StatusOr<std::unique_ptr<CommGroup>> MakeNcclGroup(const std::vector<int>& devices);

}  // namespace moeserve
