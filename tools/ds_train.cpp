// ds_train: train a GPT model with a DeepSpeed config, Hugging Face Trainer style (or, on a
// classification set, an encoder classifier: tools/train/classify_run.cpp; on a seq2seq set, an
// encoder-decoder: tools/train/seq2seq_run.cpp).
//
//   ds_prepare --tokenizer .cache/data/gpt2 --output .cache/prepared/sotu
//              --val_from_year 2001 .cache/data/sotu
//   ds_train --deepspeed configs/ds_demo.json --model tiny --train_data .cache/prepared/sotu
//            --output_dir out/demo --max_steps 300 --learning_rate 1e-3
//
// One process, or several through the deepspeed launcher / mpirun (every rank trains its slice of
// each global batch). Flags, outputs and resume are described in docs/training.md. The training
// itself is the library's train::Trainer (include/ds/train/trainer.h); this program is its option
// table and its console (tools/train/progress.h: the log lines, the progress bar, the metric
// files).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "classify_run.h"
#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/parallel.h"
#include "ds/config/config.h"
#include "ds/runtime/monitor_master.h"
#include "ds/train/classifier.h"
#include "ds/train/seq2seq_trainer.h"
#include "ds/train/train_util.h"
#include "ds/train/trainer.h"
#include "ds_train_default_config.h"
#include "options.h"
#include "progress.h"
#include "seq2seq_run.h"

namespace fs = std::filesystem;
using ds::train::human_count;
using ds::train::human_duration;
using ds::train::mib;
using ds::train::seconds_since;

namespace {

// --threads, with a warning when it exceeds the cores this process may use.
void set_threads(int threads, ds::train::ProgressReport& out) {
  if (threads <= 0) return;
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(threads) > cores)
    out.message(
        fmt::format("warning: --threads {} is more than the {} cores this process may "
                    "use; the threads will compete for them (slower, and OpenBLAS may "
                    "spin)",
                    threads, cores));
  ds::set_num_threads(threads);
}

// The metrics: the config's monitors and --report_to's (ds/runtime/monitor_master.h; the CSV files
// always); a resumed run drops rows past its step, and a run resumed at its end (nothing left to
// train) must not evaluate, and log, that step twice.
void start_metrics(ds::train::Trainer& trainer, ds::train::ProgressReport& out) {
  auto& engine = trainer.engine();
  ds::runtime::MonitorSetup ms;
  ms.default_root = trainer.output_dir();
  if (trainer.resumed()) ms.resumed_at = engine.global_samples();
  ms.lead = trainer.is_lead();
  ms.report_to = ds::runtime::parse_report_to(trainer.plan().spec.report_to);
  out.monitor.emplace(trainer.plan().config(), ms);
  if (const auto* tb = out.monitor->tensorboard())
    out.message(fmt::format("TensorBoard events: {}", tb->file().string()));
  if (trainer.resumed())
    for (const auto& [samples, loss] :
         ds::runtime::CsvMonitor::read(out.monitor->csv().file_of("Eval/Samples/eval_loss")))
      if (samples == engine.global_samples()) trainer.mark_evaluated(engine.global_steps(), loss);
}

// --eval_only: the model as loaded, on the eval data, and nothing else (no step, checkpoint or
// export).
int eval_only(ds::train::Trainer& trainer, const ds::train::Options& o,
              ds::train::ProgressReport& out) {
  const ds::train::RunPlan& p = trainer.plan();
  const int64_t B = p.micro_batch(), T = p.seq_len;
  DS_CHECK(p.val, "[ds_train] --eval_only needs eval data: a 'val' split in {} or --eval_data",
           p.train_dir.string());
  const int64_t batches = std::min<int64_t>(
      o.eval_batches, static_cast<int64_t>(p.val->num_samples(static_cast<size_t>(T))) / B);
  DS_CHECK(batches > 0,
           "[ds_train] --eval_only: the eval data has fewer than one batch of {} x {} tokens", B,
           T);
  const auto t0 = std::chrono::steady_clock::now();
  const double loss = trainer.evaluate(o.eval_batches);
  out.message(
      fmt::format("eval only: loss {:.6f}, perplexity {:.4f} over {} batches of {} x {} "
                  "({:.1f}s)",
                  loss, std::exp(loss), batches, B, T, seconds_since(t0)));
  return 0;
}

// What the end of a run wrote, one line each.
struct RunOutputs {
  fs::path svg;
  std::string export_dir, export_note, sample_note;
  std::vector<ds::train::RankMemory> ranks;
};

void print_summary(ds::train::Trainer& trainer, ds::train::ProgressReport& out,
                   const RunOutputs& r) {
  const fs::path out_dir = trainer.output_dir();
  double recent_mean = 0.0;
  for (double l : out.recent) recent_mean += l / static_cast<double>(out.recent.size());
  auto say = [&](const std::string& s) { out.message(s); };
  say(fmt::format("done: {} steps in {}", trainer.engine().global_steps(),
                  human_duration(seconds_since(out.t_start))));
  if (!out.recent.empty())
    say(fmt::format("train loss {:.4f} (mean of the last {} steps; unigram entropy {:.3f})",
                    recent_mean, out.recent.size(), trainer.unigram().entropy_nats));
  if (std::isfinite(trainer.last_eval()))
    say(fmt::format("eval loss  {:.4f}, perplexity {:.1f} (train unigram frequencies: {:.3f})",
                    trainer.last_eval(), std::exp(trainer.last_eval()), trainer.eval_baseline()));
  say(fmt::format("metrics:    {}/*.csv", out.monitor->csv().log_dir().string()));
  if (const auto* tb = out.monitor->tensorboard())
    say(fmt::format("tensorboard: {} (tensorboard --logdir {})", tb->log_dir().string(),
                    tb->log_dir().parent_path().string()));
  say(fmt::format("loss curve: {}", r.svg.string()));
  say(fmt::format("checkpoint: {}/{} (resume: --resume_from_checkpoint latest)", out_dir.string(),
                  ds::train::latest_tag(out_dir)));
  if (r.export_dir != "none")
    say(fmt::format("HF export:  {}", r.export_note.empty()
                                          ? r.export_dir + " (config.json + model.safetensors)"
                                          : r.export_note));
  if (!r.sample_note.empty()) say(fmt::format("sample:     {}", r.sample_note));
  int64_t max_rss = 0;
  for (const auto& m : r.ranks) max_rss = std::max(max_rss, m.peak_rss_bytes);
  say(fmt::format(
      "memory:     {}/memory.json (peak RSS {}{})", out_dir.string(),
      mib(r.ranks.front().peak_rss_bytes),
      r.ranks.size() > 1 ? fmt::format(" on rank 0, {} on the largest rank", mib(max_rss)) : ""));
}

// The end of a run: memory.json, the loss picture, the sample, comms_logger, the export and the
// summary.
void finish(ds::train::Trainer& trainer, const ds::train::Options& o,
            ds::train::ProgressReport& out, bool lead) {
  const ds::train::RunPlan& p = trainer.plan();
  const fs::path out_dir = trainer.output_dir();
  RunOutputs r;
  r.ranks = trainer.report_memory(out_dir / "memory.json");
  // The picture is drawn from the CSV files, which hold the whole run across resumes.
  r.svg = out_dir / "loss.svg";
  if (lead)
    ds::train::write_loss_chart(
        r.svg, out.monitor->csv(), p.global_batch(), p.seq_len,
        fmt::format("{} on {}", p.model_name, p.train_dir.filename().string()),
        trainer.unigram().entropy_nats, trainer.eval_baseline());
  const auto t0 = std::chrono::steady_clock::now();
  if (const auto text = trainer.generate_sample()) {
    if (lead) ds::write_file_atomic(out_dir / "sample.txt", *text + "\n");
    out.message(fmt::format("sample ({} tokens, top-k {}, seed {}, {:.1f}s):", o.sample_tokens,
                            o.sample_top_k, o.seed, seconds_since(t0)));
    out.con.line("---\n" + *text + "\n---");
    r.sample_note = (out_dir / "sample.txt").string();
  }
  // comms_logger: per-operation counts, bytes and times of this rank's collectives.
  if (p.config().comms_logger.enabled && lead)
    out.con.line("comms_logger (rank 0):\n" + ds::comm::comms_logger().table());
  r.export_dir = o.export_hf.empty() ? (out_dir / "hf_model").string() : o.export_hf;
  r.export_note = r.export_dir == "none" ? "" : trainer.export_model(r.export_dir);
  print_summary(trainer, out, r);
}

int run(const ds::train::Options& o, const ds::train::Given& g) {
  const auto world = ds::comm::world();
  const bool lead = world->rank() == 0;
  ds::train::ProgressReport out;
  out.con.set_quiet(!lead);
  set_threads(o.threads, out);
  ds::runtime::parse_report_to(o.report_to);  // wandb, comet_ml or a typo: stop before any work
  // A classification set trains an encoder classifier (tools/train/classify_run.cpp).
  // A seq2seq set trains an encoder-decoder (tools/train/seq2seq_run.cpp).
  if (ds::train::is_seq2seq_run(o)) return ds::train::run_seq2seq(o, g, kDefaultDeepSpeedConfig);
  // The generation options of seq2seq evaluations would be ignored elsewhere.
  for (auto [given, name] : {std::pair{g.eval_bleu_examples, "--eval_bleu_examples"},
                             std::pair{g.generation_num_beams, "--generation_num_beams"},
                             std::pair{g.generation_max_length, "--generation_max_length"}})
    DS_CHECK(!given,
             "[ds_train] {} applies to seq2seq sets only (ds_prepare --task seq2seq), but "
             "--train_data {} is not one; remove it",
             name, o.train_data);
  if (ds::train::is_classification_run(o))
    return ds::train::run_classifier(o, g, kDefaultDeepSpeedConfig);
  ds::train::RunPlan plan = ds::train::plan_run(o, g, kDefaultDeepSpeedConfig);
  out.logging_steps = o.logging_steps > 0 ? o.logging_steps : plan.config().steps_per_print;
  for (const std::string& note : plan.notes) out.message(note);
  out.message(fmt::format("DeepSpeed config: {}", plan.run.source));
  out.con.line(ds::config::format_effective_config(plan.config()));
  ds::config::print_config_warnings(plan.config(), stdout);

  ds::train::Trainer trainer(std::move(plan), out);
  out.trainer = &trainer;
  const ds::train::RunPlan& p = trainer.plan();
  trainer.resume();
  start_metrics(trainer, out);
  const int64_t eval_steps = trainer.eval_steps();
  out.message(fmt::format(
      "training {} steps ({}), {} tokens/step; logging every {}, eval every {}, "
      "checkpoint every {} -> {}",
      p.total_steps(), p.run.total_why, human_count(static_cast<double>(trainer.tokens_per_step())),
      out.logging_steps, eval_steps > 0 ? std::to_string(eval_steps) : "- (end only)",
      o.save_steps > 0 ? std::to_string(o.save_steps) : "- (end only)",
      trainer.output_dir().string()));
  if (o.eval_only) return eval_only(trainer, o, out);
  trainer.fit();
  finish(trainer, o, out, lead);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ds::train::Options o;
  ds::train::Given g;
  CLI::App app{
      "Train a GPT model with a DeepSpeed config (one process). Flags follow the Hugging Face "
      "Trainer; \"auto\" values in the config take them. docs/training.md has the details.\n"
      "On a classification set (ds_prepare --task classification) it fine-tunes an encoder "
      "classifier (BERT, RoBERTa, DeBERTa-v2) and reports accuracy and F1 (docs/training.md, "
      "\"Encoder classifiers\"); on a seq2seq set (ds_prepare --task seq2seq) it fine-tunes an "
      "encoder-decoder (BART, BlenderBot) and reports loss and BLEU (\"Encoder-decoders\").\n"
      "Example:\n  ds_train --deepspeed configs/ds_demo.json --model tiny --train_data "
      ".cache/prepared/sotu --output_dir out/demo --max_steps 300 --learning_rate 1e-3",
      "ds_train"};
  std::vector<std::pair<CLI::Option*, bool*>> given;
  ds::train::add_options(app, o, g, given);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag exits 2, the usual status of a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [op, flag] : given) *flag = op->count() > 0;

  try {
    return run(o, g);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // The communication layer has printed its report and is ending the job with its own status.
    if (ds::comm::job_failed()) ds::comm::abort_job(ds::comm::kCommFailureExitCode, "");
    const std::string what = e.what();
    // The world may be what failed (WORLD_SIZE=2 without mpirun): then this is one process.
    std::shared_ptr<ds::comm::Group> world;
    try {
      world = ds::comm::world();
    } catch (const std::exception&) {
    }
    const bool several = world && world->size() > 1;
    // Most errors (config, data, arguments) happen on every rank alike: let rank 0 report and end
    // the job, so the message appears once. An error only this rank hit still gets printed after
    // the pause, when rank 0 has not ended the job.
    if (several && world->rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    // On a terminal the progress bar may still occupy the line.
    fmt::print(stderr, "{}{}{}\n", ::isatty(STDERR_FILENO) ? "\n" : "",
               what.rfind('[', 0) == 0 ? "" : "[ds_train] error: ", what);
    // The other ranks would wait for this one at their next collective: end the whole job now.
    if (several)
      ds::comm::abort_job(1, fmt::format("[ds_train] rank {} stopped the job", world->rank()));
    return 1;
  }
}
