#pragma once
// DataLoader: a TokenDataset read through a DistributedSampler, one (B, T) micro-batch at a time.
//
//   auto train = std::make_shared<ds::data::TokenDataset>(
//       ds::data::TokenDataset::open_split("data/sotu", "train"));
//   ds::data::DataLoader loader(train, /*seq_len=*/T, {.micro_batch = B, .grad_accum = A,
//                               .world_size = N, .rank = r, .seed = 1234});
//   std::vector<int32_t> x(B * T), y(B * T);
//   loader.next(x, y);              // row b is sample sampler-index[b]: x = tokens, y = x shifted
//   nlohmann::json pos = loader.state();   // store in the checkpoint; load_state(pos) on resume
//
// SamplerOptions::num_samples is filled in from the dataset (leave it 0). See sampler.h for the
// order of samples across ranks, micro-steps and epochs. Not thread-safe; one loader per rank.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ds/data/dataset.h"
#include "ds/data/sampler.h"

namespace ds::data {

struct Batch {
  size_t B = 0, T = 0;
  std::vector<int32_t> inputs;   // (B, T) row-major
  std::vector<int32_t> targets;  // (B, T)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenDataset> dataset, size_t seq_len, SamplerOptions options);

  // This rank's next micro-batch into caller buffers of B*T ints each.
  void next(std::span<int32_t> inputs, std::span<int32_t> targets);
  Batch next();

  size_t batch_size() const { return static_cast<size_t>(sampler_.options().micro_batch); }
  size_t seq_len() const { return seq_len_; }
  const TokenDataset& dataset() const { return *dataset_; }
  DistributedSampler& sampler() { return sampler_; }
  const DistributedSampler& sampler() const { return sampler_; }

  // Data position, for checkpoints (see DistributedSampler::state).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  static SamplerOptions with_size(SamplerOptions o, const TokenDataset* d, size_t seq_len);

  std::shared_ptr<const TokenDataset> dataset_;
  size_t seq_len_;
  DistributedSampler sampler_;
  std::vector<uint64_t> idx_;
};

}  // namespace ds::data
