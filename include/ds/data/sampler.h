#pragma once
// Distributed sampler: which sample indices each rank reads at each micro-step.
//
// Shapes: B = micro_batch (samples per rank per micro-step), A = grad_accum (micro-steps per
// optimizer step), N = world_size, G = B * A * N (the global batch of one optimizer step).
//
// Each epoch e has an order: a permutation of [0, S) that depends only on (seed, e) -- never on
// the rank or N -- made by Fisher-Yates over a SplitMix64 stream (portable: no std::
// distributions), or the identity when shuffle is off. Optimizer step s of the epoch consumes
// positions [s*G, s*G + G) of that order; within it, micro-step m takes the contiguous chunk
// [s*G + m*B*N, s*G + (m+1)*B*N) and rank r the B positions starting at s*G + m*B*N + r*B.
// Consequences:
//   - ranks read disjoint samples, and together the ranks cover each global batch exactly;
//   - the set of samples in an optimizer step depends only on G, so changing N while keeping G
//     (e.g. 2 ranks x 4 accumulation steps -> 4 ranks x 2) trains on the same global batches.
//
// Epoch length:
//   drop_last = true  (default): floor(S / G) steps; the last S mod G samples of the order are
//                      skipped this epoch (a different set each epoch when shuffling).
//   drop_last = false: ceil(S / G) steps; the last global batch is completed with positions that
//                      wrap around to the start of the same epoch's order, so every rank runs the
//                      same number of micro-steps (collectives stay matched) and some samples are
//                      seen twice in that epoch.
// After the last micro-step of an epoch, next() continues with epoch + 1.
//
// Resume: state() is {"epoch", "position", ...} where position counts the samples (global, all
// ranks) consumed in the epoch. load_state() restores it, so a resumed run reads exactly the
// samples it would have read without stopping. The seed, S, shuffle and drop_last must match; the
// world size may differ as long as G is the same and the position is on a micro-step boundary of
// the new layout (always true at optimizer-step boundaries).
#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds::data {

struct SamplerOptions {
  uint64_t num_samples = 0;  // S
  int micro_batch = 1;       // B
  int grad_accum = 1;        // A
  int world_size = 1;        // N
  int rank = 0;              // r in [0, N)
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = true;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(const SamplerOptions& options);

  // This rank's B sample indices for its next micro-step; then advances (across epochs).
  void next(std::span<uint64_t> out);
  std::vector<uint64_t> next();

  // The B indices rank `rank` reads at (epoch, step, micro_step), without moving the position.
  void indices(uint64_t epoch, uint64_t step, int micro_step, int rank,
               std::span<uint64_t> out) const;

  // The order of epoch e: a permutation of [0, S) (the identity without shuffle).
  std::vector<uint64_t> order(uint64_t epoch) const;

  uint64_t global_batch() const { return global_batch_; }        // G
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }  // optimizer steps
  uint64_t micro_steps_per_epoch() const { return steps_per_epoch_ * opt_.grad_accum; }

  // Position: epoch, optimizer step within it, micro-step within that step (of the next next()).
  uint64_t epoch() const { return epoch_; }
  uint64_t step() const { return micro_index_ / opt_.grad_accum; }
  int micro_step() const { return static_cast<int>(micro_index_ % opt_.grad_accum); }
  // Jump to the start of epoch e.
  void set_epoch(uint64_t epoch);

  // Global position, counted in samples since the start of epoch 0, of the first sample this
  // rank reads at its next micro-step: epoch * (steps_per_epoch * G) + its position in the epoch.
  // It does not depend on how G is split over ranks, so per-sample randomness keyed by it (e.g.
  // dropout) is the same for any world size.
  uint64_t next_sample_position() const;

  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

  const SamplerOptions& options() const { return opt_; }

 private:
  const std::vector<uint64_t>& cached_order(uint64_t epoch) const;

  SamplerOptions opt_;
  uint64_t global_batch_ = 0;
  uint64_t steps_per_epoch_ = 0;
  uint64_t epoch_ = 0;
  uint64_t micro_index_ = 0;  // micro-steps done in this epoch
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<uint64_t> cached_order_;
};

}  // namespace ds::data
