#pragma once
// A model described by the JSON config ds_train records in its checkpoints
// (client_state.ds_train.model), whatever its kind: a decoder LM (GPTConfig::to_json), an encoder
// sequence classifier (EncoderConfig::to_json) or an encoder-decoder (Seq2SeqConfig::to_json).
// What tools that start from a checkpoint rather than a running trainer need (ds_to_fp32):
//
//   const nlohmann::json cfg = *reader.model_config();          // or recorded_model_json(--model)
//   models::export_hf_recorded(cfg, shards.weights(), "out/hf", DType::f32);
//
// The kind is told by the config's "family": bert / roberta / deberta-v2 are encoder classifiers,
// bart / blenderbot / t5 encoder-decoders, anything else (or none) a decoder LM.
//
// Threading: plain functions, no shared state.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"

namespace ds::models {

enum class ModelKind { decoder, encoder_classifier, seq2seq };

ModelKind recorded_model_kind(const nlohmann::json& config);
const char* model_kind_name(ModelKind kind);  // "decoder", "encoder classifier", "encoder-decoder"

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
