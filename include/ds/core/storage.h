#pragma once
// Storage: a block of bytes on a device. Three kinds:
//   owned  - allocated from the device's caching allocator;
//   view   - a byte range of another storage (a parameter inside a flat buffer);
//   external - memory someone else owns (an mmap'd file, a pinned buffer), with a deleter.
// Owned storage can be released (memory returned, size kept) and materialised again: ZeRO-3 keeps
// only a shard of each parameter and gathers the full tensor just before use. Reaching the data of a
// released storage throws instead of reading freed memory.
#include <cstddef>
#include <functional>
#include <memory>

#include "ds/core/device.h"

namespace ds {

class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = kCPU);
  static std::shared_ptr<Storage> view(std::shared_ptr<Storage> base, size_t byte_offset,
                                       size_t nbytes);
  static std::shared_ptr<Storage> external(void* data, size_t nbytes, Device device,
                                           std::function<void(void*)> deleter = {});
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const;  // throws when released
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool is_materialized() const;
  bool is_view() const { return base_ != nullptr; }
  const std::shared_ptr<Storage>& base() const { return base_; }
  size_t base_offset() const { return offset_; }

  void release();      // owned storage only: give the memory back to the allocator
  void materialize();  // owned storage only: allocate again (contents undefined)

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_ = kCPU;
  std::shared_ptr<Storage> base_;  // set for views
  size_t offset_ = 0;              // byte offset into base_
  std::function<void(void*)> deleter_;  // set for external storage
  bool owned_ = false;
};

}  // namespace ds
