#pragma once
// Model families: what one Hugging Face model_type means for deepspeed.cpp, in one entry each,
// for every kind of model we train: decoder LMs (models::GPT), encoder sequence classifiers
// (models::SequenceClassifier: EncoderClassifier, DebertaClassifier) and encoder-decoders
// (models::Seq2Seq).
//
// An entry reads and writes its config.json, places each of our parameters in a checkpoint file
// (HFPlace: one import and one export path for every kind, src/models/hf_weights.h), names its
// PEFT LoRA targets, lists the config features it can express, and builds its model (a decoder's
// incremental decoder for serving; an encoder classifier's class). The importers, exporters, tools
// that resolve --model / --init_from / a serve folder, LoRA and ds_to_fp32 go through this registry
// instead of branching on the type themselves:
//
//   const Family* f = find_family("roberta");          // any kind; nullptr when none reads it
//   switch (f->kind) { case ModelKind::encoder_classifier: ... }
//   const Family& d = family_for_model_type("glm4", "m/config.json");   // throws, naming the types
//   GPTConfig c = d.decoder.read_config(config_json, "glm4", "m/config.json");
//   for (const auto& [ours, t] : model.named_parameters()) d.decoder.place(c, ours);
//
// One entry per family, in src/models/families/<name>.cpp, listed once in all_families()
// (src/models/family.cpp); docs/architecture.md ("Adding a model family") walks through adding one.
// The common fields say what every kind has; the kind's part (decoder / encoder / seq2seq) holds
// the functions typed on its config, and only the part of the entry's kind is filled.
//
// Thread safety: the registry is immutable after static initialisation; everything is const.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/gpt.h"
#include "ds/models/gpt_decoder.h"
#include "ds/models/incremental_decoder.h"
#include "ds/models/seq2seq_decoder.h"

namespace ds::models {

struct EncoderConfig;
class SequenceClassifier;

// The kinds of model a family can be. A checkpoint's recorded config tells its kind by its family
// (recorded_model.h).
enum class ModelKind { decoder, encoder_classifier, seq2seq };
const char* model_kind_name(ModelKind kind);  // "decoder", "encoder classifier", "encoder-decoder"

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

// One file tensor of an older checkpoint layout that holds a piece of one of our parameters
// (DecoderParts::legacy_pieces): its full name and shape.
struct HFPiece {
  std::string name;
  Shape shape;
};

// A decoder LM family's functions (models::GPT, GPTConfig).
struct DecoderParts {
  nn::Layout layout = nn::Layout::llama;  // GPT's module layout (gpt2 / llama)
  // config.json (model_type one of model_types) -> our config; throws "[hf_io] <source>: ..."
  // naming the field for anything it does not understand (an unknown field may change the math).
  GPTConfig (*read_config)(const nlohmann::json& j, const std::string& model_type,
                           const std::string& source) = nullptr;
  // Our config -> the class's config.json fields (without "ds_cpp", dtype and token ids).
  nlohmann::json (*write_config)(const GPTConfig& c) = nullptr;
  // The file tensor of our parameter `ours` (a whole-model name, "layers.0.mlp.gate_proj.weight").
  HFPlace (*place)(const GPTConfig& c, const std::string& ours) = nullptr;
  // An older file layout, read on import only (never written): our parameter `ours` is the
  // concatenation, flattened in order, of these file tensors (Mixtral 4.x: experts.gate_up_proj
  // (E, 2I, C) from block_sparse_moe.experts.{j}.w1 and w3, (I, C) each). Empty: `place` alone.
  // Used for a parameter whose place's tensor the file lacks while it holds the first piece.
  std::vector<HFPiece> (*legacy_pieces)(const GPTConfig& c, const std::string& ours) = nullptr;
  // Throws "[model] ..." when `c` breaks a rule of this family's own (qwen3 always has q/k norms,
  // GLM always rotates pairs); what other families' features it lacks is check_features' job.
  void (*check)(const GPTConfig& c) = nullptr;
  // The family's incremental decoder (serving, ds_generate): every decoder-only family here runs
  // GPT's modules, so the default is GPT's KV-cache decoder (ds/models/gpt_decoder.h); a family
  // whose blocks differ brings its own.
  std::unique_ptr<IncrementalDecoder> (*make_decoder)(std::shared_ptr<const GPT> model) =
      &make_gpt_decoder;
};

// An encoder classifier family's functions (models::SequenceClassifier, EncoderConfig).
struct EncoderParts {
  // Our parameter names of the classification head: unprefixed in a file, and what
  // allow_missing_head may leave fresh (transformers initialises them for a pretraining
  // checkpoint). bert, roberta: classifier.; deberta-v2: pooler. and classifier.
  std::vector<std::string> head_prefixes = {"classifier."};
  // File tensors (without prefix) of pretraining heads that allow_missing_head skips.
  std::vector<std::string> pretraining_heads = {"cls.", "lm_head."};
  EncoderConfig (*read_config)(const nlohmann::json& j, const std::string& model_type,
                               const std::string& source) = nullptr;
  nlohmann::json (*write_config)(const EncoderConfig& c) = nullptr;  // without ds_cpp and dtype
  HFPlace (*place)(const EncoderConfig& c, const std::string& ours) = nullptr;
  // Builds the family's model class (see EncoderClassifier's constructor for init).
  std::shared_ptr<SequenceClassifier> (*build)(const EncoderConfig& c, bool init) = nullptr;

  bool is_head(const std::string& ours) const;  // ours starts with one of head_prefixes
};

// An encoder-decoder family's functions (models::Seq2Seq, Seq2SeqConfig). Our parameter names are
// the file's (transformers' module tree), so there is no place function.
struct Seq2SeqParts {
  Seq2SeqConfig (*read_config)(const nlohmann::json& j, const std::string& model_type,
                               const std::string& source) = nullptr;
  // Our config -> the class's whole config.json (model_type and architectures included, without
  // ds_cpp and dtype).
  nlohmann::json (*write_config)(const Seq2SeqConfig& c) = nullptr;
  // The architecture switches of the family (pre/post norm, embedding norm, final norm, position
  // offset) set on a config.
  void (*set_architecture)(Seq2SeqConfig& c) = nullptr;
  std::string shared_embedding;         // the shared embedding's file name ("model.shared.weight")
  std::vector<std::string> tied_copies;  // file tensors that copy it (4.x files carry them)
  // The family's incremental decoder (serving, ds_generate): the encoder-decoders here share
  // Seq2SeqDecoder (ds/models/seq2seq_decoder.h: self- and cross-attention caches).
  std::unique_ptr<IncrementalDecoder> (*make_decoder)(std::shared_ptr<Seq2Seq> model) =
      &make_seq2seq_decoder;
};

struct Family {
  std::string name;  // the config's family ("glm4", "roberta", "t5")
  ModelKind kind = ModelKind::decoder;
  std::vector<std::string> model_types;  // config.json model_type values it reads ("glm4")
  std::string architecture;              // the class an export names ("Glm4ForCausalLM")
  // The base model's module prefix in a file ("model.", "transformer.", "roberta."): optional on
  // import (a base-model file such as GPT2Model's has none), written on export.
  std::string prefix;
  // The family an export writes instead of this one ("" = this one): ChatGLM's remote-code layout
  // is exported as native glm, which transformers loads without trust_remote_code.
  std::string export_as;
  // PEFT's default LoRA target_modules for the model type (peft's
  // TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): llama q_proj,v_proj; gpt2 c_attn; bert
  // query,value; t5 q,v.
  std::vector<std::string> lora_targets;
  // The config features beyond the plain model of its kind that this family's class expresses (for
  // decoders, names from gpt_features(): "qk_norm", "sandwich_norm", ...): an allow-list. A config
  // using any other is refused by check_features, which names the families that have it.
  std::vector<std::string> features;
  // File tensors that are buffers, not parameters (causal masks, rotary frequencies, position
  // ids): skipped on import.
  bool (*is_buffer)(const std::string& file_name) = nullptr;

  DecoderParts decoder;  // kind == decoder
  EncoderParts encoder;  // kind == encoder_classifier
  Seq2SeqParts seq2seq;  // kind == seq2seq
};

// A GPTConfig feature a decoder family may express: its name (Family::features) and whether a
// config uses it.
struct GPTFeature {
  const char* name;
  bool (*used)(const GPTConfig& c);
};
// Every such feature, in GPTConfig's order.
const std::vector<GPTFeature>& gpt_features();
// Throws "[model] <feature> needs family <those that have it> (got <family>)" for the first feature
// `c` uses that f.features does not list. GPTConfig::validate calls it before f.decoder.check.
void check_features(const Family& f, const GPTConfig& c);

// Every family of every kind, in the order docs/models.md lists them.
const std::vector<const Family*>& all_families();
// The family reading config.json's model_type (of any kind), or nullptr when none does.
const Family* find_family(const std::string& model_type);
// The family of `kind` reading model_type; throws "[hf_io] <source>: model_type ... is not a
// <kind> we read (supported: ...)", naming the kind that does read it when another does, and why
// for a known-unsupported type.
const Family& family_for_model_type(const std::string& model_type, const std::string& source,
                                    ModelKind kind = ModelKind::decoder);
// The family named `name` (a config's family), of `kind`; throws "[model] ... family ... is
// unknown (known: ...)".
const Family& family_named(const std::string& name, ModelKind kind);
// The family of a config; throws for an unknown name.
const Family& family_of(const GPTConfig& c);
const Family& family_of(const EncoderConfig& c);
const Family& family_of(const Seq2SeqConfig& c);
// The family an export of c writes (family_of(c), or its export_as).
const Family& export_family_of(const GPTConfig& c);
// The incremental decoder of model's family (DecoderParts::make_decoder,
// Seq2SeqParts::make_decoder).
std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<const GPT> model);
std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<Seq2Seq> model);
// The classifier a config describes, of its family's class (EncoderParts::build).
std::shared_ptr<SequenceClassifier> make_encoder_classifier(const EncoderConfig& c,
                                                            bool init = true);
// "gpt2, llama, ...": the model_type values the families of `kind` read.
std::string supported_model_types(ModelKind kind = ModelKind::decoder);

namespace families {  // the entries (src/models/families/*.cpp)
extern const Family gpt2, llama, mistral, qwen2, qwen3, glm, glm4, chatglm, phi3, gemma, gemma2,
    gemma3_text, ernie4_5, mixtral, qwen2_moe, qwen3_moe;  // decoders
extern const Family bert, roberta, deberta_v2;  // encoder classifiers
extern const Family bart, blenderbot, t5;       // encoder-decoders
}  // namespace families

}  // namespace ds::models
