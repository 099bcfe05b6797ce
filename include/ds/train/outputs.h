#pragma once
// What ds_train leaves behind at the end of a run besides checkpoints: memory.json, the loss
// curve and a generated text sample (docs/training.md, "Outputs").
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ds/data/tokenizer.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/monitor.h"
#include "ds/zero/memory_model.h"

namespace ds::train {

// One rank's memory: model-state bytes by kind (Engine::memory_budget()) and measured peaks.
struct RankMemory {
  int rank = 0;
  runtime::MemoryBudget mem;
  int64_t peak_tensor_bytes = 0;  // the caching allocator's peak of bytes in use
  int64_t peak_rss_bytes = 0;     // VmHWM
};

// Collective over the whole job (comm::world(): with tensor or pipeline parallelism more ranks
// than the engine's data group): every rank's entry, in rank order, on every rank.
std::vector<RankMemory> gather_memory(runtime::Engine& engine, const RankMemory& mine);

// The ZeRO paper's model-state bytes per rank for the engine's stage, precision and optimizer
// (zero/memory_model.h, docs/zero.md), over the padded flat buffer of trainable parameters, plus
// the frozen parameters' bytes under params (LoRA's base, whole on every rank).
zero::ModelStateBytes paper_model_state_bytes(runtime::Engine& engine);

// The start-up table: one row per rank (params, grads, master, optimizer states, total) and the
// paper's prediction; `out` receives the lines.
void print_memory_table(const std::vector<RankMemory>& ranks, const zero::ModelStateBytes& paper,
                        const std::function<void(const std::string&)>& out);

// memory.json, written by rank 0 for the whole job (docs/training.md):
// {"world_size", "zero_stage", "params_dtype", "grads_dtype", "activations_estimate_bytes",
//  "paper_model_state_bytes_per_rank": {...}, "ranks": [{"rank", "params_bytes", "grads_bytes",
//  "master_weights_bytes", "optimizer_states_bytes", "model_state_bytes",
//  "gradient_scratch_bytes", "peak_tensor_bytes", "peak_rss_bytes"}, ...]}
void write_memory_json(const std::filesystem::path& file, runtime::Engine& engine,
                       const std::vector<RankMemory>& ranks, int64_t activations_estimate);

// loss.svg from the monitor's train and eval loss files (the step column, in samples, divided by
// the global batch gives optimizer steps): per-step train loss, its moving average, eval loss and
// dashed lines at the train unigram entropy and at the eval baseline (NaN: none).
void write_loss_chart(const std::filesystem::path& svg, const runtime::CsvMonitor& monitor,
                      int64_t global_batch, int64_t seq_len, const std::string& title,
                      double unigram_entropy, double eval_baseline);

// prompt + max_tokens generated tokens (top-k, seeded), decoded. The context starts with
// <|endoftext|>, as every document does in a ds_prepare corpus.
// The tokenizer files beside an HF export (export_dir holds config.json and the weights), so
// transformers' AutoTokenizer.from_pretrained(export_dir) loads: from the first of `sources` that
// holds tokenizer files (the --init_from folder, then the tokenizer the data was prepared with);
// config.json's bos/eos/pad ids follow it. Returns one line for the log saying what was written,
// or why nothing was (no tokenizer found, or one larger than the model's vocab_size).
std::string export_tokenizer_beside(const std::filesystem::path& export_dir,
                                    const std::vector<std::filesystem::path>& sources,
                                    int64_t model_vocab_size);

std::string generate_sample(models::GPT& model, const data::Tokenizer& tok,
                            const std::string& prompt, int64_t max_tokens, int64_t top_k,
                            uint64_t seed);

// The chat template an SFT set was rendered with (meta.json "sft"."template"), or "" for a plain
// token set.
std::string sft_template_of(const std::filesystem::path& data_dir);

// Writes template `name`'s Jinja text (data::ChatTemplate::by_name) as "chat_template" into
// export_dir/tokenizer_config.json (created when missing). Returns the line to print.
std::string set_export_chat_template(const std::filesystem::path& export_dir,
                                     const std::string& name);

}  // namespace ds::train
