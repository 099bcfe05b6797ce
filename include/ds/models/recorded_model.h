#pragma once
// A model described by the JSON config ds_train records in its checkpoints
// (client_state.ds_train.model), whatever its kind: a decoder LM (GPTConfig::to_json), an encoder
// sequence classifier (EncoderConfig::to_json) or an encoder-decoder (Seq2SeqConfig::to_json).
// What tools that start from a checkpoint rather than a running trainer need (ds_to_fp32):
//
//   const nlohmann::json cfg = *reader.model_config();          // or recorded_model_json(--model)
//   models::export_hf_recorded(cfg, shards.weights(), "out/hf", DType::f32);
//
// The kind is told by the config's "family" through the family registry (ds/models/family.h).
//
// Threading: plain functions, no shared state.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"
#include "ds/models/family.h"

namespace ds::models {

// The kind of the model a recorded config describes: its family's (family.h), a decoder LM when
// it names none.
ModelKind recorded_model_kind(const nlohmann::json& config);

// The family of the Hugging Face folder `dir`: config.json's model_type through the registry, of
// any kind. nullptr for a folder without config.json, without a model_type (old GPT-2 configs:
// the decoder reader decides) or with one no family reads (the kind's reader says why). Throws
// "[hf_io] <file>: not valid JSON" for a damaged config.json.
const Family* hf_folder_family(const std::filesystem::path& dir);

// The recorded form of `name`: a Hugging Face folder of any supported kind (config.json's
// model_type decides), or what GPTConfig's resolve_model_config takes (a preset, a model JSON
// file). Errors name `tool` and `name`.
nlohmann::json recorded_model_json(const std::string& name, const std::string& tool);

// The vocabulary size the config records (for the tokenizer written beside an export).
int64_t recorded_vocab_size(const nlohmann::json& config);

// Writes an HF folder (config.json + model.safetensors in `dtype`) for the model `config`
// describes from whole weights by our parameter names, as the kind's exporter writes it for a
// live model (export_hf, export_hf_encoder, export_hf_seq2seq). Every parameter of the model must
// be there once with its full shape, and nothing else: errors name the missing or unknown
// parameter. named_buffers (a checkpoint's model_buffers.safetensors: BART's final_logits_bias)
// fill the model's buffers of those names; a buffer not given keeps its initial value (zeros).
void export_hf_recorded(const nlohmann::json& config,
                        const std::vector<std::pair<std::string, Tensor>>& named_weights,
                        const std::filesystem::path& dir, DType dtype = DType::f32,
                        const std::vector<std::pair<std::string, Tensor>>& named_buffers = {});

}  // namespace ds::models
