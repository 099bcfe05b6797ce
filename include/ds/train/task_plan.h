#pragma once
// The planning shared by the task trainers (task_trainer.h): what every task run decides the same
// way (the data folder and its val split, the DeepSpeed config and run length, the options no task
// model takes), kept in a TaskPlan that each task's plan struct extends (ClassifierPlan,
// Seq2SeqPlan). A task's plan_<task>() opens its set with open_task_splits, resolves its model,
// and calls resolve_task_run; what differs (the model, the set's lengths, the task's own
// refusals) stays in the task's plan function.
//
// Everything here reads files only (collective-free: every rank plans the same run) and throws
// "[ds_train] ..." / "[config] ..." naming the option or file.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/train/options.h"
#include "ds/train/plan.h"

namespace ds::train {

// What every task run plans (PlanBase, plan.h, with the task's names); a task's plan struct
// derives from it and adds its sets and model.
struct TaskPlan : PlanBase {
  int64_t train_examples = 0;  // N of the train split
  int64_t eval_examples = 0;   // per evaluation: all of val, or eval_batches x B

  bool has_val() const { return !val_from.empty(); }
};

// Throws "[ds_train] OPTION does not apply to <names.models> (WHY); remove it" when `given`.
void refuse_option(const TaskNames& names, bool given, const char* option, const char* why);

// The refusals every task run makes: the sample options (`sample_why` says why), tensor and
// pipeline parallelism, --skip_memory_check.
void refuse_common_options(const TaskNames& names, const Options& o, const Given& g,
                           const char* sample_why);

// The val split's folder: --eval_data, else train_dir when it has a val split; nullopt: none.
std::optional<std::filesystem::path> val_split_dir(const Options& o,
                                                   const std::filesystem::path& train_dir);

// Opens spec.train_data's train split and the val split (val_split_dir) as `Set`s (a set class
// with open_split and size()), filling train_dir, val_from and train_examples.
template <class Set>
void open_task_splits(TaskPlan& p, std::shared_ptr<const Set>* train,
                      std::shared_ptr<const Set>* val) {
  p.train_dir = p.spec.train_data;
  *train = std::make_shared<Set>(Set::open_split(p.train_dir, "train"));
  if (const auto dir = val_split_dir(p.spec, p.train_dir)) {
    try {
      *val = std::make_shared<Set>(Set::open_split(*dir, "val"));
    } catch (const Error& e) {
      if (p.spec.eval_data.empty()) throw;
      DS_THROW("[ds_train] --eval_data {}: {}", p.spec.eval_data, e.what());
    }
    p.val_from = dir->string();
  }
  p.train_examples = (*train)->size();
}

// --tokenizer, checked at start-up (a run must not find out at its first evaluation or its export):
// a folder load_tokenizer reads whose vocabulary is the one the data was prepared with
// (`data_vocab` ids) and fits the model's. Returns the folder; "" when --tokenizer is not given.
std::filesystem::path checked_tokenizer_option(const Options& o, int64_t data_vocab,
                                               int64_t model_vocab);

// The JSON file --model names: the argument itself, or <folder>/config.json for a folder (a
// Hugging Face model folder, as the decoder path takes it).
std::string model_json_file(const std::string& model);
// What messages call --model: a file's stem ("bert_small"), a folder's name ("deberta-v3-base").
std::string model_display_name(const std::string& model);

// --model FILE read as a JSON object (a Hugging Face config.json or the task's config form).
nlohmann::json read_model_json(const std::string& file);

// The DeepSpeed config and run length (resolve_run_config) for a task model `width` wide and
// `depth` layers deep, over p.train_examples examples of p.tokens_per_example tokens; tensor or
// pipeline parallelism in the config is refused by name. Fills p.device (plan_device), p.run,
// world_size, data_parallel and eval_examples (`val_examples`: the val split's size, 0 without
// one).
void resolve_task_run(TaskPlan& p, int64_t width, int64_t depth, int64_t val_examples,
                      const char* builtin_config);

}  // namespace ds::train
