// ds_to_fp32: DeepSpeed's zero_to_fp32 for our checkpoints. Consolidates the fp32 master weights of
// a checkpoint written by any world size, ZeRO stage and tensor-parallel size, offline, into one
// safetensors file (our parameter names) or a Hugging Face folder (config.json, model.safetensors,
// tokenizer files) of any model kind ds_train trains: a decoder LM, an encoder classifier
// (BERT, RoBERTa, DeBERTa-v2) or an encoder-decoder (BART, BlenderBot, T5).
//
//   ds_to_fp32 out/run model.safetensors                    ('latest' of the run folder, fp32)
//   ds_to_fp32 out/run/global_step200 model.safetensors --dtype bf16
//   ds_to_fp32 out/run hf_model --tokenizer .cache/data/gpt2 (a folder: an HF export)
//
// Reading and its checks: include/ds/runtime/consolidate.h. A single file is streamed parameter by
// parameter (peak RAM: a few MiB of buffers); an HF folder needs the whole model in fp32 in RAM
// (the exporter takes whole named weights). Outputs appear atomically: a file through a temporary
// name, a folder built as a hidden sibling and renamed into place.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/memory_info.h"
#include "ds/models/encoder_io.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/recorded_model.h"
#include "ds/nn/lora.h"
#include "ds/runtime/consolidate.h"
#include "ds/train/outputs.h"

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

// The output must not land on the checkpoint being read, whose files are mapped while it is written
// (`ds_to_fp32 ckpt ckpt/global_step6/mp_rank_00_model_states.safetensors` replaced a shard with
// the consolidated weights and exited 0): nothing inside a global_step* folder of the checkpoint
// and not its `latest` file. Elsewhere, an existing file is replaced only with --overwrite. Paths
// are compared after resolving `..` and symbolic links.
void check_output(const std::string& output, const fs::path& tag_folder, bool overwrite) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output), ec);
  const fs::path tag = fs::weakly_canonical(fs::absolute(tag_folder), ec);
  const fs::path root = tag.parent_path();
  auto inside = [](const fs::path& p, const fs::path& dir) {
    const fs::path rel = p.lexically_relative(dir);
    return !rel.empty() && *rel.begin() != "..";
  };
  std::vector<fs::path> guarded = {tag};
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("global_step", 0) == 0)
      guarded.push_back(fs::weakly_canonical(e.path(), ec));
  for (const auto& g : guarded)
    DS_CHECK(
        !inside(out, g) && !inside(g, out),
        "[ds_to_fp32] the output {} is inside the checkpoint folder {} (or holds it): it would "
        "overwrite the checkpoint it reads. Write it elsewhere, e.g. {}",
        output, g.string(), (root / "consolidated.safetensors").string());
  DS_CHECK(out != root / "latest",
           "[ds_to_fp32] the output {} is the checkpoint's 'latest' file; write it elsewhere",
           output);
  DS_CHECK(overwrite || fs::is_directory(out, ec) || !fs::exists(out, ec),
           "[ds_to_fp32] {} exists; choose another output, or give --overwrite to replace it",
           output);
}

// The options as given.
struct Args {
  std::string input, output, dtype_str = "fp32", tag, tokenizer, model;
  bool overwrite = false, hf = false;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("checkpoint", a.input,
                 "A checkpoint folder (its 'latest' tag is used) or one of its global_step<N> "
                 "folders")
      ->required();
  app.add_option("output", a.output,
                 "file.safetensors (our parameter names), or a folder: an HF export")
      ->required();
  app.add_option("--dtype", a.dtype_str,
                 "Output dtype: fp32 (exact master weights), bf16 or fp16 "
                 "(rounded to nearest even)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--hf", a.hf,
               "Write an HF folder (the default when output does not end in "
               ".safetensors)");
  app.add_flag("--overwrite", a.overwrite,
               "Replace an existing output file or non-empty output folder (refused otherwise)");
  app.add_option("--tag", a.tag, "The checkpoint tag (global_step<N>) instead of 'latest'");
  app.add_option("--tokenizer", a.tokenizer,
                 "HF export: the tokenizer folder to write beside the weights (default: one found "
                 "in the checkpoint folder or its hf_model export)");
  app.add_option("--model", a.model,
                 "HF export: the model (preset, model JSON or HF folder) when the checkpoint does "
                 "not record it (ds_train's checkpoints do)");
}

void print_checkpoint(const ds::runtime::CheckpointShards& ck) {
  fmt::print(
      "{}: step {}, {} training, ZeRO stage {} on {} data-parallel rank{}{}; {} parameters ({} "
      "elements) from {} shard{}\n",
      ck.folder().string(), ck.global_steps(), ds::dtype_name(ck.training_dtype()),
      ck.zero_stage(), ck.world_size(), ck.world_size() == 1 ? "" : "s",
      ck.tensor_parallel() > 1 || ck.pipeline_parallel() > 1
          ? fmt::format(" x tp {} x pp {}", ck.tensor_parallel(), ck.pipeline_parallel())
          : "",
      ck.parameters().size(), ck.numel(), ck.shard_files().size(),
      ck.shard_files().size() == 1 ? "" : "s");
}

// What an earlier ds_to_fp32 of this output, killed mid-write, left beside it.
void remove_earlier_temporaries(const std::string& output) {
  const fs::path out = fs::path(output).lexically_normal();
  const fs::path name = out.has_filename() ? out.filename() : out.parent_path().filename();
  const fs::path dir = out.has_filename() ? out.parent_path() : out.parent_path().parent_path();
  for (const fs::path& p : ds::remove_dead_temporaries(dir.empty() ? "." : dir, name.string()))
    fmt::print("removed {} (left by an interrupted earlier ds_to_fp32)\n", p.string());
}

// The model's config for an HF export: the checkpoint's record (ds_train's) or --model.
nlohmann::json model_config(const ds::runtime::CheckpointShards& ck, const std::string& model) {
  if (!model.empty()) return ds::models::recorded_model_json(model, "ds_to_fp32");
  DS_CHECK(ck.model_config().has_value(),
           "[ds_to_fp32] {} does not record the model's config (client_state.ds_train.model: "
           "it was not saved by ds_train); give --model (a preset, a model JSON file or an HF "
           "folder), or write one .safetensors file instead",
           ck.folder().string());
  return *ck.model_config();
}

// An HF export holds the whole model in fp32, and a LoRA checkpoint's master weights cover the
// trainable parameters only: refuse both before reading.
void check_hf_export(const ds::runtime::CheckpointShards& ck, const nlohmann::json& cfg,
                     ds::models::ModelKind kind, const std::string& what) {
  if (kind == ds::models::ModelKind::decoder) {
    ds::models::check_model_fits(ds::models::GPTConfig::from_json(cfg), ds::DType::f32,
                                 ds::available_memory_bytes(), what);
  } else {
    // The weights once as read and once in the model the exporter writes from.
    const uint64_t need = static_cast<uint64_t>(ck.numel()) * 4 * 2;
    DS_CHECK(need <= ds::available_memory_bytes(),
             "[ds_to_fp32] {}: the HF export of this {} model needs {:.1f} GiB of memory, {:.1f} "
             "GiB are available; write a .safetensors file instead (read parameter by "
             "parameter)",
             what, ds::models::model_kind_name(kind), static_cast<double>(need) / (1 << 30),
             static_cast<double>(ds::available_memory_bytes()) / (1 << 30));
  }
  for (const auto& p : ck.parameters())
    DS_CHECK(!ds::nn::is_lora_parameter(p.name),
             "[ds_to_fp32] {} is a LoRA checkpoint ({}): its fp32 master weights hold the "
             "trainable parameters only, not the frozen base, so no HF folder can be made from "
             "them; write a .safetensors file (the trainable parameters), or export the model "
             "from ds_train (--resume_from_checkpoint with --merge_lora; docs/finetuning.md)",
             ck.folder().string(), p.name);
}

// The HF folder's contents (weights, label names, tokenizer) written into `tmp`.
void write_hf_folder(const ds::runtime::CheckpointShards& ck, const nlohmann::json& cfg,
                     ds::models::ModelKind kind, const fs::path& tmp, ds::DType dtype,
                     const std::string& tokenizer) {
  ds::models::export_hf_recorded(cfg, ck.weights(ds::DType::f32), tmp, dtype, ck.buffers());
  // A classifier's label names (the run's id2label) are in the checkpoint, not the config.
  if (kind == ds::models::ModelKind::encoder_classifier && !ck.label_names().empty())
    ds::models::write_hf_label_names(tmp, ck.label_names());
  if (kind == ds::models::ModelKind::seq2seq && ck.buffers().empty() &&
      cfg.value("family", std::string()) != "t5")
    fmt::print(
        "note: {} predates model_buffers.safetensors: final_logits_bias is written as zeros "
        "(transformers' initial value; a bias loaded with --init_from is not in this "
        "checkpoint)\n",
        ck.folder().string());
  std::vector<fs::path> sources;
  if (!tokenizer.empty()) {
    sources.push_back(tokenizer);
  } else {
    const fs::path run = ck.folder().parent_path();
    sources = {run, run / "hf_model", run / "tokenizer"};
  }
  const std::string note =
      ds::train::export_tokenizer_beside(tmp, sources, ds::models::recorded_vocab_size(cfg));
  DS_CHECK(tokenizer.empty() || note.rfind("tokenizer (", 0) == 0,
           "[ds_to_fp32] --tokenizer {}: {}", tokenizer, note);
  fmt::print("{}\n", note);
}

// An HF folder at a.output, built as a hidden sibling and renamed into place: the old folder
// (empty, or replaced under --overwrite) steps aside first and goes only after, so a crash leaves
// one of the two complete.
void export_hf(const ds::runtime::CheckpointShards& ck, const Args& a, ds::DType dtype) {
  const nlohmann::json cfg = model_config(ck, a.model);
  const ds::models::ModelKind kind = ds::models::recorded_model_kind(cfg);
  check_hf_export(ck, cfg, kind,
                  a.model.empty() ? ck.folder().string() + " (its recorded model)" : a.model);
  const fs::path out(a.output);
  std::error_code ec;
  DS_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec),
           "[ds_to_fp32] {} exists and is not a folder; choose another output", out.string());
  DS_CHECK(a.overwrite || !fs::exists(out, ec) || fs::is_empty(out, ec),
           "[ds_to_fp32] {} exists and is not an empty folder; choose another output, or give "
           "--overwrite to replace it",
           out.string());
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent);
  const long pid = static_cast<long>(::getpid());
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", out.filename().string(), pid);
  fs::remove_all(tmp, ec);
  try {
    write_hf_folder(ck, cfg, kind, tmp, dtype, a.tokenizer);
    const fs::path old = parent / fmt::format(".{}.old-{}", out.filename().string(), pid);
    const bool had_old = fs::exists(out, ec);
    if (had_old) fs::rename(out, old);
    fs::rename(tmp, out);
    ds::fsync_dir(parent);
    if (had_old) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

int run(const Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const ds::DType dtype = a.dtype_str == "bf16"   ? ds::DType::bf16
                          : a.dtype_str == "fp16" ? ds::DType::f16
                                                  : ds::DType::f32;
  const bool to_folder = a.hf || !ends_with(a.output, ".safetensors");
  DS_CHECK(!(a.hf && ends_with(a.output, ".safetensors")),
           "[ds_to_fp32] --hf writes a folder, but the output {} ends in .safetensors; name a "
           "folder, or drop --hf for one file",
           a.output);
  DS_CHECK(to_folder || (a.tokenizer.empty() && a.model.empty()),
           "[ds_to_fp32] --tokenizer and --model are for an HF folder output; {} is one "
           "safetensors file",
           a.output);
  ds::runtime::CheckpointShards ck(a.input, a.tag);
  print_checkpoint(ck);
  remove_earlier_temporaries(a.output);
  check_output(a.output, ck.folder(), a.overwrite);
  if (to_folder) {
    export_hf(ck, a, dtype);
    fmt::print("wrote {} (HF folder, {}) in {:.1f}s\n", a.output, a.dtype_str,
               seconds_since(t0));
    return 0;
  }
  const fs::path out(a.output);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  const uint64_t bytes = ck.write_safetensors(out, dtype);
  fmt::print("wrote {} ({}, {:.1f} MiB) in {:.1f}s\n", out.string(), a.dtype_str,
             static_cast<double>(bytes) / (1 << 20), seconds_since(t0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Consolidates a deepspeed.cpp checkpoint (any world size, ZeRO stage and tensor-parallel "
      "size) into one "
      "safetensors file of fp32 master weights by parameter name, or into a Hugging Face folder "
      "(DeepSpeed's zero_to_fp32). Reads only the master weights, parameter by parameter.",
      "ds_to_fp32"};
  Args a;
  add_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
