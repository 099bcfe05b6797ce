#include "classify_run.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "console.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/runtime/config.h"
#include "ds/runtime/monitor.h"
#include "ds/train/classifier.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;

namespace {

// Console lines, the progress bar and csv_monitor rows (rank 0) for a classifier run.
class ClassifierConsole : public ClassifierObserver {
 public:
  Console con;
  std::optional<runtime::CsvMonitor> monitor;
  bool lead = true;
  int64_t logging_steps = 10;
  std::deque<double> recent;

  void message(const std::string& s) override { con.line("[ds_train] " + s); }
  void detail(const std::string& s) override { con.line(s); }
  void on_step(const StepReport& r) override {
    recent.push_back(r.loss);
    if (static_cast<int64_t>(recent.size()) > logging_steps) recent.pop_front();
    window_loss_ += r.loss, window_time_ += r.seconds, ++window_steps_;
    if (lead && monitor)
      monitor->write_events(
          {{"Train/Samples/train_loss", r.loss, r.samples}, {"Train/Samples/lr", r.lr, r.samples}});
    con.bar(fmt::format("step {}/{} [{}] loss {:.4f} | lr {:.2e}", r.step, r.total_steps,
                        bar_cells(double(r.step) / r.total_steps, 24), r.loss, r.lr));
    if (r.step % logging_steps == 0 || r.step == r.total_steps) {
      message(
          fmt::format("step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.2f}s/step{}",
                      r.step, r.total_steps, window_loss_ / window_steps_, r.lr, r.grad_norm,
                      window_time_ / window_steps_,
                      r.skipped_steps > 0 ? fmt::format(" | skipped {}", r.skipped_steps) : ""));
      window_loss_ = window_time_ = 0.0;
      window_steps_ = 0;
    }
  }
  void on_classify_eval(const ClassifyEvalReport& r) override {
    if (lead && monitor)
      monitor->write_events({{"Eval/Samples/eval_loss", r.loss, r.samples},
                             {"Eval/Samples/eval_accuracy", r.scores.accuracy, r.samples},
                             {"Eval/Samples/eval_f1", r.scores.f1, r.samples}});
    message(
        fmt::format("step {}: eval loss {:.4f}, accuracy {:.4f}, f1 {:.4f} ({}) over {} "
                    "examples ({:.1f}s)",
                    r.step, r.loss, r.scores.accuracy, r.scores.f1, r.scores.f1_kind,
                    r.scores.examples, r.seconds));
  }
  void on_save(const SaveReport& r) override {
    message(fmt::format("step {}: checkpoint {}/global_step{} ({:.1f}s)", r.step, r.dir.string(),
                        r.step, r.seconds));
  }
  void on_steps_done() override { con.end_bar(); }

 private:
  double window_loss_ = 0.0, window_time_ = 0.0;
  int64_t window_steps_ = 0;
};

// eval_results.json: what transformers' Trainer writes as eval_results.json.
void write_eval_json(const fs::path& file, const ClassifyEvalReport& r) {
  const nlohmann::json j = {
      {"eval_loss", r.loss},    {"eval_accuracy", r.scores.accuracy}, {"eval_f1", r.scores.f1},
      {"f1", r.scores.f1_kind}, {"eval_examples", r.scores.examples}, {"step", r.step}};
  write_file_atomic(file, j.dump(2) + "\n");
}

}  // namespace

int run_classifier(const Options& o, const Given& g, const char* builtin_config) {
  ClassifierConsole out;
  out.lead = comm::world()->rank() == 0;
  out.con.set_quiet(!out.lead);
  ClassifierPlan plan = plan_classifier(o, g, builtin_config);
  out.logging_steps = o.logging_steps > 0 ? o.logging_steps : plan.config().steps_per_print;
  for (const std::string& n : plan.notes) out.message(n);
  out.message(fmt::format("encoder classifier run: --train_data {} is a classification set",
                          plan.train_dir.string()));
  out.message(fmt::format("DeepSpeed config: {}", plan.run.source));
  out.con.line(runtime::format_effective_config(plan.config()));

  ClassifierTrainer trainer(std::move(plan), out);
  const ClassifierPlan& p = trainer.plan();
  const auto resumed = trainer.resume();
  const fs::path out_dir = trainer.output_dir();
  const auto& cfg = p.config();
  const fs::path csv_root =
      cfg.csv_monitor.output_path.empty() ? out_dir : fs::path(cfg.csv_monitor.output_path);
  out.monitor.emplace(
      csv_root, cfg.csv_monitor.enabled ? cfg.csv_monitor.job_name : "metrics",
      resumed ? std::optional<int64_t>(trainer.engine().global_samples()) : std::nullopt);

  if (o.eval_only) {
    DS_CHECK(p.val, "[ds_train] --eval_only needs eval data: a 'val' split in {} or --eval_data",
             p.train_dir.string());
    const auto r = trainer.evaluate();
    DS_CHECK(r.has_value(), "[ds_train] --eval_only: no evaluation examples");
    out.message(
        fmt::format("eval only: loss {:.6f}, accuracy {:.4f}, f1 {:.4f} ({}) over {} "
                    "examples ({:.1f}s)",
                    r->loss, r->scores.accuracy, r->scores.f1, r->scores.f1_kind,
                    r->scores.examples, r->seconds));
    return 0;
  }

  const int64_t eval_steps = trainer.eval_steps();
  out.message(fmt::format(
      "training {} steps ({}), {} examples/step; eval every {}, checkpoint "
      "every {} -> {}",
      p.total_steps(), p.run.total_why, p.global_batch(),
      eval_steps > 0 ? std::to_string(eval_steps) : "- (end only)",
      o.save_steps > 0 ? std::to_string(o.save_steps) : "- (end only)", out_dir.string()));
  const auto t0 = std::chrono::steady_clock::now();
  trainer.fit();
  const std::string export_dir =
      o.export_hf.empty() ? (out_dir / "hf_model").string() : o.export_hf;
  if (export_dir != "none") trainer.export_model(export_dir);

  out.message(fmt::format("done: {} steps in {}", trainer.engine().global_steps(),
                          human_duration(seconds_since(t0))));
  if (!out.recent.empty()) {
    double mean = 0.0;
    for (double l : out.recent) mean += l / static_cast<double>(out.recent.size());
    out.message(
        fmt::format("train loss {:.4f} (mean of the last {} steps)", mean, out.recent.size()));
  }
  if (const auto& e = trainer.last_eval()) {
    if (out.lead) write_eval_json(out_dir / "eval_results.json", *e);
    out.message(fmt::format("eval: loss {:.4f}, accuracy {:.4f}, f1 {:.4f} ({}) -> {}", e->loss,
                            e->scores.accuracy, e->scores.f1, e->scores.f1_kind,
                            (out_dir / "eval_results.json").string()));
  }
  out.message(fmt::format("checkpoint: {}/{} (resume: --resume_from_checkpoint latest)",
                          out_dir.string(), latest_tag(out_dir)));
  const auto& lora = trainer.plan().lora;
  if (export_dir != "none" && lora && lora->only_optimize_lora && !o.merge_lora)
    out.message(fmt::format(
        "HF export:  {} (PEFT SEQ_CLS adapter: adapter_config.json + adapter_model.safetensors; "
        "PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), "
        "dir) reads it)",
        export_dir));
  else if (export_dir != "none")
    out.message(
        fmt::format("HF export:  {} (config.json + model.safetensors + tokenizer{}; "
                    "AutoModelForSequenceClassification.from_pretrained reads it)",
                    export_dir, lora ? ", LoRA merged" : ""));
  return 0;
}

}  // namespace ds::train
