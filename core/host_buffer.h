// Host memory with its own release function: plain 64-byte-aligned memory, or pinned
// (page-locked) memory that a GPU's copy engine reads and writes asynchronously at the host
// link's full speed (Backend::AllocateHost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace moeserve {

class HostBuffer {
 public:
  using Release = void (*)(void*);

  HostBuffer() = default;
  HostBuffer(void* data, size_t bytes, Release release, bool pinned)
      : data_(data), bytes_(bytes), release_(release), pinned_(pinned) {}
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      release_ = std::exchange(o.release_, nullptr);
      pinned_ = std::exchange(o.pinned_, false);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { Reset(); }

  // 64-byte-aligned ordinary memory, not cleared (for a buffer written whole before it is
  // read); empty (data() null) if the allocation failed.
  static HostBuffer Uninitialized(size_t bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded > 0 ? rounded : 64);
    if (p == nullptr) return HostBuffer();
    return HostBuffer(p, bytes, [](void* q) { std::free(q); }, false);
  }
  // The same, zeroed.
  static HostBuffer Plain(size_t bytes) {
    HostBuffer b = Uninitialized(bytes);
    if (!b.empty()) std::memset(b.data(), 0, (bytes + 63) / 64 * 64);
    return b;
  }

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void Reset() {
    if (data_ != nullptr && release_ != nullptr) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Release release_ = nullptr;
  bool pinned_ = false;
};

}  // namespace moeserve
