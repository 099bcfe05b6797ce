#include "ds/train/task_trainer.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/train/fit.h"
#include "ds/train/train_util.h"

namespace ds::train {

TaskTrainer::TaskTrainer(TrainerObserver& observer) : TrainerBase(observer) {}

TaskTrainer::~TaskTrainer() = default;

void TaskTrainer::start(std::shared_ptr<nn::Module> model, runtime::LossFn loss_fn) {
  const TaskPlan& p = task_plan();
  const Options& o = p.spec;
  if (const std::string limit = apply_device_memory_limit(p.device, o); !limit.empty()) say(limit);
  if (!o.skip_memory_check) {
    // Each rank measures its own node's memory: one that does not fit stops every rank, none is
    // left waiting in the engine's first collective.
    std::string error;
    try {
      check_memory(*model);
    } catch (const Error& e) {
      error = e.what();
    }
    comm::raise_if_any_failed(*comm::world(), error, "the start-up memory check");
  }
  move_to_device(*model);
  runtime::InitOptions init = engine_options();
  init.loss_fn = std::move(loss_fn);
  engine_ = runtime::initialize(std::move(model), p.config(), std::move(init));
  attach_engine(*engine_);
  data::SamplerOptions so = sampler_options();
  so.num_samples = static_cast<uint64_t>(p.train_examples);
  sampler_ = std::make_unique<data::DistributedSampler>(so);
  for (const std::string& l : describe_data()) say(l);
  if (!p.has_val()) say("eval data: none (no val split; give --eval_data to evaluate)");
  open_output();
}

void TaskTrainer::check_memory(const nn::Module& model) {
  const TaskPlan& p = task_plan();
  int64_t params = 0, frozen = 0;
  for (const auto& [name, t] : model.named_parameters()) params += t.numel();
  for (const auto& [name, t] : nn::frozen_parameters(model)) frozen += t.numel();
  std::string note;
  if (!p.device.is_cpu()) {
    const GpuFitPlan g = plan_fit_gpu(params, p.config(), activation_bytes(), 0, frozen,
                                      p.data_parallel);
    note = check_fit_gpu(g, static_cast<int64_t>(backend::get(p.device).available_memory()),
                         available_memory_bytes(), p.device.str(), p.config());
  } else {
    // The model is built already (imported, LoRA applied): what the check can still prevent is
    // the engine's states and the activations going past the memory.
    const FitPlan fit = plan_fit(params, p.config(), p.data_parallel, local_ranks(),
                                 activation_bytes(), /*partitioned_build=*/false, 0, frozen);
    note = check_fit(fit, available_memory_bytes(), params, p.config(), p.data_parallel,
                     p.spec.output_dir);
  }
  if (!note.empty()) say(note);
}

runtime::MicroBatch TaskTrainer::next_micro_batch() {
  const uint64_t position = sampler_->next_sample_position();
  return pack_train(sampler_->next(), position);
}

// ---- helpers ---------------------------------------------------------------------------------

std::vector<std::vector<uint64_t>> eval_batches(int64_t n, int64_t b) {
  std::vector<std::vector<uint64_t>> out;
  for (int64_t first = 0; first < n; first += b) {
    std::vector<uint64_t>& idx = out.emplace_back();
    for (int64_t i = first; i < std::min(n, first + b); ++i)
      idx.push_back(static_cast<uint64_t>(i));
  }
  return out;
}

void copy_weights(nn::Module& whole, const std::vector<std::pair<std::string, Tensor>>& weights) {
  std::map<std::string, Tensor> by_name(weights.begin(), weights.end());
  for (auto& [name, t] : whole.named_parameters()) {
    const auto it = by_name.find(name);
    DS_CHECK(it != by_name.end(), "[ds_train] the engine has no parameter '{}'", name);
    t.copy_from(it->second);
  }
}

}  // namespace ds::train
