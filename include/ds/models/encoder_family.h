#pragma once
// Encoder families: what one Hugging Face encoder model_type means for models::EncoderClassifier,
// in one entry each (the sibling of ds/models/family.h, whose entries describe models::GPT).
//
//   const EncoderFamily& f = encoder_family_for_model_type("roberta", "m/config.json");
//   EncoderConfig c = f.read_config(config_json, "roberta", "m/config.json");
//   f.place(c, "embeddings.word_embeddings.weight");   //
//   "roberta.embeddings.word_embeddings.weight"
//
// Entries live in src/models/families/bert.cpp (bert and roberta share BertConfig's fields).
// encoder_io.cpp (import/export) goes through this registry instead of branching on the type.
//
// Thread safety: the registry is immutable after static initialisation; everything is const.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/encoder.h"

namespace ds::models {

struct EncoderFamily {
  std::string name;                      // EncoderConfig::family ("bert", "roberta")
  std::vector<std::string> model_types;  // config.json model_type values it reads
  std::string architecture;              // the class an export names
  // The base model's module prefix in a *ForSequenceClassification file ("bert.", "roberta.");
  // optional on import, written on export. Head tensors (classifier.*) have none.
  std::string prefix;

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
};

// Every encoder family, in the order docs/models.md lists them.
const std::vector<const EncoderFamily*>& all_encoder_families();
// The family reading config.json's model_type, or nullptr when none does.
const EncoderFamily* find_encoder_family(const std::string& model_type);
// The same, throwing "[hf_io] <source>: model_type ... is not an encoder classifier we read
// (supported: bert, roberta)".
const EncoderFamily& encoder_family_for_model_type(const std::string& model_type,
                                                   const std::string& source);
// The family of a config (EncoderConfig::family); throws for an unknown name.
const EncoderFamily& encoder_family_of(const EncoderConfig& c);
// "bert, roberta": the model_type values read.
std::string supported_encoder_model_types();

namespace encoder_families {  // the entries (src/models/families/bert.cpp)
extern const EncoderFamily bert, roberta;
}  // namespace encoder_families

}  // namespace ds::models
