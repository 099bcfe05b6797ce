#include "seq2seq_run.h"

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
#include "ds/train/lora.h"
#include "ds/train/seq2seq_trainer.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;

namespace {

std::string bleu_text(const Seq2SeqEvalReport& r) {
  if (!r.bleu) return "";
  return fmt::format(", BLEU {:.2f} ({} generations, BP {:.3f})", r.bleu->score, r.generated,
                     r.bleu->brevity_penalty);
}

// Console lines, the progress bar and csv_monitor rows (rank 0) for a seq2seq run.
class Seq2SeqConsole : public Seq2SeqObserver {
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
  void on_seq2seq_eval(const Seq2SeqEvalReport& r) override {
    if (lead && monitor) {
      std::vector<runtime::MonitorEvent> ev = {{"Eval/Samples/eval_loss", r.loss, r.samples}};
      if (r.bleu) ev.push_back({"Eval/Samples/eval_bleu", r.bleu->score, r.samples});
      monitor->write_events(ev);
    }
    message(fmt::format("step {}: eval loss {:.4f} over {} examples ({} target tokens){} ({:.1f}s)",
                        r.step, r.loss, r.examples, r.tokens, bleu_text(r), r.seconds));
    for (size_t i = 0; i < r.hypotheses.size(); ++i)
      con.line(fmt::format("    source: {}\n    target: {}\n    output: {}", r.sources[i],
                           r.references[i], r.hypotheses[i]));
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

// eval_results.json: what transformers' Seq2SeqTrainer writes (eval_loss, eval_bleu).
void write_eval_json(const fs::path& file, const Seq2SeqEvalReport& r) {
  nlohmann::json j = {{"eval_loss", r.loss},
                      {"eval_examples", r.examples},
                      {"eval_target_tokens", r.tokens},
                      {"step", r.step}};
  if (r.bleu) {
    j["eval_bleu"] = r.bleu->score;
    j["eval_bleu_brevity_penalty"] = r.bleu->brevity_penalty;
    j["eval_bleu_precisions"] = r.bleu->precisions;
    j["eval_generated"] = r.generated;
    j["bleu_signature"] = "sacrebleu defaults: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp";
  }
  write_file_atomic(file, j.dump(2) + "\n");
}

}  // namespace

int run_seq2seq(const Options& o, const Given& g, const char* builtin_config) {
  Seq2SeqConsole out;
  out.lead = comm::world()->rank() == 0;
  out.con.set_quiet(!out.lead);
  Seq2SeqPlan plan = plan_seq2seq(o, g, builtin_config);
  out.logging_steps = o.logging_steps > 0 ? o.logging_steps : plan.config().steps_per_print;
  for (const std::string& n : plan.notes) out.message(n);
  out.message(fmt::format("encoder-decoder run: --train_data {} is a seq2seq set",
                          plan.train_dir.string()));
  out.message(fmt::format("DeepSpeed config: {}", plan.run.source));
  out.con.line(runtime::format_effective_config(plan.config()));

  Seq2SeqTrainer trainer(std::move(plan), out);
  const Seq2SeqPlan& p = trainer.plan();
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
    out.message(fmt::format("eval only: loss {:.6f} over {} examples{} ({:.1f}s)", r->loss,
                            r->examples, bleu_text(*r), r->seconds));
    for (size_t i = 0; i < r->hypotheses.size(); ++i)
      out.con.line(fmt::format("    source: {}\n    target: {}\n    output: {}", r->sources[i],
                               r->references[i], r->hypotheses[i]));
    return 0;
  }

  const int64_t eval_steps = trainer.eval_steps();
  out.message(fmt::format(
      "training {} steps ({}), {} examples/step; eval every {}, checkpoint every {} -> {}",
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
    out.message(fmt::format("eval: loss {:.4f}{} -> {}", e->loss, bleu_text(*e),
                            (out_dir / "eval_results.json").string()));
  }
  out.message(fmt::format("checkpoint: {}/{} (resume: --resume_from_checkpoint latest)",
                          out_dir.string(), latest_tag(out_dir)));
  if (export_dir != "none")
    out.message(fmt::format("HF export:  {} ({})", export_dir, seq2seq_export_note(p.lora, o)));
  return 0;
}

}  // namespace ds::train
