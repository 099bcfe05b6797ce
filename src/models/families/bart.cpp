// BART and BlenderBot config.json <-> models::Seq2SeqConfig (ds/models/seq2seq_io.h). Both read
// BartConfig's field names; the model_type picks the architecture (BART: post-LN,
// layernorm_embedding, positions offset by 2; BlenderBot: pre-LN, final layer_norm, offset 0) and
// the defaults of fields config.json omits.
#include <set>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "ds/models/seq2seq.h"
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

// config.json (model_type bart or blenderbot, without ds_cpp) -> our config.
Seq2SeqConfig read(const json& j, const std::string& type, const std::string& source) {
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

json write(const Seq2SeqConfig& c) {
  json j = {
      {"model_type", c.family},
      {"architectures", json::array({family_of(c).architecture})},
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
  return j;
}

// BART: post-LN with layernorm_embedding, learned positions offset by 2; BlenderBot: pre-LN with
// a final layer_norm, offset 0.
void set_bart_architecture(Seq2SeqConfig& c) {
  c.pre_norm = false;
  c.embedding_norm = true;
  c.final_norm = false;
  c.position_offset = 2;
}
void set_blenderbot_architecture(Seq2SeqConfig& c) {
  c.pre_norm = true;
  c.embedding_norm = false;
  c.final_norm = true;
  c.position_offset = 0;
}

Family make(const char* name, const char* arch, void (*set_architecture)(Seq2SeqConfig&)) {
  Family f;
  f.name = name;
  f.kind = ModelKind::seq2seq;
  f.model_types = {name};
  f.architecture = arch;
  f.lora_targets = {"q_proj", "v_proj"};  // peft's bart entry; blenderbot (not in it) the same
  f.is_buffer = [](const std::string&) { return false; };
  f.seq2seq.read_config = read;
  f.seq2seq.write_config = write;
  f.seq2seq.set_architecture = set_architecture;
  f.seq2seq.shared_embedding = "model.shared.weight";
  f.seq2seq.tied_copies = {"model.encoder.embed_tokens.weight",
                           "model.decoder.embed_tokens.weight", "lm_head.weight"};
  return f;
}

}  // namespace

namespace families {
const Family bart = make("bart", "BartForConditionalGeneration", set_bart_architecture);
const Family blenderbot =
    make("blenderbot", "BlenderbotForConditionalGeneration", set_blenderbot_architecture);
}  // namespace families

}  // namespace ds::models
