#include "ds/data/sampler.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::data {

namespace {

constexpr int kStateVersion = 1;

// SplitMix64: a tiny counter-based generator with full 64-bit output; fixed by its definition, so
// an epoch's order is the same on every machine, compiler and standard library.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform integer in [0, bound) without modulo bias (Lemire's multiply-and-reject).
inline uint64_t bounded(uint64_t& state, uint64_t bound) {
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64(state)) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64(state)) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& options) : opt_(options) {
  DS_CHECK(opt_.micro_batch > 0 && opt_.grad_accum > 0 && opt_.world_size > 0,
           "[sampler] micro_batch ({}), grad_accum ({}) and world_size ({}) must be positive",
           opt_.micro_batch, opt_.grad_accum, opt_.world_size);
  DS_CHECK(opt_.rank >= 0 && opt_.rank < opt_.world_size,
           "[sampler] rank {} is outside [0, world_size={})", opt_.rank, opt_.world_size);
  global_batch_ = static_cast<uint64_t>(opt_.micro_batch) * opt_.grad_accum * opt_.world_size;
  const uint64_t s = opt_.num_samples;
  steps_per_epoch_ = opt_.drop_last ? s / global_batch_ : (s + global_batch_ - 1) / global_batch_;
  DS_CHECK(steps_per_epoch_ > 0,
           "[sampler] the dataset has {} samples, fewer than one global batch of {} (micro_batch "
           "{} x grad_accum {} x world_size {}){}; use a smaller batch or a longer dataset",
           s, global_batch_, opt_.micro_batch, opt_.grad_accum, opt_.world_size,
           s > 0 ? ", and drop_last drops it" : "");
}

std::vector<uint64_t> DistributedSampler::order(uint64_t epoch) const {
  std::vector<uint64_t> perm(opt_.num_samples);
  std::iota(perm.begin(), perm.end(), uint64_t{0});
  if (!opt_.shuffle) return perm;
  // Stream key from (seed, epoch) through a SplitMix step each, so nearby seeds and epochs give
  // unrelated streams.
  uint64_t k = opt_.seed;
  uint64_t state = splitmix64(k) ^ epoch;
  state = splitmix64(state);
  for (uint64_t i = perm.size(); i > 1; --i) {
    const uint64_t j = bounded(state, i);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

const std::vector<uint64_t>& DistributedSampler::cached_order(uint64_t epoch) const {
  if (cached_epoch_ != epoch) {
    cached_order_ = order(epoch);
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

void DistributedSampler::indices(uint64_t epoch, uint64_t step, int micro_step, int rank,
                                 std::span<uint64_t> out) const {
  DS_CHECK(step < steps_per_epoch_ && micro_step >= 0 && micro_step < opt_.grad_accum &&
               rank >= 0 && rank < opt_.world_size,
           "[sampler] (step {}, micro_step {}, rank {}) is outside an epoch of {} steps x {} "
           "micro-steps x {} ranks",
           step, micro_step, rank, steps_per_epoch_, opt_.grad_accum, opt_.world_size);
  DS_CHECK(out.size() == static_cast<size_t>(opt_.micro_batch),
           "[sampler] output holds {} indices, expected micro_batch = {}", out.size(),
           opt_.micro_batch);
  const auto& perm = cached_order(epoch);
  const uint64_t b = opt_.micro_batch;
  const uint64_t first = step * global_batch_ + micro_step * b * opt_.world_size + rank * b;
  // Positions past S only occur without drop_last: they wrap to the start of the order.
  for (uint64_t k = 0; k < b; ++k) out[k] = perm[(first + k) % opt_.num_samples];
}

void DistributedSampler::next(std::span<uint64_t> out) {
  const uint64_t a = opt_.grad_accum;
  indices(epoch_, micro_index_ / a, static_cast<int>(micro_index_ % a), opt_.rank, out);
  if (++micro_index_ == micro_steps_per_epoch()) {
    ++epoch_;
    micro_index_ = 0;
  }
}

std::vector<uint64_t> DistributedSampler::next() {
  std::vector<uint64_t> out(opt_.micro_batch);
  next(out);
  return out;
}

uint64_t DistributedSampler::next_sample_position() const {
  const uint64_t b = opt_.micro_batch, a = opt_.grad_accum;
  const uint64_t in_epoch =
      (micro_index_ / a) * global_batch_ + (micro_index_ % a) * b * opt_.world_size + opt_.rank * b;
  return epoch_ * steps_per_epoch_ * global_batch_ + in_epoch;
}

void DistributedSampler::set_epoch(uint64_t epoch) {
  epoch_ = epoch;
  micro_index_ = 0;
}

nlohmann::json DistributedSampler::state() const {
  const uint64_t per_micro = static_cast<uint64_t>(opt_.micro_batch) * opt_.world_size;
  return {{"version", kStateVersion},
          {"epoch", epoch_},
          {"position", micro_index_ * per_micro},
          {"seed", opt_.seed},
          {"num_samples", opt_.num_samples},
          {"global_batch", global_batch_},
          {"shuffle", opt_.shuffle},
          {"drop_last", opt_.drop_last}};
}

void DistributedSampler::load_state(const nlohmann::json& st) {
  try {
    DS_CHECK(st.at("version").get<int>() == kStateVersion,
             "[sampler] state version {} is not supported (expected {})", st.at("version").dump(),
             kStateVersion);
    auto same = [&](const char* key, const auto& mine) {
      using T = std::decay_t<decltype(mine)>;
      const T theirs = st.at(key).get<T>();
      DS_CHECK(theirs == mine,
               "[sampler] cannot resume: the saved state has {} = {} but this run has {}; resume "
               "with the same {} (or start a fresh epoch with set_epoch)",
               key, theirs, mine, key);
    };
    same("seed", opt_.seed);
    same("num_samples", opt_.num_samples);
    same("global_batch", global_batch_);
    same("shuffle", opt_.shuffle);
    same("drop_last", opt_.drop_last);
    const uint64_t epoch = st.at("epoch").get<uint64_t>();
    const uint64_t position = st.at("position").get<uint64_t>();
    const uint64_t per_micro = static_cast<uint64_t>(opt_.micro_batch) * opt_.world_size;
    DS_CHECK(position % per_micro == 0 && position / per_micro < micro_steps_per_epoch(),
             "[sampler] cannot resume at position {}: it is not a micro-step boundary of this "
             "layout (micro_batch {} x world_size {} = {} samples per micro-step, {} per epoch); "
             "resume from a checkpoint taken at an optimizer-step boundary",
             position, opt_.micro_batch, opt_.world_size, per_micro,
             micro_steps_per_epoch() * per_micro);
    epoch_ = epoch;
    micro_index_ = position / per_micro;
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[sampler] malformed sampler state {} ({}); it must come from state()", st.dump(),
             e.what());
  }
}

}  // namespace ds::data
