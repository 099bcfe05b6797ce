#include "ds/backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"

namespace ds::backend {

Backend& cpu() {
  static CpuBackend b;
  return b;
}

Backend& get(Device device) {
  if (device.type == DeviceType::cpu) return cpu();
  return cuda(device.index);
}

}  // namespace ds::backend
