#pragma once
// Model families: what one Hugging Face model_type means for models::GPT, in one entry each.
//
// A family reads and writes its config.json, names its tensors in a checkpoint file and says what
// its Hugging Face class can express. hf_io.cpp (import/export), the tools that resolve --model and
// serve go through this registry instead of branching on the type themselves:
//
//   const Family& f = family_for_model_type("glm4", "m/config.json");   // or family_of(config)
//   GPTConfig c = f.read_config(config_json, "glm4", "m/config.json");
//   for (const auto& [ours, t] : model.named_parameters()) f.place(c, ours);  // its file tensor
//
// One entry per family, in src/models/families/<name>.cpp; docs/architecture.md ("Adding a model
// family") walks through adding one, with GLM as the example. The entries share GPT's module
// layouts (nn::Layout gpt2 / llama and the features of GPTConfig); a family whose math needs a new
// feature adds it to GPTConfig / nn::BlockConfig and to gpt_features(), and lists it in its
// Family::features (the allow-list check_features applies).
//
// Thread safety: the registry is immutable after static initialisation; everything is const.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/gpt.h"
#include "ds/models/gpt_decoder.h"
#include "ds/models/incremental_decoder.h"

namespace ds::models {

// Where one of our parameters lives in a Hugging Face checkpoint: tensor `name`, of which it is
// part `part` of `parts` stacked along dim 0 (GLM's mlp.gate_up_proj = [gate_proj; up_proj],
// ChatGLM's query_key_value = [q; k; v]); parts == 1 for a tensor of its own. transposed: the file
// holds it (in, out) (GPT-2's Conv1D); only for a tensor of its own.
struct HFPlace {
  std::string name;
  int part = 0;
  int parts = 1;
  bool transposed = false;
};

struct Family {
  std::string name;                      // GPTConfig::family, e.g. "glm4"
  std::vector<std::string> model_types;  // config.json model_type values it reads ("glm4")
  std::string architecture;              // the class an export names ("Glm4ForCausalLM")
  nn::Layout layout = nn::Layout::llama;
  // The base model's module prefix in a *ForCausalLM file ("model.", "transformer."): optional on
  // import (a base-model file such as GPT2Model's has none), written on export.
  std::string prefix;
  // The family an export writes instead of this one ("" = this one): ChatGLM's remote-code layout
  // is exported as native glm, which transformers loads without trust_remote_code.
  std::string export_as;

  // config.json (model_type one of model_types) -> our config; throws "[hf_io] <source>: ..."
  // naming the field for anything it does not understand (an unknown field may change the math).
  GPTConfig (*read_config)(const nlohmann::json& j, const std::string& model_type,
                           const std::string& source) = nullptr;
  // Our config -> the class's config.json fields (without "ds_cpp", dtype and token ids).
  nlohmann::json (*write_config)(const GPTConfig& c) = nullptr;
  // The file tensor of our parameter `ours` (a whole-model name, "layers.0.mlp.gate_proj.weight").
  HFPlace (*place)(const GPTConfig& c, const std::string& ours) = nullptr;
  // File tensors that are buffers, not parameters (causal masks, rotary frequencies): skipped.
  bool (*is_buffer)(const std::string& file_name) = nullptr;
  // The GPTConfig features beyond the plain decoder that this family's class expresses (names from
  // gpt_features(): "qk_norm", "sandwich_norm", ...): an allow-list. A config using any other is
  // refused by check_features, which names the families that have it.
  std::vector<std::string> features;
  // Throws "[model] ..." when `c` breaks a rule of this family's own (qwen3 always has q/k norms,
  // GLM always rotates pairs); what other families' features it lacks is check_features' job.
  void (*check)(const GPTConfig& c) = nullptr;
  // The family's incremental decoder (serving, ds_generate): every decoder-only family here runs
  // GPT's modules, so the default is GPT's KV-cache decoder (ds/models/gpt_decoder.h); a family
  // whose blocks differ brings its own.
  std::unique_ptr<IncrementalDecoder> (*make_decoder)(std::shared_ptr<const GPT> model) =
      &make_gpt_decoder;
};

// A GPTConfig feature a family may express: its name (Family::features) and whether a config
// uses it.
struct GPTFeature {
  const char* name;
  bool (*used)(const GPTConfig& c);
};
// Every such feature, in GPTConfig's order.
const std::vector<GPTFeature>& gpt_features();
// Throws "[model] <feature> needs family <those that have it> (got <family>)" for the first feature
// `c` uses that f.features does not list. GPTConfig::validate calls it before f.check.
void check_features(const Family& f, const GPTConfig& c);

// Every family, in the order docs/models.md lists them.
const std::vector<const Family*>& all_families();
// The family reading config.json's model_type; throws "[hf_io] <source>: model_type ... is not
// supported (supported: ...)" naming the supported types (and why, for a known-unsupported one).
const Family& family_for_model_type(const std::string& model_type, const std::string& source);
// The family of a config (GPTConfig::resolved_family()); throws for an unknown name.
const Family& family_of(const GPTConfig& c);
// The family an export of c writes (family_of(c), or its export_as).
const Family& export_family_of(const GPTConfig& c);
// The incremental decoder of model's family (Family::make_decoder).
std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<const GPT> model);
// "gpt2, llama, ...": the model_type values read.
std::string supported_model_types();

namespace families {  // the entries (src/models/families/*.cpp)
extern const Family gpt2, llama, mistral, qwen2, qwen3, glm, glm4, chatglm, phi3, gemma2,
    gemma3_text;
}  // namespace families

}  // namespace ds::models
