// DeviceBuffer ownership.
#include "kernels/backend.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/status.h"

namespace moeserve {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace moeserve

// The latent-attention ops of a backend that does not implement them: unreachable, since a
// model needing them is refused at load when HasLatentAttention() is false.
namespace moeserve {
namespace {
[[noreturn]] void NotImplemented(const Backend& b, const char* op) {
  std::fprintf(stderr, "%s does not implement %s (HasLatentAttention() is false)\n", b.Name().c_str(), op);
  std::abort();
}
}  // namespace

void Backend::RopeScaled(float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, const float*, float) {
  NotImplemented(*this, "RopeScaled");
}
void Backend::RouterGroupedTopK(const float*, int64_t, const GroupedRouting&, const float*, int32_t*, float*) {
  NotImplemented(*this, "RouterGroupedTopK");
}
void Backend::WriteLatentKv(const float*, const float*, const int64_t*, int64_t, int64_t, const KvLayout&, int64_t,
                            void*) {
  NotImplemented(*this, "WriteLatentKv");
}
void Backend::PagedLatentAttention(const float*, const float*, const AttentionBatch&, const KvLayout&, int64_t,
                                   const void*, int64_t, int64_t, float, float*) {
  NotImplemented(*this, "PagedLatentAttention");
}

}  // namespace moeserve
