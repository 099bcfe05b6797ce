#pragma once
// The DeepSpeed config is its own layer (include/ds/config/config.h, namespace ds::config, sources
// in src/config/). The runtime reads it; its types stay reachable as ds::runtime::DeepSpeedConfig
// etc. for the runtime's own code and existing callers.
#include "ds/config/config.h"

namespace ds::runtime {
using namespace ds::config;
}  // namespace ds::runtime
