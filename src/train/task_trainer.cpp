#include "ds/train/task_trainer.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/train/step_loop.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

TaskTrainer::TaskTrainer(TrainerObserver& observer)
    : observer_(observer), rank_(comm::world()->rank()) {}

TaskTrainer::~TaskTrainer() = default;

void TaskTrainer::start(std::shared_ptr<nn::Module> model, runtime::LossFn loss_fn) {
  const TaskPlan& p = task_plan();
  const Options& o = p.spec;
  out_dir_ = o.output_dir;
  if (!p.device.is_cpu()) {
    // As Trainer::build_model: the engine keeps the model where it is (parameters, activations
    // and gradients on the device; master weights and optimizer state in host memory).
    if (const std::string limit = apply_device_memory_limit(p.device, o); !limit.empty())
      say(limit);
    model->to(p.device);
    say(fmt::format("device: {} ({})", p.device.str(), backend::get(p.device).gemm_info()));
  }
  runtime::InitOptions init;
  init.ctx = p.run.ctx;
  init.log = [this](const std::string& s) { observer_.detail(s); };
  init.loss_fn = std::move(loss_fn);
  engine_ = runtime::initialize(std::move(model), p.config(), std::move(init));
  rng::dropout_state() = rng::DropoutState{o.seed, 0, 0};
  const auto mem = engine_->memory_budget();
  say(fmt::format(
      "memory, ZeRO stage {}, {} params: model states {} (parameters {}, gradients "
      "{}, master weights {}, optimizer states {})",
      p.config().zero_optimization.stage, dtype_name(engine_->training_dtype()), mib(mem.total()),
      mib(mem.params), mib(mem.grads), mib(mem.master_weights), mib(mem.optimizer_states)));

  sampler_ = std::make_unique<data::DistributedSampler>(
      data::SamplerOptions{.num_samples = static_cast<uint64_t>(p.train_examples),
                           .micro_batch = static_cast<int>(p.micro_batch()),
                           .grad_accum = static_cast<int>(p.grad_accum()),
                           .world_size = engine_->world_size(),
                           .rank = engine_->rank(),
                           .seed = o.seed,
                           .shuffle = !o.no_shuffle});
  for (const std::string& line : describe_data()) say(line);
  if (!p.has_val()) say("eval data: none (no val split; give --eval_data to evaluate)");
  fs::create_directories(out_dir_);
  if (is_lead()) {
    // Temporaries a killed run left (a checkpoint or export cut short): this run owns the folder.
    const auto stale = remove_stale_temporaries(out_dir_, export_folder(o));
    if (!stale.empty())
      say(fmt::format("removed {} temporaries left by an interrupted earlier run in {}",
                      stale.size(), out_dir_.string()));
  }
}

// ---- checkpoints -----------------------------------------------------------------------------

std::optional<ResumeReport> TaskTrainer::resume() {
  const TaskPlan& p = task_plan();
  const std::string& from = p.spec.resume_from_checkpoint;
  if (from.empty()) {
    // An earlier run's checkpoints in the folder: --save_total_limit never rotates them away.
    earlier_run_.clear();
    for (const auto& f : checkpoint_folders(out_dir_))
      earlier_run_.push_back(f.filename().string());
    if (!earlier_run_.empty())
      say(
          fmt::format("note: {} holds checkpoints of an earlier run ({}); this run starts afresh "
                      "(--resume_from_checkpoint latest would continue it) and never deletes them",
                      out_dir_.string(), fmt::join(earlier_run_, ", ")));
    return std::nullopt;
  }
  fs::path dir = from == "latest" ? out_dir_ : fs::path(from);
  std::string tag;
  DS_CHECK(from != "latest" || fs::exists(out_dir_ / "latest"),
           "[ds_train] --resume_from_checkpoint latest: {} has no 'latest' file; name a "
           "global_step folder",
           out_dir_.string());
  if (from != "latest" && !fs::exists(dir / "latest") && fs::is_directory(dir)) {
    tag = dir.filename().string();
    dir = dir.parent_path();
  }
  check_checkpoint_task(dir, tag, p.names.task, p.train_dir.string());  // before any tensor loads
  const json client = engine_->load_checkpoint(dir.string(), tag);
  DS_CHECK(client.contains("data") && client.contains("ds_train") &&
               client["ds_train"].value("task", std::string()) == p.names.task,
           "[ds_train] the checkpoint in {} is not a {} run's (written by ds_train on a {} set); "
           "cannot resume it here",
           dir.string(), p.names.run, p.names.task);
  check_checkpoint(client["ds_train"]);
  // As the LM trainer says it: a longer (or shorter) run re-plans the schedule from here.
  const int64_t planned = client["ds_train"].value("total_steps", p.total_steps());
  if (planned != p.total_steps())
    say(fmt::format("note: the checkpoint's run was planned for {} steps, this one for {}; the "
                    "learning-rate schedule follows the new length from here",
                    planned, p.total_steps()));
  sampler_->load_state(client["data"]);
  ResumeReport r{dir, tag.empty() ? latest_tag(dir) : tag, engine_->global_steps(),
                 engine_->global_samples()};
  say(fmt::format("resumed from {} (tag {}): step {}, {} samples seen", r.dir.string(), r.tag,
                  r.step, r.samples));
  last_saved_ = engine_->global_steps();  // that checkpoint exists already
  return r;
}

SaveReport TaskTrainer::save() {
  const auto t0 = std::chrono::steady_clock::now();
  const TaskPlan& p = task_plan();
  json identity = checkpoint_fields();
  identity["task"] = p.names.task;
  identity["total_steps"] = p.total_steps();
  identity["seed"] = p.spec.seed;
  identity["train_data"] = p.train_dir.string();
  const json client = {{"data", sampler_->state()}, {"ds_train", identity}};
  engine_->save_checkpoint(out_dir_.string(), "", client);
  last_saved_ = engine_->global_steps();
  std::erase(earlier_run_, fmt::format("global_step{}", last_saved_));  // this run's folder now
  SaveReport r;
  r.step = last_saved_;
  r.dir = out_dir_;
  if (is_lead()) r.deleted = rotate_checkpoints(out_dir_, p.spec.save_total_limit, earlier_run_);
  r.seconds = seconds_since(t0);
  observer_.on_save(r);
  return r;
}

// ---- the loop --------------------------------------------------------------------------------

void TaskTrainer::evaluate_now() {
  if (evaluated_at_ == engine_->global_steps()) return;
  evaluated_at_ = engine_->global_steps();
  report_evaluation();
}

int64_t TaskTrainer::eval_steps() const {
  const TaskPlan& p = task_plan();
  return p.spec.eval_steps >= 0 ? p.spec.eval_steps : std::max<int64_t>(1, p.total_steps() / 10);
}

StepReport TaskTrainer::step() {
  const TaskPlan& p = task_plan();
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = engine_->get_lr();  // the rate this step applies
  auto next = [&] {
    const uint64_t position = sampler_->next_sample_position();
    return pack_train(sampler_->next(), position);
  };
  const double loss = engine_->train_batch(next);
  StepReport r = engine_step_report(*engine_, loss, lr, seconds_since(t0), p.total_steps());
  r.tokens_per_second =
      static_cast<double>(p.global_batch() * p.tokens_per_example) / std::max(r.seconds, 1e-9);
  observer_.on_step(r);
  return r;
}

int64_t TaskTrainer::fit() {
  const TaskPlan& p = task_plan();
  return run_fit(*engine_, observer_, p.total_steps(), eval_steps(), p.spec.save_steps,
                 {.step = [this] { return step().step; },
                  .evaluate_now = [this] { evaluate_now(); },
                  .save = [this] { save(); },
                  .saved_now = [this] { return last_saved_ == engine_->global_steps(); }});
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
