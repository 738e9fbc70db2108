// DeviceBuffer ownership.
#include "kernels/backend.h"

#include <utility>

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
