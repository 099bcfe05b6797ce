#pragma once
#include <string>

namespace ds {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const { return type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

inline constexpr Device kCPU{DeviceType::cpu, 0};

}  // namespace ds
