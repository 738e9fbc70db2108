// Communicator groups: local ranks always, NCCL ranks in CUDA builds.
#include "parallel/comm_group.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "parallel/local_communicator.h"
#if MOESERVE_HAVE_CUDA
#include "parallel/nccl_communicator.h"
#endif

namespace moeserve {
namespace {

class LocalCommGroup final : public CommGroup {
 public:
  explicit LocalCommGroup(int size) : comms_(MakeLocalComms(size)) {}
  int size() const override { return comms_.group->size(); }
  Communicator* rank(int r) override { return comms_.ranks[r].get(); }
  absl::Status Reset() override {
    comms_.group->Reset();
    return absl::OkStatus();
  }

 private:
  LocalComms comms_;
};

}  // namespace

std::unique_ptr<CommGroup> MakeLocalGroup(int size) { return std::make_unique<LocalCommGroup>(size); }

#if MOESERVE_HAVE_CUDA
namespace {

class NcclCommGroup final : public CommGroup {
 public:
  explicit NcclCommGroup(std::vector<int> devices) : devices_(std::move(devices)) {}
  int size() const override { return static_cast<int>(devices_.size()); }
  Communicator* rank(int r) override { return ranks_[r].get(); }
  absl::Status Reset() override {
    if (ranks_.empty()) {
      ASSIGN_OR_RETURN(ranks_, NcclCommunicator::CreateAll(devices_));
      return absl::OkStatus();
    }
    // In place: the executor's ranks and models hold pointers to these communicators.
    std::vector<NcclCommunicator*> ranks;
    for (auto& r : ranks_) ranks.push_back(r.get());
    return NcclCommunicator::ReinitAll(devices_, ranks);
  }

 private:
  std::vector<int> devices_;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CommGroup>> MakeNcclGroup(const std::vector<int>& devices) {
  auto group = std::make_unique<NcclCommGroup>(devices);
  RETURN_IF_ERROR(group->Reset());
  return std::unique_ptr<CommGroup>(std::move(group));
}
#else
absl::StatusOr<std::unique_ptr<CommGroup>> MakeNcclGroup(const std::vector<int>& devices) {
  return absl::UnimplementedError(
      absl::StrCat("NCCL ranks need a build with CUDA (nvcc and NCCL were not found); asked for ", devices.size(),
                   " GPUs"));
}
#endif

}  // namespace moeserve
