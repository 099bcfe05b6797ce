#include "classify_run.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/text_tokenizer.h"
#include "ds/train/classifier.h"
#include "task_run.h"

namespace ds::train {

namespace fs = std::filesystem;

namespace {

// The task run's console plus the classifier's evaluations (lines and csv_monitor rows).
class ClassifierConsole : public TaskConsole<ClassifierObserver> {
 public:
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
  ClassifierPlan plan = plan_classifier(o, g, builtin_config);
  start_task_log(out, plan,
                 fmt::format("encoder classifier run: --train_data {} is a classification set",
                             plan.train_dir.string()));
  ClassifierTrainer trainer(std::move(plan), out);
  TaskRunText text;
  text.eval_only = [&] {
    const auto r = trainer.evaluate();
    DS_CHECK(r.has_value(), "[ds_train] --eval_only: no evaluation examples");
    out.say(
        fmt::format("eval only: loss {:.6f}, accuracy {:.4f}, f1 {:.4f} ({}) over {} "
                    "examples ({:.1f}s)",
                    r->loss, r->scores.accuracy, r->scores.f1, r->scores.f1_kind,
                    r->scores.examples, r->seconds));
  };
  text.final_eval = [&](const fs::path& out_dir) {
    const auto& e = trainer.last_eval();
    if (!e) return;
    if (out.lead) write_eval_json(out_dir / "eval_results.json", *e);
    out.say(fmt::format("eval: loss {:.4f}, accuracy {:.4f}, f1 {:.4f} ({}) -> {}", e->loss,
                        e->scores.accuracy, e->scores.f1, e->scores.f1_kind,
                        (out_dir / "eval_results.json").string()));
  };
  text.export_line = [&](const std::string& dir) {
    const auto& lora = trainer.plan().lora;
    if (lora && lora->only_optimize_lora && !o.merge_lora)
      return fmt::format(
          "HF export:  {} (PEFT SEQ_CLS adapter: adapter_config.json + adapter_model.safetensors; "
          "PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), "
          "dir) reads it)",
          dir);
    return fmt::format(
        "HF export:  {} (config.json + model.safetensors{}{}; "
        "AutoModelForSequenceClassification.from_pretrained reads it)",
        dir, data::has_tokenizer_files(dir) ? " + tokenizer" : " (no tokenizer)",
        lora ? ", LoRA merged" : "");
  };
  return run_task(out, trainer, trainer.plan(), text);
}

}  // namespace ds::train
