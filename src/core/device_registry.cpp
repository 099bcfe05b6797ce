// The device registry (device_registry.h), with the CPU registered from the start.
#include "ds/core/device_registry.h"

#include <array>

#include "ds/core/error.h"
#include "ds/core/host_memory.h"

namespace ds {
namespace {

// One entry per DeviceType (cpu, cuda, sim).
constexpr size_t kDeviceTypes = static_cast<size_t>(DeviceType::sim) + 1;

std::array<DeviceOps, kDeviceTypes>& registry() {
  static std::array<DeviceOps, kDeviceTypes> r = [] {
    std::array<DeviceOps, kDeviceTypes> init{};
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
           "[device] no backend registered for {}: a device's backend registers it when it "
           "initialises: call backend::get({}) (backend::cuda / backend::sim) before creating "
           "tensors there (CUDA also needs a build with -DDS_WITH_CUDA=ON)",
           device.str(), device.str());
  return ops;
}

}  // namespace ds
