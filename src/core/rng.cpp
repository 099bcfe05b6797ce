#include "ds/core/rng.h"

#include <cmath>

namespace ds::rng {

float normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two independent uniforms from one 64-bit draw (24 bits each); u1 in (0, 1] so log() is finite.
  // Single precision throughout: initialising a 1.5B-parameter model calls this 1.5e9 times.
  const uint64_t bits = hash3(seed, stream, index);
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * 0x1.0p-24f;
  const float u2 = static_cast<float>((bits >> 8) & 0xffffffu) * 0x1.0p-24f;
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
}

DropoutState& dropout_state() {
  static DropoutState s;
  return s;
}

}  // namespace ds::rng
