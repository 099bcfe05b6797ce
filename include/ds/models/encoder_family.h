#pragma once
// Encoder families: what one Hugging Face encoder model_type means for the encoder classifiers
// (models::SequenceClassifier: EncoderClassifier for bert and roberta, DebertaClassifier for
// deberta-v2), in one entry each (the sibling of ds/models/family.h, whose entries describe
// models::GPT).
//
//   const EncoderFamily& f = encoder_family_for_model_type("roberta", "m/config.json");
//   EncoderConfig c = f.read_config(config_json, "roberta", "m/config.json");
//   f.place(c, "embeddings.word_embeddings.weight");   //
//   "roberta.embeddings.word_embeddings.weight"
//
//   auto model = make_encoder_classifier(c, /*init=*/false);  // the family's class
//
// Entries live in src/models/families/bert.cpp (bert and roberta share BertConfig's fields) and
// src/models/families/deberta_v2.cpp.
// encoder_io.cpp (import/export) goes through this registry instead of branching on the type.
//
// Thread safety: the registry is immutable after static initialisation; everything is const.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/encoder.h"

namespace ds::models {

struct EncoderFamily {
  std::string name;                      // EncoderConfig::family ("bert", "roberta", "deberta-v2")
  std::vector<std::string> model_types;  // config.json model_type values it reads
  std::string architecture;              // the class an export names
  // The base model's module prefix in a *ForSequenceClassification file ("bert.", "roberta.");
  // optional on import, written on export. Head tensors (head_prefixes) have none.
  std::string prefix;
  // Our parameter names of the classification head: unprefixed in a file, and what
  // allow_missing_head may leave fresh (transformers initialises them for a pretraining
  // checkpoint). bert, roberta: classifier.; deberta-v2: pooler. and classifier.
  std::vector<std::string> head_prefixes = {"classifier."};
  // PEFT's default LoRA target_modules for the model type (peft's
  // TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): bert, roberta query,value; deberta-v2
  // query_proj,value_proj.
  std::vector<std::string> lora_targets = {"query", "value"};
  // File tensors (without prefix) of pretraining heads that allow_missing_head skips.
  std::vector<std::string> pretraining_heads = {"cls.", "lm_head."};

  // config.json -> our config; throws "[hf_io] <source>: ..." naming the field for anything it
  // does not understand or cannot express (an unknown field may change the math).
  EncoderConfig (*read_config)(const nlohmann::json& j, const std::string& model_type,
                               const std::string& source) = nullptr;
  // Our config -> the class's config.json fields (without "ds_cpp" and dtype).
  nlohmann::json (*write_config)(const EncoderConfig& c) = nullptr;
  // The file tensor of our parameter `ours` ("encoder.layer.0.attention.self.query.weight").
  std::string (*place)(const EncoderConfig& c, const std::string& ours) = nullptr;
  // File tensors that are buffers or belong to another head, skipped on import (old files'
  // embeddings.position_ids; a pretraining checkpoint's MLM/NSP heads are not: see encoder_io.h).
  bool (*is_buffer)(const std::string& file_name) = nullptr;
  // Builds the family's model class (see EncoderClassifier's constructor for init).
  std::shared_ptr<SequenceClassifier> (*build)(const EncoderConfig& c, bool init) = nullptr;

  bool is_head(const std::string& ours) const;
};

// The classifier a config describes, of its family's class.
std::shared_ptr<SequenceClassifier> make_encoder_classifier(const EncoderConfig& c,
                                                            bool init = true);

// Every encoder family, in the order docs/models.md lists them.
const std::vector<const EncoderFamily*>& all_encoder_families();
// The family reading config.json's model_type, or nullptr when none does.
const EncoderFamily* find_encoder_family(const std::string& model_type);
// The same, throwing "[hf_io] <source>: model_type ... is not an encoder classifier we read
// (supported: bert, roberta, deberta-v2)".
const EncoderFamily& encoder_family_for_model_type(const std::string& model_type,
                                                   const std::string& source);
// The family of a config (EncoderConfig::family); throws for an unknown name.
const EncoderFamily& encoder_family_of(const EncoderConfig& c);
// "bert, roberta, deberta-v2": the model_type values read.
std::string supported_encoder_model_types();

namespace encoder_families {  // the entries (src/models/families/{bert,deberta_v2}.cpp)
extern const EncoderFamily bert, roberta, deberta_v2;
}  // namespace encoder_families

}  // namespace ds::models
