#pragma once
// What ds_train leaves behind at the end of a run besides checkpoints: memory.json, the loss
// curve and a generated text sample (docs/training.md, "Outputs").
#include <cstdint>
#include <filesystem>
#include <string>

#include "ds/data/tokenizer.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/monitor.h"

namespace ds::train {

// {"rank", "world_size", "params_bytes", "grads_bytes", "master_weights_bytes",
//  "optimizer_states_bytes", "activations_estimate_bytes", "peak_tensor_bytes", "peak_rss_bytes"}
void write_memory_json(const std::filesystem::path& file, const runtime::MemoryBudget& mem,
                       int rank, int world_size, int64_t activations_estimate,
                       int64_t peak_tensor_bytes, int64_t peak_rss_bytes);

// loss.svg from the monitor's train and eval loss files (the step column, in samples, divided by
// the global batch gives optimizer steps): per-step train loss, its moving average, eval loss and
// dashed lines at the train unigram entropy and at the eval baseline (NaN: none).
void write_loss_chart(const std::filesystem::path& svg, const runtime::CsvMonitor& monitor,
                      int64_t global_batch, int64_t seq_len, const std::string& title,
                      double unigram_entropy, double eval_baseline);

// prompt + max_tokens generated tokens (top-k, seeded), decoded. The context starts with
// <|endoftext|>, as every document does in a ds_prepare corpus.
std::string generate_sample(models::GPT& model, const data::Tokenizer& tok,
                            const std::string& prompt, int64_t max_tokens, int64_t top_k,
                            uint64_t seed);

}  // namespace ds::train
