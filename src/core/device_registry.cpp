// The device registry (device_registry.h), with the CPU registered from the start.
#include "ds/core/device_registry.h"

#include <array>

#include "ds/core/error.h"
#include "ds/core/host_memory.h"

namespace ds {
namespace {

std::array<DeviceOps, 2>& registry() {
  static std::array<DeviceOps, 2> r = [] {
    std::array<DeviceOps, 2> init{};
    init[static_cast<size_t>(DeviceType::cpu)] =
        DeviceOps{&cpu_allocator(), &host_copy, &host_fill};
    return init;
  }();
  return r;
}

}  // namespace

void register_device(DeviceType type, const DeviceOps& ops) {
  DS_CHECK(ops.allocator && ops.copy && ops.fill,
           "[device] register_device needs an allocator, copy and fill");
  registry()[static_cast<size_t>(type)] = ops;
}

const DeviceOps& device_ops(Device device) {
  const DeviceOps& ops = registry()[static_cast<size_t>(device.type)];
  DS_CHECK(ops.allocator != nullptr,
           "[device] no backend registered for {}: this build has no backend for it (a CUDA "
           "device needs a build with -DDS_WITH_CUDA=ON and backend::cuda({}) before use)",
           device.str(), device.index);
  return ops;
}

}  // namespace ds
