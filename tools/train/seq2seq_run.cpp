#include "seq2seq_run.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/text_tokenizer.h"
#include "ds/train/lora.h"
#include "ds/train/seq2seq_trainer.h"
#include "task_run.h"

namespace ds::train {

namespace fs = std::filesystem;

namespace {

std::string bleu_text(const Seq2SeqEvalReport& r) {
  if (!r.bleu) return "";
  return fmt::format(", BLEU {:.2f} ({} generations, BP {:.3f})", r.bleu->score, r.generated,
                     r.bleu->brevity_penalty);
}

// The first generations of an evaluation, for a look.
void show_generations(Console& con, const Seq2SeqEvalReport& r) {
  for (size_t i = 0; i < r.hypotheses.size(); ++i)
    con.line(fmt::format("    source: {}\n    target: {}\n    output: {}", r.sources[i],
                         r.references[i], r.hypotheses[i]));
}

// The task run's console plus the seq2seq evaluations (lines and csv_monitor rows).
class Seq2SeqConsole : public TaskConsole<Seq2SeqObserver> {
 public:
  void on_seq2seq_eval(const Seq2SeqEvalReport& r) override {
    if (lead && monitor) {
      std::vector<runtime::MonitorEvent> ev = {{"Eval/Samples/eval_loss", r.loss, r.samples}};
      if (r.bleu) ev.push_back({"Eval/Samples/eval_bleu", r.bleu->score, r.samples});
      monitor->write_events(ev);
    }
    message(fmt::format("step {}: eval loss {:.4f} over {} examples ({} target tokens){} ({:.1f}s)",
                        r.step, r.loss, r.examples, r.tokens, bleu_text(r), r.seconds));
    show_generations(con, r);
  }
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
  Seq2SeqPlan plan = plan_seq2seq(o, g, builtin_config);
  start_task_log(out, plan,
                 fmt::format("encoder-decoder run: --train_data {} is a seq2seq set",
                             plan.train_dir.string()));
  Seq2SeqTrainer trainer(std::move(plan), out);
  TaskRunText text;
  text.eval_only = [&] {
    const auto r = trainer.evaluate();
    DS_CHECK(r.has_value(), "[ds_train] --eval_only: no evaluation examples");
    out.say(fmt::format("eval only: loss {:.6f} over {} examples{} ({:.1f}s)", r->loss, r->examples,
                        bleu_text(*r), r->seconds));
    show_generations(out.con, *r);
  };
  text.final_eval = [&](const fs::path& out_dir) {
    const auto& e = trainer.last_eval();
    if (!e) return;
    if (out.lead) write_eval_json(out_dir / "eval_results.json", *e);
    out.say(fmt::format("eval: loss {:.4f}{} -> {}", e->loss, bleu_text(*e),
                        (out_dir / "eval_results.json").string()));
  };
  text.export_line = [&](const std::string& dir) {
    return fmt::format("HF export:  {} ({})", dir,
                       seq2seq_export_note(trainer.plan().lora, o, data::has_tokenizer_files(dir)));
  };
  return run_task(out, trainer, trainer.plan(), text);
}

}  // namespace ds::train
