#pragma once
// Hugging Face import and export for the encoder classifiers (models::SequenceClassifier,
// ds/models/encoder.h and deberta.h): BertForSequenceClassification,
// RobertaForSequenceClassification and DebertaV2ForSequenceClassification folders (config.json +
// model.safetensors or shards, F32 / BF16 / F16), transformers 4.x or 5.x config form.
//
//   auto cfg = models::read_hf_encoder_config("bert-folder");   // from config.json
//   auto model = models::make_encoder_classifier(*cfg, /*init=*/false);  // family.h
//   models::load_hf_encoder_weights(*model, "bert-folder");
//   ...
//   models::export_hf_encoder(*model, "out/hf_model");          // config.json + model.safetensors
//
// Tensor names are the class's: "bert."/"roberta."/"deberta." before the base model's names
// (optional on import: a BertModel file has none), the head ("classifier.*"; DeBERTa's
// "pooler.*" too) unprefixed. The embeddings' position_ids /
// token_type_ids buffers of old files and a RoBERTa file's pooler (which
// RobertaForSequenceClassification does not have) are ignored on purpose; any other tensor that is
// not a parameter is an error, and so is every missing or mis-shaped tensor: one error lists them
// all. A classifier fine-tuned from a pretraining checkpoint (bert-base-uncased, roberta-base)
// starts with a fresh head: build the model with init = true and load with allow_missing_head,
// which also skips the pretraining heads (cls.*, lm_head.*; DeBERTa's lm_predictions.*,
// mask_predictions.*). A DeBERTa file's embeddings.position_embeddings under
// position_biased_input false is ignored (transformers' _keys_to_ignore_on_load_unexpected).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/dtype.h"
#include "ds/models/encoder.h"

namespace ds::models {

// The EncoderConfig a config.json describes (model_type bert, roberta or deberta-v2). Our exporter
// also writes our own config under "ds_cpp", used as is when present. Throws "[hf_io] <source>:
// ..." naming the field for another model type and for any field it does not know or cannot express
// (an unknown field may change the math): position_embedding_type other than absolute, is_decoder,
// add_cross_attention, an activation other than gelu / gelu_new / gelu_pytorch_tanh,
// problem_type multi_label_classification.
EncoderConfig encoder_config_from_json(const nlohmann::json& j,
                                       const std::string& source = "config.json");
// The config.json our exporter writes: the class's fields plus "ds_cpp".
nlohmann::json encoder_config_to_json(const EncoderConfig& c);
// The config.json of a folder whose model_type is an encoder family (bert, roberta,
// deberta-v2); nullopt for
// a folder without config.json, or whose model_type is not one (a decoder: ds/models/hf_io.h).
std::optional<EncoderConfig> read_hf_encoder_config(const std::filesystem::path& path);

struct EncoderLoadReport {
  std::vector<std::string> files;         // safetensors files read
  int64_t tensors = 0;                    // parameters filled
  std::vector<std::string> ignored;       // file tensors skipped on purpose (buffers)
  std::vector<std::string> missing_head;  // head parameters left as they were (allow_missing_head)
};

// Fills every parameter of `model` from `path` (a folder or a .safetensors file), converting to
// the parameter dtype. Nothing is written unless every parameter has exactly one tensor of the
// right shape, except that with allow_missing_head the head's (EncoderParts::head_prefixes) may
// be absent and keep their values, and pretraining heads in the file are skipped. A head whose
// label count differs from config.json's is an error naming the tensor (re-initialise it by
// loading a file without it under allow_missing_head). Throws "[hf_io] <file>: ..." listing every
// problem.
EncoderLoadReport load_hf_encoder_weights(SequenceClassifier& model,
                                          const std::filesystem::path& path,
                                          bool allow_missing_head = false);

// Writes dir/config.json (dtype, architectures, model_type, id2label) and dir/model.safetensors
// (tensors in `dtype`, metadata format "pt"), creating dir: transformers' from_pretrained(dir)
// and load_hf_encoder_weights(dir) both read it.
void export_hf_encoder(const SequenceClassifier& model, const std::filesystem::path& dir,
                       DType dtype = DType::f32);

// Rewrites dir/config.json's id2label / label2id with `names` (class-id order), as a classifier
// trained on named labels exports them (ds_train and ds_to_fp32 alike). names.size() must be the
// config's num_labels.
void write_hf_label_names(const std::filesystem::path& dir, const std::vector<std::string>& names);

}  // namespace ds::models
