#include "ds/core/storage.h"

#include "ds/core/device_registry.h"
#include "ds/core/error.h"

namespace ds {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owned_ = true;
  s->data_ = device_ops(device).allocator->allocate(nbytes);
  return s;
}

std::shared_ptr<Storage> Storage::view(std::shared_ptr<Storage> base, size_t byte_offset,
                                       size_t nbytes) {
  DS_CHECK(base, "[storage] view of a null storage");
  DS_CHECK(byte_offset + nbytes <= base->nbytes(),
           "[storage] view [{}, {}) outside a storage of {} bytes", byte_offset,
           byte_offset + nbytes, base->nbytes());
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_ = base->device();
  s->offset_ = byte_offset;
  s->base_ = std::move(base);
  return s;
}

std::shared_ptr<Storage> Storage::external(void* data, size_t nbytes, Device device,
                                           std::function<void(void*)> deleter) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->deleter_ = std::move(deleter);
  return s;
}

Storage::~Storage() {
  if (owned_ && data_) device_ops(device_).allocator->deallocate(data_, nbytes_);
  if (deleter_ && data_) deleter_(data_);
}

void* Storage::data() const {
  if (base_) return static_cast<char*>(base_->data()) + offset_;
  DS_CHECK(data_ != nullptr || nbytes_ == 0,
           "[storage] the data of a released storage ({} bytes) was accessed; under ZeRO-3 a "
           "parameter must be gathered before use",
           nbytes_);
  return data_;
}

bool Storage::is_materialized() const {
  if (base_) return base_->is_materialized();
  return data_ != nullptr || nbytes_ == 0;
}

void Storage::release() {
  DS_CHECK(owned_, "[storage] only storage allocated by the engine can be released");
  if (data_) device_ops(device_).allocator->deallocate(data_, nbytes_);
  data_ = nullptr;
}

void Storage::materialize() {
  DS_CHECK(owned_, "[storage] only storage allocated by the engine can be materialised");
  if (!data_) data_ = device_ops(device_).allocator->allocate(nbytes_);
}

}  // namespace ds
