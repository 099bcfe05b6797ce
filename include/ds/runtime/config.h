#pragma once
// The DeepSpeed config is its own layer (include/ds/config/config.h, namespace ds::config, sources
// in src/config/). The runtime reads it; its types stay reachable as ds::runtime::DeepSpeedConfig
// etc. for the runtime's own code and existing callers. Each name is brought in on its own (no
// `using namespace` in a header: it would leak into every includer).
#include "ds/config/config.h"

namespace ds::runtime {
using config::ActivationCheckpointingConfig;
using config::AioConfig;
using config::BatchConfig;
using config::BF16Config;
using config::CheckpointConfig;
using config::CometConfig;
using config::CommsLoggerConfig;
using config::ConfigContext;
using config::ConfigValue;
using config::DataTypesConfig;
using config::DeepSpeedConfig;
using config::edit_distance;
using config::FileMonitorConfig;
using config::FlopsProfilerConfig;
using config::format_effective_config;
using config::FP16Config;
using config::load_config_json;
using config::LRRangeTestParams;
using config::OffloadDevice;
using config::offload_device_name;
using config::OffloadOptimizerConfig;
using config::OffloadParamConfig;
using config::OneCycleParams;
using config::OptimizerConfig;
using config::OptimizerType;
using config::optimizer_type_name;
using config::Origin;
using config::origin_name;
using config::parse_config;
using config::parse_config_json;
using config::PipelineConfig;
using config::print_config_warnings;
using config::SchedulerConfig;
using config::SchedulerType;
using config::strip_trailing_commas;
using config::scheduler_type_name;
using config::TagValidation;
using config::TensorParallelConfig;
using config::TrainerArgs;
using config::WandbConfig;
using config::WarmupCosineLRParams;
using config::WarmupDecayLRParams;
using config::WarmupLRParams;
using config::WarmupType;
using config::ZeroConfig;
}  // namespace ds::runtime
