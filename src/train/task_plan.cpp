#include "ds/train/task_plan.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/config/config.h"
#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

void refuse_option(const TaskNames& names, bool given, const char* option, const char* why) {
  DS_CHECK(!given, "[ds_train] {} does not apply to {} ({}); remove it", option, names.models, why);
}

void refuse_common_options(const TaskNames& n, const Options& o, const Given& g,
                           const char* sample_why) {
  refuse_option(n, !o.sample_prompt.empty(), "--sample_prompt", sample_why);
  refuse_option(n, g.sample_tokens, "--sample_tokens", sample_why);
  refuse_option(n, g.sample_top_k, "--sample_top_k", sample_why);
  refuse_option(n, o.tensor_parallel_size > 1, "--tensor_parallel_size",
                "tensor parallelism is implemented for decoder models only");
  refuse_option(n, o.pipeline_parallel_size > 1, "--pipeline_parallel_size",
                "pipeline parallelism is implemented for decoder models only");
  refuse_option(n, o.expert_parallel_size > 1, "--expert_parallel_size",
                "expert parallelism needs a mixture-of-experts decoder (mixtral, qwen3_moe)");
}

std::optional<fs::path> val_split_dir(const Options& o, const fs::path& train_dir) {
  if (!o.eval_data.empty()) return fs::path(o.eval_data);
  if (has_split(train_dir, "val")) return train_dir;
  return std::nullopt;
}

fs::path checked_tokenizer_option(const Options& o, int64_t data_vocab, int64_t model_vocab) {
  if (o.tokenizer.empty()) return {};
  const fs::path dir(o.tokenizer);
  std::error_code ec;
  DS_CHECK(fs::is_directory(dir, ec) && data::has_tokenizer_files(dir),
           "[ds_train] --tokenizer {}: {}; give the folder of the tokenizer the data was prepared "
           "with (tokenizer.json, tokenizer.model, vocab.txt or vocab.json + merges.txt)",
           o.tokenizer, fs::exists(dir, ec) ? "holds no tokenizer files" : "no such folder");
  std::unique_ptr<data::TextTokenizer> tok;
  try {
    tok = data::load_tokenizer(dir);
  } catch (const Error& e) {
    DS_THROW("[ds_train] --tokenizer {}: {}", o.tokenizer, e.what());
  }
  DS_CHECK(tok->vocab_size() == data_vocab && tok->vocab_size() <= model_vocab,
           "[ds_train] --tokenizer {}: {} ids, but the data was prepared with a tokenizer of {} "
           "ids (and the model has {}): give the tokenizer the data was prepared with",
           o.tokenizer, tok->vocab_size(), data_vocab, model_vocab);
  return dir;
}

std::string model_json_file(const std::string& model) {
  std::error_code ec;
  return fs::is_directory(model, ec) ? (fs::path(model) / "config.json").string() : model;
}

std::string model_display_name(const std::string& model) {
  std::error_code ec;
  fs::path p = fs::path(model).lexically_normal();
  if (!fs::is_directory(p, ec)) return p.stem().string();
  if (p.filename().empty()) p = p.parent_path();  // "folder/"
  return p.filename().string();
}

json read_model_json(const std::string& file) {
  json j;
  try {
    j = json::parse(std::ifstream(file));
  } catch (const json::exception& e) {
    DS_THROW("[ds_train] --model {}: not valid JSON ({})", file, e.what());
  }
  DS_CHECK(j.is_object(), "[ds_train] --model {}: not a JSON object", file);
  return j;
}

void resolve_task_run(TaskPlan& p, int64_t width, int64_t depth, int64_t val_examples,
                      const char* builtin_config) {
  const Options& o = p.spec;
  const Given& g = p.given;
  p.device = plan_device(o);  // TaskTrainer::start moves the model there
  {
    // Model parallelism in the config would otherwise first meet the rank-count check.
    std::string source = "built-in default (configs/ds_demo.json)";
    const json raw =
        g.deepspeed ? config::load_config_json(o.deepspeed, &source)
                    : config::load_config_json(strip_leading_comments(builtin_config), &source);
    const config::ParallelSizes sizes = config::read_parallel_sizes(raw, source);
    DS_CHECK(sizes.tensor_parallel.size <= 1 && sizes.pipeline.stages <= 1,
             "[ds_train] {}: tensor_parallel.autotp_size {} / pipeline.stages {} do not apply to "
             "{} (tensor and pipeline parallelism are implemented for decoder models only); "
             "remove them from the config",
             g.deepspeed ? o.deepspeed : source, sizes.tensor_parallel.size, sizes.pipeline.stages,
             p.names.models);
  }
  // resolve_run_config reads the model's width ("auto" sizes) and depth from a GPTConfig.
  models::GPTConfig shape;
  shape.n_embd = width;
  shape.n_layer = depth;
  p.run = resolve_run_config(o, g, shape, static_cast<uint64_t>(p.train_examples),
                             p.tokens_per_example, builtin_config);
  DS_CHECK(p.run.tensor_parallel == 1 && p.run.pipeline_parallel == 1,
           "[ds_train] {}: tensor_parallel.autotp_size {} / pipeline.stages {} do not apply to "
           "{} (decoder models only); remove them from the config",
           p.run.source, p.run.tensor_parallel, p.run.pipeline_parallel, p.names.models);
  p.world_size = comm::world()->size();
  p.data_parallel = p.run.ctx.world_size;
  p.eval_examples = g.eval_batches
                        ? std::min<int64_t>(val_examples, o.eval_batches * p.micro_batch())
                        : val_examples;
}

}  // namespace ds::train
