#pragma once
#include <cstdint>
#include <string>

namespace ds {

// sim: a device emulator for tests (src/backend/sim): GPU-like memory the host cannot dereference,
// computed by the CPU's kernels. Not a performance device.
enum class DeviceType : uint8_t { cpu, cuda, sim };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const {
    switch (type) {
      case DeviceType::cpu:
        return "cpu";
      case DeviceType::cuda:
        return "cuda:" + std::to_string(index);
      case DeviceType::sim:
        return "sim:" + std::to_string(index);
    }
    return "unknown:" + std::to_string(index);
  }
};

inline constexpr Device kCPU{DeviceType::cpu, 0};

}  // namespace ds
