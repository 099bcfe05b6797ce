#pragma once
// What core needs from a device, registered by whoever provides the device, so that core depends
// on nothing above it: memory for owned storage, and the copy and fill behind Tensor's factories,
// conversions and copy_from.
//
// The CPU is core's own device, registered here from the start (host memory from cpu_allocator(),
// host_copy/host_fill). A GPU backend registers its device when it initialises (backend::cuda(i)
// in a CUDA build); asking for an unregistered device is an error that says so.
//
// Threading: register before creating tensors on the device (registration is not synchronised with
// lookups); lookups are read-only and safe from any thread.
#include "ds/core/allocator.h"
#include "ds/core/device.h"

namespace ds {

class Tensor;

struct DeviceOps {
  Allocator* allocator = nullptr;  // owned Storage on the device comes from here
  // dst = src elementwise (equal shapes with any strides, or a contiguous dst; converts dtype).
  void (*copy)(const Tensor& src, const Tensor& dst) = nullptr;
  // Every element of a contiguous dst = value.
  void (*fill)(const Tensor& dst, double value) = nullptr;
};

// Replaces the entry of every device of `type`.
void register_device(DeviceType type, const DeviceOps& ops);
// The entry for device's type; throws "[device] no backend registered for cuda:0 ..." when none.
const DeviceOps& device_ops(Device device);

}  // namespace ds
