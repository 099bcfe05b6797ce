#pragma once
// Hugging Face style weights for models::GPT: import (ds_train --init_from) and export.
//
// A Hugging Face model folder holds config.json and model.safetensors (or shards listed in
// model.safetensors.index.json), F32, BF16 or F16. Tensor names are those of GPT2LMHeadModel and
// of LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM:
//
//   gpt2:  [transformer.]wte.weight, [transformer.]h.{i}.attn.c_attn.weight, ...   (see gpt.h)
//   llama: [model.]embed_tokens.weight, [model.]layers.{i}.self_attn.q_proj.weight, ...,
//          lm_head.weight (absent when tied)
//
// The prefix is optional on import (GPT2Model files have none, GPT2LMHeadModel files have it).
// GPT-2's attention and MLP projections are Conv1D modules whose weights are stored (in, out);
// ours are nn::Linear, (out, in), so c_attn, c_proj and c_fc weights are transposed both ways.
// Buffers that old GPT-2 files carry (h.{i}.attn.bias / masked_bias: the causal mask) and a
// tied lm_head.weight are ignored on purpose; anything else that does not map to a parameter is
// an error, and so is every missing or mis-shaped tensor: one error lists them all.
//
//   auto cfg = models::read_hf_config("gpt2-folder");       // from config.json
//   auto model = std::make_shared<models::GPT>(*cfg, /*init=*/false);
//   models::load_hf_weights(*model, "gpt2-folder");
//   ...
//   models::export_hf(*model, "out/hf_model");              // config.json + model.safetensors
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/dtype.h"
#include "ds/models/gpt.h"

namespace ds::models {

// The GPTConfig a Hugging Face config.json describes (model_type gpt2, llama, mistral, qwen2 or
// qwen3; transformers 4.x or 5.x form: rope_theta/rope_scaling or rope_parameters, torch_dtype or
// dtype). Our exporter also writes our own config under "ds_cpp"; when present it is used as is (an
// exact round trip, including choices Hugging Face's classes cannot express, such as a bias-free
// GPT-2). Throws "[hf_io] <source>: ..." naming the field for another model type, a feature the
// family's class has that our models lack (dynamic rope; longrope outside phi3; partial rotary
// outside GLM and Phi-3; per-layer sliding windows outside Gemma; an activation other than silu /
// GPT-2's tanh GELU / Gemma's GeGLU, ...) and any key the family does not know: an unknown field
// may change the math. A Mistral sliding_window below max_position_embeddings
// lowers block_size to the window (no sequence then reaches past it). docs/models.md has the list.
GPTConfig hf_config_from_json(const nlohmann::json& j, const std::string& source = "config.json");
// The config.json our exporter writes: Hugging Face's fields plus "ds_cpp".
nlohmann::json hf_config_to_json(const GPTConfig& c);

// The config.json of `path` when it is a folder holding one; nullopt for a safetensors file or a
// folder without config.json.
std::optional<GPTConfig> read_hf_config(const std::filesystem::path& path);

// What a tool's --model names, resolved once for every tool (ds_train, ds_estimate, ds_to_fp32):
// a preset name (GPTConfig::preset_names()), a Hugging Face folder (its config.json, read through
// the family registry), or a model JSON file (GPTConfig::load). Throws "[<tool>] --model ..."
// listing the presets when it is none of them.
GPTConfig resolve_model_config(const std::string& name, const std::string& tool);

struct HFLoadReport {
  std::vector<std::string> files;    // safetensors files read
  int64_t tensors = 0;               // parameters filled
  int64_t transposed = 0;            // Conv1D weights transposed into (out, in)
  std::vector<std::string> ignored;  // file tensors skipped on purpose (mask buffers, tied head)
};

// Fills every parameter of `model` from `path`: a folder (model.safetensors, or the shards named
// by model.safetensors.index.json) or a single .safetensors file. Values are converted to the
// parameter dtype. Nothing is written unless every parameter has exactly one tensor of the right
// shape; otherwise throws "[hf_io] <file>: ..." listing every missing, extra and mis-shaped tensor.
HFLoadReport load_hf_weights(GPT& model, const std::filesystem::path& path);

// Writes dir/config.json (transformers 5 form: rope_parameters, dtype; the family's class from
// GPTConfig::resolved_family()) and dir/model.safetensors (tensors in `dtype`, metadata format
// "pt" as transformers requires), creating dir, so transformers' from_pretrained(dir) and
// load_hf_weights(dir) both read it.
// TODO(tokenizer export): write the tokenizer files beside them (ds/data/tokenizer.h).
void export_hf(const GPT& model, const std::filesystem::path& dir, DType dtype = DType::f32);
// The same from whole weights by our parameter names (e.g. ZeRO-3's gathered weights, where the
// model itself holds only this rank's pieces). Every parameter of `config`'s model must be there
// with its full shape.
void export_hf(const GPTConfig& config,
               const std::vector<std::pair<std::string, Tensor>>& named_weights,
               const std::filesystem::path& dir, DType dtype = DType::f32);

// The Hugging Face name of one of our parameter names ("h.0.attn.c_attn.weight" ->
// "transformer.h.0.attn.c_attn.weight"), and whether the tensor is stored transposed there.
std::string hf_name(nn::Layout layout, const std::string& ours);
bool hf_transposed(nn::Layout layout, const std::string& ours);

}  // namespace ds::models
