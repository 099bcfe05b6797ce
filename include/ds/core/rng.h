#pragma once
// Counter-based random numbers: every value is a pure function of (seed, stream, index), never of
// the rank or thread that computes it, so results do not depend on how the work is split.
#include <cstdint>

namespace ds::rng {

// 64-bit mix of (seed, stream, index) -> uniformly distributed bits (splitmix64-style finaliser
// applied twice; passes the usual avalanche tests and is cheap enough for dropout masks).
inline uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(seed * 0x9e3779b97f4a7c15ULL + stream) ^ (index * 0xd6e8feb86659fd93ULL + 1));
}

inline float uniform01(uint64_t bits) {  // [0, 1) from the top 24 bits
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller over two counter draws.
float normal(uint64_t seed, uint64_t stream, uint64_t index);

// The process-wide stream used by dropout. `offset` advances by the number of values each
// dropout call consumes; activation checkpointing saves and restores it. `sample_base` is the global
// index of the first sample in this rank's batch, so rank r of N draws the same mask for a sample
// as a single process would.
struct DropoutState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint64_t sample_base = 0;
};
DropoutState& dropout_state();

}  // namespace ds::rng
