#include "ds/optim/mup.h"
#include "ds/train/trainer_base.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/train/outputs.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

TrainerBase::TrainerBase(TrainerObserver& observer)
    : obs_(observer), rank_(comm::world()->rank()) {}

TrainerBase::~TrainerBase() = default;

// ---- set-up ----------------------------------------------------------------------------------

void TrainerBase::attach_engine(runtime::Engine& engine) {
  const PlanBase& p = plan_base();
  engine_ = &engine;
  out_dir_ = p.spec.output_dir;
  rng::dropout_state() = rng::DropoutState{p.spec.seed, 0, 0};
  const config::DeepSpeedConfig& cfg = p.config();
  mem_ = engine_->memory_budget();
  if (p.world_size > 1) {
    // Every rank's model-state bytes, next to the ZeRO paper's prediction.
    const auto ranks = gather_memory(*engine_, {.rank = rank_, .mem = mem_});
    say(fmt::format("model-state memory per rank, ZeRO stage {}, {} params, {} grads:",
                    cfg.zero_optimization.stage, dtype_name(engine_->training_dtype()),
                    dtype_name(engine_->grad_dtype())));
    print_memory_table(ranks, paper_model_state_bytes(*engine_),
                       [&](const std::string& l) { line(l); });
  } else {
    say(fmt::format("memory, ZeRO stage {}, {} params, {} grads:", cfg.zero_optimization.stage,
                    dtype_name(engine_->training_dtype()), dtype_name(engine_->grad_dtype())));
    line(fmt::format("  parameters        {:>12}", mib(mem_.params)));
    line(fmt::format("  gradients         {:>12}", mib(mem_.grads)));
    line(fmt::format("  master weights    {:>12}", mib(mem_.master_weights)));
    line(fmt::format("  optimizer states  {:>12}", mib(mem_.optimizer_states)));
    line(fmt::format("  model states      {:>12}", mib(mem_.total())));
  }
  if (const auto& fz = engine_->strategy().frozen(); fz.numel > 0)
    line(
        fmt::format("  frozen            {:>12}  (in parameters: {} frozen weights, whole on "
                    "every rank, without gradients or optimizer state)",
                    mib(static_cast<int64_t>(fz.params.nbytes())), human_count(fz.numel)));
  if (mem_.nvme > 0)
    line(
        fmt::format("  on NVMe           {:>12}  (optimizer state swapped through RAM buffers; "
                    "docs/offload.md)",
                    mib(mem_.nvme)));
  if (mem_.scratch > 0)
    line(
        fmt::format("  gradient scratch  {:>12}  (fp32 copy of the 16-bit gradients for the "
                    "optimizer)",
                    mib(mem_.scratch)));
}

void TrainerBase::open_output() {
  fs::create_directories(out_dir_);
  if (!is_lead()) return;
  // A crash (kill, full disk) can leave temporaries as large as a checkpoint (a checkpoint or an
  // export cut short): this run owns the folder, so they go now.
  const auto stale = remove_stale_temporaries(out_dir_, export_folder(plan_base().spec));
  if (stale.empty()) return;
  std::vector<std::string> names;
  for (const auto& f : stale) names.push_back(f.lexically_relative(out_dir_).string());
  say(fmt::format("removed {} temporar{} left by an interrupted earlier run in {}: {}",
                  stale.size(), stale.size() == 1 ? "y" : "ies", out_dir_.string(),
                  fmt::join(names, ", ")));
}

void TrainerBase::move_to_device(nn::Module& model) {
  const Device device = plan_base().device;
  if (device.is_cpu()) return;
  model.to(device);
  say(fmt::format("device: {} ({})", device.str(), backend::get(device).gemm_info()));
}

runtime::InitOptions TrainerBase::engine_options() {
  runtime::InitOptions init;
  init.ctx = plan_base().run.ctx;
  init.log = [this](const std::string& s) { line(s); };
  if (!plan_base().spec.mup_base_shapes.empty())
    init.mup_base_shapes = optim::load_mup_base_shapes(plan_base().spec.mup_base_shapes);
  return init;
}

data::SamplerOptions TrainerBase::sampler_options() const {
  const PlanBase& p = plan_base();
  return {.micro_batch = static_cast<int>(p.micro_batch()),
          .grad_accum = static_cast<int>(p.grad_accum()),
          .world_size = engine_->world_size(),
          .rank = engine_->rank(),
          .seed = p.spec.seed,
          .shuffle = !p.spec.no_shuffle};
}

// ---- checkpoints -----------------------------------------------------------------------------

std::optional<ResumeReport> TrainerBase::resume() {
  const std::string& from = plan_base().spec.resume_from_checkpoint;
  if (!from.empty()) return resume_from(from);
  note_earlier_run();
  return std::nullopt;
}

void TrainerBase::note_earlier_run() {
  // An earlier run's checkpoints: say so, and never rotate them away (DeepSpeed users lose runs
  // exactly this way: a restart without resume plus save_total_limit deleted the old run).
  earlier_run_.clear();
  for (const auto& p : checkpoint_folders(out_dir_)) earlier_run_.push_back(p.filename().string());
  if (earlier_run_.empty()) return;
  const std::string tag = latest_tag(out_dir_);
  say(fmt::format(
      "note: {} holds checkpoints of an earlier run ({}{}); this run starts afresh "
      "(--resume_from_checkpoint {} would continue that run). A save at the same step replaces "
      "that step's folder; --save_total_limit rotates only this run's checkpoints and keeps the "
      "earlier ones: delete them yourself when no longer needed",
      out_dir_.string(), fmt::join(earlier_run_, ", "),
      tag.empty() ? "; no 'latest' file" : fmt::format("; latest: {}", tag),
      tag.empty() ? (out_dir_ / earlier_run_.back()).string() : "latest"));
}

// The folder holding the tags that --resume_from_checkpoint `from` names, and the tag when it
// names one ("" = that folder's latest).
fs::path TrainerBase::resume_dir(const std::string& from, std::string* tag) const {
  if (from == "latest" && !fs::exists(out_dir_ / "latest")) {
    // `latest` is written last by a save: without it the newest folder may be incomplete, but the
    // folders are there, and starting afresh is what loses them.
    std::vector<std::string> tags;
    for (const auto& p : checkpoint_folders(out_dir_)) tags.push_back(p.filename().string());
    DS_CHECK(!tags.empty(),
             "[ds_train] --resume_from_checkpoint latest: {} holds no checkpoint (no 'latest' "
             "file and no global_step* folder); start without --resume_from_checkpoint",
             out_dir_.string());
    DS_THROW(
        "[ds_train] --resume_from_checkpoint latest: {} has no 'latest' file, but it holds the "
        "checkpoint folders {}. Resume from one explicitly, newest first: "
        "--resume_from_checkpoint {} (each folder's checksums are verified when it loads; if the "
        "newest was cut short, take the one before). Starting without --resume_from_checkpoint "
        "would begin a new run in this folder",
        out_dir_.string(), fmt::join(tags, ", "), (out_dir_ / tags.back()).string());
  }
  const fs::path dir = from == "latest" ? out_dir_ : fs::path(from);
  if (from != "latest" && !fs::exists(dir / "latest") && fs::is_directory(dir)) {
    // A tag folder (out/global_step100) rather than the folder holding the tags.
    *tag = dir.filename().string();
    return dir.parent_path();
  }
  return dir;
}

std::optional<ResumeReport> TrainerBase::resume_from(const std::string& from) {
  const PlanBase& p = plan_base();
  const std::string task = p.names.task;
  const int64_t total_steps = p.total_steps();
  std::string tag;
  const fs::path dir = resume_dir(from, &tag);
  check_checkpoint_task(dir, tag, task, p.train_dir.string());  // before any tensor loads
  const json client = load_checkpoint(dir.string(), tag);
  const json d = client.contains("ds_train") ? client["ds_train"] : json::object();
  // A task's checkpoints record their task; an LM checkpoint records none (check_checkpoint_task).
  DS_CHECK(task == kLmNames.task || (d.is_object() && d.value("task", std::string()) == task),
           "[ds_train] the checkpoint in {} is not a {} run's (written by ds_train on a {} set); "
           "cannot resume it here",
           dir.string(), p.names.run, task);
  DS_CHECK(client.contains("data"),
           "[ds_train] the checkpoint in {} has no data-loader position (not written by "
           "ds_train?); cannot resume exactly",
           dir.string());
  check_checkpoint(d);
  load_data_state(client["data"]);
  // A longer (or shorter) run re-plans the schedule from here.
  if (const int64_t planned = d.value("total_steps", total_steps); planned != total_steps)
    say(
        fmt::format("note: the checkpoint's run was planned for {} steps, this one for {}; the "
                    "learning-rate schedule follows the new length from here",
                    planned, total_steps));
  ResumeReport r{dir, tag.empty() ? latest_tag(dir) : tag, engine_->global_steps(),
                 engine_->global_samples()};
  say(fmt::format("resumed from {} (tag {}): step {}, {} samples seen", r.dir.string(), r.tag,
                  r.step, r.samples));
  resumed_ = true;
  last_saved_ = engine_->global_steps();  // that checkpoint exists already
  return r;
}

SaveReport TrainerBase::save() {
  const auto t0 = std::chrono::steady_clock::now();
  const PlanBase& p = plan_base();
  json identity = checkpoint_fields();
  if (std::string(p.names.task) != kLmNames.task) identity["task"] = p.names.task;
  identity["total_steps"] = p.total_steps();
  identity["seed"] = p.spec.seed;
  identity["train_data"] = p.train_dir.string();
  save_checkpoint(out_dir_.string(), {{"data", data_state()}, {"ds_train", identity}});
  last_saved_ = engine_->global_steps();
  // This run's folder now, even if an earlier run had written one of the same step.
  std::erase(earlier_run_, fmt::format("global_step{}", last_saved_));
  SaveReport r;
  r.step = last_saved_;
  r.dir = out_dir_;
  if (is_lead()) r.deleted = rotate_checkpoints(out_dir_, p.spec.save_total_limit, earlier_run_);
  r.seconds = seconds_since(t0);
  obs_.on_save(r);
  return r;
}

json TrainerBase::load_checkpoint(const std::string& dir, const std::string& tag) {
  return engine_->load_checkpoint(dir, tag);
}

void TrainerBase::save_checkpoint(const std::string& dir, const json& client) {
  engine_->save_checkpoint(dir, "", client);
}

// ---- the loop --------------------------------------------------------------------------------

void TrainerBase::evaluate_now() {
  if (evaluated_at_ == engine_->global_steps()) return;
  evaluated_at_ = engine_->global_steps();
  report_evaluation();
}

int64_t TrainerBase::eval_steps() const {
  const PlanBase& p = plan_base();
  return p.spec.eval_steps >= 0 ? p.spec.eval_steps : std::max<int64_t>(1, p.total_steps() / 10);
}

int64_t TrainerBase::tokens_per_step() const {
  const PlanBase& p = plan_base();
  return p.global_batch() * p.tokens_per_example;
}

double TrainerBase::train_batch(const std::function<runtime::MicroBatch()>& next) {
  return engine_->train_batch(next);
}

StepReport TrainerBase::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = engine_->get_lr();  // the rate this step applies
  const double loss = train_batch([this] { return next_micro_batch(); });
  const runtime::Engine& e = *engine_;
  StepReport r;
  r.loss = loss;
  r.seconds = seconds_since(t0);
  r.step = e.global_steps();
  r.total_steps = plan_base().total_steps();
  r.samples = e.global_samples();
  r.lr = lr;
  r.grad_norm = e.last_grad_norm();
  r.loss_scale = e.loss_scale();
  r.skipped_steps = e.skipped_steps();
  r.tokens_per_second = static_cast<double>(tokens_per_step()) / std::max(r.seconds, 1e-9);
  obs_.on_step(r);
  return r;
}

int64_t TrainerBase::fit() {
  runtime::Engine& engine = *engine_;
  const PlanBase& p = plan_base();
  const int64_t total_steps = p.total_steps(), eval_every = eval_steps(),
                save_steps = p.spec.save_steps;
  const int64_t first_step = engine.global_steps();
  const int64_t skipped_before = engine.skipped_steps();
  while (engine.global_steps() < total_steps) {
    const int64_t s = step().step;
    if (eval_every > 0 && s % eval_every == 0 && s != total_steps) evaluate_now();
    if (save_steps > 0 && s % save_steps == 0 && s != total_steps) save();
  }
  obs_.on_steps_done();
  engine.synchronize();  // the last optimizer step may still run in the background (offload)

  // A run that never applied a step trained nothing: its checkpoint and export would be the
  // starting weights. Fail instead of reporting success.
  const int64_t steps_run = engine.global_steps() - first_step;
  if (steps_run > 0 && engine.skipped_steps() - skipped_before >= steps_run)
    DS_THROW(
        "[ds_train] every one of the {} steps of this run was skipped for non-finite gradients: "
        "the model did not train and nothing was saved. Lower --learning_rate, set "
        "gradient_clipping, use bf16 instead of fp16, or check the data",
        steps_run);
  // The final checkpoint first: an evaluation that fails (a bad eval set, a generation error)
  // must never cost the training.
  if (last_saved_ != engine.global_steps()) save();
  try {
    evaluate_now();
  } catch (const std::exception& e) {
    DS_THROW(
        "{}\n[ds_train] the final evaluation failed, but the training is kept: the checkpoint of "
        "step {} is saved (ds_to_fp32 exports it; --resume_from_checkpoint latest --eval_only "
        "evaluates it again once the cause is fixed)",
        e.what(), engine.global_steps());
  }
  return steps_run;
}

}  // namespace ds::train
