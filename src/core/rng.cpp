#include "ds/core/rng.h"

#include <cmath>

namespace ds::rng {

float normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two independent uniforms from the pair (2i, 2i+1); u1 in (0, 1] so log() is finite.
  const double u1 = (static_cast<double>(hash3(seed, stream, 2 * index) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(hash3(seed, stream, 2 * index + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

DropoutState& dropout_state() {
  static DropoutState s;
  return s;
}

}  // namespace ds::rng
