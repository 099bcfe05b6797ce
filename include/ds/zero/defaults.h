#pragma once
// DeepSpeed's defaults for the zero_optimization keys that reach the ZeRO layer (DeepSpeed 0.19's
// DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig and DeepSpeedZeroOffloadParamConfig),
// written once: zero::Options and the offload options (zero/strategy.h, zero/state_store.h) start
// from them, and so do the config layer's ZeroConfig and the parser's defaults (config/config.h),
// which sits above this layer. Sizes are in elements.
#include <cstdint>

namespace ds::zero::defaults {

inline constexpr int64_t kReduceBucketSize = 500'000'000;
inline constexpr int64_t kAllgatherBucketSize = 500'000'000;
inline constexpr int64_t kSubGroupSize = 1'000'000'000;
// Stage 3.
inline constexpr int64_t kPrefetchBucketSize = 50'000'000;
inline constexpr int64_t kParamPersistenceThreshold = 100'000;
inline constexpr int64_t kMaxLiveParameters = 1'000'000'000;
inline constexpr int64_t kMaxReuseDistance = 1'000'000'000;
// offload_optimizer (device "nvme").
inline constexpr int64_t kOptimizerBufferCount = 4;
// offload_param (device "nvme", stage 3).
inline constexpr int64_t kParamBufferCount = 5;
inline constexpr int64_t kParamBufferSize = 100'000'000;
inline constexpr int64_t kParamMaxInCpu = 1'000'000'000;

}  // namespace ds::zero::defaults
