#include "task_run.h"

#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/config/config.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;

void TaskLog::log_step(const StepReport& r) {
  recent.push_back(r.loss);
  if (static_cast<int64_t>(recent.size()) > logging_steps) recent.pop_front();
  window_loss_ += r.loss, window_time_ += r.seconds, ++window_steps_;
  if (lead && monitor)
    monitor->write_events(
        {{"Train/Samples/train_loss", r.loss, r.samples}, {"Train/Samples/lr", r.lr, r.samples}});
  con.bar(fmt::format("step {}/{} [{}] loss {:.4f} | lr {:.2e}", r.step, r.total_steps,
                      bar_cells(double(r.step) / r.total_steps, 24), r.loss, r.lr));
  if (r.step % logging_steps == 0 || r.step == r.total_steps) {
    say(fmt::format("step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.2f}s/step{}",
                    r.step, r.total_steps, window_loss_ / window_steps_, r.lr, r.grad_norm,
                    window_time_ / window_steps_,
                    r.skipped_steps > 0 ? fmt::format(" | skipped {}", r.skipped_steps) : ""));
    window_loss_ = window_time_ = 0.0;
    window_steps_ = 0;
  }
}

void TaskLog::log_save(const SaveReport& r) {
  say(fmt::format("step {}: checkpoint {}/global_step{} ({:.1f}s)", r.step, r.dir.string(), r.step,
                  r.seconds));
}

void start_task_log(TaskLog& log, const TaskPlan& plan, const std::string& run_line) {
  log.lead = comm::world()->rank() == 0;
  log.con.set_quiet(!log.lead);
  log.logging_steps =
      plan.spec.logging_steps > 0 ? plan.spec.logging_steps : plan.config().steps_per_print;
  for (const std::string& n : plan.notes) log.say(n);
  log.say(run_line);
  log.say(fmt::format("DeepSpeed config: {}", plan.run.source));
  log.con.line(config::format_effective_config(plan.config()));
}

int run_task(TaskLog& log, TaskTrainer& trainer, const TaskPlan& p, const TaskRunText& text) {
  const Options& o = p.spec;
  const auto resumed = trainer.resume();
  const fs::path out_dir = trainer.output_dir();
  runtime::MonitorSetup ms;
  ms.default_root = out_dir;
  if (resumed) ms.resumed_at = trainer.engine().global_samples();
  ms.lead = log.lead;
  ms.report_to = runtime::parse_report_to(o.report_to);
  log.monitor.emplace(p.config(), ms);
  if (const auto* tb = log.monitor->tensorboard())
    log.say(fmt::format("TensorBoard events: {}", tb->file().string()));

  if (o.eval_only) {
    DS_CHECK(p.has_val(),
             "[ds_train] --eval_only needs eval data: a 'val' split in {} or --eval_data",
             p.train_dir.string());
    text.eval_only();
    return 0;
  }

  const int64_t eval_steps = trainer.eval_steps();
  log.say(fmt::format(
      "training {} steps ({}), {} examples/step; eval every {}, checkpoint every {} -> {}",
      p.total_steps(), p.run.total_why, p.global_batch(),
      eval_steps > 0 ? std::to_string(eval_steps) : "- (end only)",
      o.save_steps > 0 ? std::to_string(o.save_steps) : "- (end only)", out_dir.string()));
  const auto t0 = std::chrono::steady_clock::now();
  trainer.fit();
  const fs::path export_dir = export_folder(o);
  if (!export_dir.empty()) trainer.export_model(export_dir.string());

  log.say(fmt::format("done: {} steps in {}", trainer.engine().global_steps(),
                      human_duration(seconds_since(t0))));
  if (!log.recent.empty()) {
    double mean = 0.0;
    for (double l : log.recent) mean += l / static_cast<double>(log.recent.size());
    log.say(fmt::format("train loss {:.4f} (mean of the last {} steps)", mean, log.recent.size()));
  }
  text.final_eval(out_dir);
  log.say(fmt::format("checkpoint: {}/{} (resume: --resume_from_checkpoint latest)",
                      out_dir.string(), latest_tag(out_dir)));
  if (!export_dir.empty()) log.say(text.export_line(export_dir.string()));
  return 0;
}

}  // namespace ds::train
