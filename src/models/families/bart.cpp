// BART and BlenderBot config.json <-> models::Seq2SeqConfig (ds/models/seq2seq_io.h). Both read
// BartConfig's field names; the model_type picks the architecture (BART: post-LN,
// layernorm_embedding, positions offset by 2; BlenderBot: pre-LN, final layer_norm, offset 0) and
// the defaults of fields config.json omits.
#include <set>

#include "ds/core/error.h"
#include "ds/models/seq2seq_io.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

struct Defaults {  // BartConfig / BlenderbotConfig (transformers 5)
  int64_t vocab_size, max_positions, d_model, enc_layers, dec_layers, heads, ffn;
  int64_t pad, bos, eos, start;
  bool scale_embedding;
};
const Defaults kBart{50265, 1024, 1024, 12, 12, 16, 4096, 1, 0, 2, 2, false};
const Defaults kBlenderbot{8008, 128, 2560, 2, 24, 32, 10240, 0, 1, 2, 1, false};

// A 4.x architecture switch: when present it must say what the model_type computes.
template <class T>
void expect_field(const json& j, const char* key, T want, const std::string& model_type,
                  const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return;
  const T got = hf::get_field<T>(j, key, want, source);
  DS_CHECK(got == want,
           "[hf_io] {}: \"{}\" = {} describes another architecture than model_type {} ({} "
           "needs {}); transformers 5 would ignore it and compute something else, so the import "
           "stops",
           source, key, j[key].dump(), model_type, model_type, json(want).dump());
}

}  // namespace

std::string supported_seq2seq_model_types() {
  return "bart, blenderbot, t5";
}

bool is_seq2seq_model_type(const std::string& t) {
  return t == "bart" || t == "blenderbot" || t == "t5";
}

namespace {

// BartConfig's fields, the 4.x architecture switches checked in check_bart_switches, and keys that
// change nothing here: the classification head's dropout and label count (no such head),
// gradient_checkpointing (memory), unk/mask token ids, 4.x generation switches.
const std::set<std::string>& bart_fields() {
  static const std::set<std::string> fields = {"vocab_size",
                                               "max_position_embeddings",
                                               "d_model",
                                               "encoder_layers",
                                               "decoder_layers",
                                               "encoder_attention_heads",
                                               "decoder_attention_heads",
                                               "encoder_ffn_dim",
                                               "decoder_ffn_dim",
                                               "activation_function",
                                               "dropout",
                                               "attention_dropout",
                                               "activation_dropout",
                                               "init_std",
                                               "scale_embedding",
                                               "tie_word_embeddings",
                                               "encoder_layerdrop",
                                               "decoder_layerdrop",
                                               "num_hidden_layers",
                                               "classifier_dropout",
                                               "classif_dropout",
                                               "num_labels",
                                               "gradient_checkpointing",
                                               "unk_token_id",
                                               "mask_token_id",
                                               "output_past",
                                               "force_bos_token_to_be_generated",
                                               "normalize_before",
                                               "add_final_layer_norm",
                                               "normalize_embedding",
                                               "extra_pos_embeddings",
                                               "static_position_embeddings",
                                               "add_bias_logits",
                                               "layernorm_variant",
                                               "extra_layer_norm",
                                               "do_blenderbot_90_layernorm"};
  return fields;
}

// BART's and BlenderBot's sizes, activation, dropout and token ids (their own defaults).
void read_bart_sizes(const json& j, const Defaults& d, const std::string& source,
                     Seq2SeqConfig& c) {
  c.vocab_size = hf::get_field<int64_t>(j, "vocab_size", d.vocab_size, source);
  c.max_positions = hf::get_field<int64_t>(j, "max_position_embeddings", d.max_positions, source);
  c.d_model = hf::get_field<int64_t>(j, "d_model", d.d_model, source);
  c.encoder_layers = hf::get_field<int64_t>(j, "encoder_layers", d.enc_layers, source);
  c.decoder_layers = hf::get_field<int64_t>(j, "decoder_layers", d.dec_layers, source);
  c.encoder_heads = hf::get_field<int64_t>(j, "encoder_attention_heads", d.heads, source);
  c.decoder_heads = hf::get_field<int64_t>(j, "decoder_attention_heads", d.heads, source);
  c.encoder_ffn = hf::get_field<int64_t>(j, "encoder_ffn_dim", d.ffn, source);
  c.decoder_ffn = hf::get_field<int64_t>(j, "decoder_ffn_dim", d.ffn, source);
  c.activation = hf::get_field<std::string>(j, "activation_function", "gelu", source);
  DS_CHECK(c.activation == "gelu" || c.activation == "gelu_new" ||
               c.activation == "gelu_pytorch_tanh" || c.activation == "relu" ||
               c.activation == "silu" || c.activation == "swish",
           "[hf_io] {}: activation_function \"{}\" is not supported (gelu, gelu_new, "
           "gelu_pytorch_tanh, relu, silu, swish)",
           source, c.activation);
  c.dropout = hf::get_field<float>(j, "dropout", 0.1f, source);
  c.attention_dropout = hf::get_field<float>(j, "attention_dropout", 0.0f, source);
  c.activation_dropout = hf::get_field<float>(j, "activation_dropout", 0.0f, source);
  c.init_std = hf::get_field<float>(j, "init_std", 0.02f, source);
  c.scale_embedding = hf::get_field<bool>(j, "scale_embedding", d.scale_embedding, source);
  c.pad_token_id = hf::get_field<int64_t>(j, "pad_token_id", d.pad, source);
  c.bos_token_id = hf::get_field<int64_t>(j, "bos_token_id", d.bos, source);
  c.eos_token_id = hf::get_field<int64_t>(j, "eos_token_id", d.eos, source);
  c.decoder_start_token_id = hf::get_field<int64_t>(j, "decoder_start_token_id", d.start, source);
  c.forced_eos_token_id = hf::get_field<int64_t>(j, "forced_eos_token_id", 2, source);
  if (j.contains("forced_eos_token_id") && j["forced_eos_token_id"].is_null())
    c.forced_eos_token_id = -1;
}

// What the class cannot express (an untied head, LayerDrop, a different encoder depth) and the
// 4.x architecture switches, which must say what the family's class computes.
void check_bart_switches(const json& j, const std::string& type, const std::string& source,
                         const Seq2SeqConfig& c) {
  DS_CHECK(hf::get_field<bool>(j, "tie_word_embeddings", true, source),
           "[hf_io] {}: tie_word_embeddings false (an lm_head of its own) is not supported",
           source);
  for (const char* key : {"encoder_layerdrop", "decoder_layerdrop"})
    DS_CHECK(hf::get_field<float>(j, key, 0.0f, source) == 0.0f,
             "[hf_io] {}: \"{}\" = {} (LayerDrop) is not supported; set it to 0", source, key,
             j[key].dump());
  if (j.contains("num_hidden_layers"))
    DS_CHECK(hf::get_field<int64_t>(j, "num_hidden_layers", 0, source) == c.encoder_layers,
             "[hf_io] {}: num_hidden_layers {} differs from encoder_layers {}", source,
             j["num_hidden_layers"].dump(), c.encoder_layers);
  expect_field(j, "normalize_before", c.pre_norm, type, source);
  expect_field(j, "add_final_layer_norm", c.final_norm, type, source);
  expect_field(j, "normalize_embedding", c.embedding_norm, type, source);
  expect_field(j, "extra_pos_embeddings", c.position_offset, type, source);
  expect_field(j, "static_position_embeddings", false, type, source);
  expect_field(j, "add_bias_logits", false, type, source);
  expect_field(j, "extra_layer_norm", false, type, source);
  expect_field(j, "layernorm_variant",
               std::string(type == "blenderbot" ? "prelayernorm" : "postlayernorm"), type,
               source);
}

}  // namespace

Seq2SeqConfig seq2seq_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: config.json must be a JSON object", source);
  DS_CHECK(j.contains("model_type") && j["model_type"].is_string(),
           "[hf_io] {}: no \"model_type\"; a sequence-to-sequence config.json names {}", source,
           supported_seq2seq_model_types());
  const std::string type = j["model_type"].get<std::string>();
  DS_CHECK(is_seq2seq_model_type(type),
           "[hf_io] {}: model_type \"{}\" is not a sequence-to-sequence model we read "
           "(supported: {})",
           source, type, supported_seq2seq_model_types());
  if (j.contains("ds_cpp")) {
    try {
      return Seq2SeqConfig::from_json(j["ds_cpp"]);
    } catch (const Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  if (type == "t5") return hf::t5_config_from_json(j, source);
  hf::check_known_fields(j, bart_fields(), type, source);
  hf::check_dtype_fields(j, source);
  Seq2SeqConfig c;
  c.family = type;
  c.set_family_architecture();
  read_bart_sizes(j, type == "blenderbot" ? kBlenderbot : kBart, source, c);
  check_bart_switches(j, type, source, c);
  try {
    c.validate();
  } catch (const Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
  return c;
}

json seq2seq_config_to_json(const Seq2SeqConfig& c) {
  if (c.is_t5()) {
    json t = hf::t5_config_to_json(c);
    t["ds_cpp"] = c.to_json();
    return t;
  }
  json j = {
      {"model_type", c.family},
      {"architectures", json::array({c.family == "blenderbot" ? "BlenderbotForConditionalGeneration"
                                                              : "BartForConditionalGeneration"})},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_positions},
      {"d_model", c.d_model},
      {"encoder_layers", c.encoder_layers},
      {"decoder_layers", c.decoder_layers},
      {"encoder_attention_heads", c.encoder_heads},
      {"decoder_attention_heads", c.decoder_heads},
      {"encoder_ffn_dim", c.encoder_ffn},
      {"decoder_ffn_dim", c.decoder_ffn},
      {"activation_function", c.activation},
      {"dropout", c.dropout},
      {"attention_dropout", c.attention_dropout},
      {"activation_dropout", c.activation_dropout},
      {"init_std", c.init_std},
      {"scale_embedding", c.scale_embedding},
      {"pad_token_id", c.pad_token_id},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"decoder_start_token_id", c.decoder_start_token_id},
      {"forced_eos_token_id",
       c.forced_eos_token_id >= 0 ? json(c.forced_eos_token_id) : json(nullptr)},
      {"is_encoder_decoder", true},
      {"tie_word_embeddings", true},
      {"encoder_layerdrop", 0.0},
      {"decoder_layerdrop", 0.0}};
  j["ds_cpp"] = c.to_json();
  return j;
}

}  // namespace ds::models
