#include "ds/data/loader.h"

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::data {

SamplerOptions DataLoader::with_size(SamplerOptions o, const TokenDataset* d, size_t seq_len) {
  DS_CHECK(d != nullptr, "[loader] dataset is null");
  const uint64_t n = d->num_samples(seq_len);
  DS_CHECK(o.num_samples == 0 || o.num_samples == n,
           "[loader] SamplerOptions::num_samples is {} but the dataset has {} samples of length "
           "{}; leave it 0 to take the dataset's",
           o.num_samples, n, seq_len);
  o.num_samples = n;
  return o;
}

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> dataset, size_t seq_len,
                       SamplerOptions options)
    : dataset_(std::move(dataset)),
      seq_len_(seq_len),
      sampler_(with_size(options, dataset_.get(), seq_len)),
      idx_(static_cast<size_t>(options.micro_batch)) {}

void DataLoader::next(std::span<int32_t> inputs, std::span<int32_t> targets) {
  const size_t b = batch_size(), t = seq_len_;
  DS_CHECK(inputs.size() == b * t && targets.size() == b * t,
           "[loader] buffers hold {} and {} tokens, expected B*T = {}*{} = {}", inputs.size(),
           targets.size(), b, t, b * t);
  sampler_.next(idx_);
  for (size_t row = 0; row < b; ++row)
    dataset_->get(idx_[row], t, inputs.subspan(row * t, t), targets.subspan(row * t, t));
}

Batch DataLoader::next() {
  Batch batch{batch_size(), seq_len_, std::vector<int32_t>(batch_size() * seq_len_),
              std::vector<int32_t>(batch_size() * seq_len_)};
  next(batch.inputs, batch.targets);
  return batch;
}

nlohmann::json DataLoader::state() const {
  nlohmann::json s = sampler_.state();
  s["seq_len"] = seq_len_;
  return s;
}

void DataLoader::load_state(const nlohmann::json& state) {
  if (state.contains("seq_len")) {
    const auto saved = state["seq_len"].get<size_t>();
    DS_CHECK(saved == seq_len_,
             "[loader] cannot resume: the saved data position is for seq_len {} but this run uses "
             "{}; samples would differ",
             saved, seq_len_);
  }
  sampler_.load_state(state);
}

}  // namespace ds::data
