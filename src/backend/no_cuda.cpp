// Built when DS_WITH_CUDA is OFF: the CUDA backend exists as a name that explains itself.
#include "ds/backend/backend.h"
#include "ds/core/error.h"

namespace ds::backend {

Backend& cuda(int index) {
  DS_THROW("[cuda] deepspeed.cpp was built without CUDA (device cuda:{} requested); rebuild with "
           "-DDS_WITH_CUDA=ON on a machine with the CUDA toolkit",
           index);
}

int cuda_device_count() { return 0; }

}  // namespace ds::backend
