// T5 config.json <-> models::Seq2SeqConfig (family "t5"; ds/models/seq2seq_io.h), as transformers
// 5.24's T5Config reads it: feed_forward_proj "<act>" or "gated-<act>" ("gated-gelu" means
// gelu_new), one dropout_rate for every dropout, num_decoder_layers defaulting to num_layers, and
// the decoder output scale from scale_decoder_outputs (tie_word_embeddings != false when absent).
#include <set>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "ds/models/seq2seq.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

Seq2SeqConfig read(const json& j, const std::string&, const std::string& source) {
  // T5Config's fields; n_positions / output_past / task_specific_params / gradient_checkpointing
  // (4.x leftovers and per-task generation prefixes) and the classification head's dropout change
  // nothing here; dense_act_fn and is_gated_act are recomputed from feed_forward_proj by
  // T5Config (checked against it below).
  static const std::set<std::string> fields = {"vocab_size",
                                               "d_model",
                                               "d_kv",
                                               "d_ff",
                                               "num_layers",
                                               "num_decoder_layers",
                                               "num_heads",
                                               "relative_attention_num_buckets",
                                               "relative_attention_max_distance",
                                               "dropout_rate",
                                               "layer_norm_epsilon",
                                               "initializer_factor",
                                               "feed_forward_proj",
                                               "dense_act_fn",
                                               "is_gated_act",
                                               "tie_word_embeddings",
                                               "scale_decoder_outputs",
                                               "classifier_dropout",
                                               "n_positions",
                                               "output_past",
                                               "task_specific_params",
                                               "gradient_checkpointing",
                                               "forced_eos_token_id"};
  hf::check_known_fields(j, fields, "t5", source);
  hf::check_dtype_fields(j, source);
  DS_CHECK(!hf::get_field<bool>(j, "tie_encoder_decoder", false, source),
           "[hf_io] {}: tie_encoder_decoder true (encoder and decoder sharing weights) is not "
           "supported",
           source);
  DS_CHECK(!hf::get_field<bool>(j, "is_decoder", false, source),
           "[hf_io] {}: is_decoder true describes a decoder-only T5 stack, not "
           "T5ForConditionalGeneration",
           source);
  Seq2SeqConfig c;
  c.family = "t5";
  c.set_family_architecture();
  c.vocab_size = hf::get_field<int64_t>(j, "vocab_size", 32128, source);
  c.d_model = hf::get_field<int64_t>(j, "d_model", 512, source);
  c.d_kv = hf::get_field<int64_t>(j, "d_kv", 64, source);
  c.encoder_ffn = c.decoder_ffn = hf::get_field<int64_t>(j, "d_ff", 2048, source);
  c.encoder_layers = hf::get_field<int64_t>(j, "num_layers", 6, source);
  c.decoder_layers = c.encoder_layers;
  if (j.contains("num_decoder_layers") && !j["num_decoder_layers"].is_null())
    c.decoder_layers = hf::get_field<int64_t>(j, "num_decoder_layers", 6, source);
  c.encoder_heads = c.decoder_heads = hf::get_field<int64_t>(j, "num_heads", 8, source);
  c.relative_buckets = hf::get_field<int64_t>(j, "relative_attention_num_buckets", 32, source);
  c.relative_max_distance =
      hf::get_field<int64_t>(j, "relative_attention_max_distance", 128, source);
  c.dropout = c.attention_dropout = c.activation_dropout =
      hf::get_field<float>(j, "dropout_rate", 0.1f, source);
  c.norm_eps = hf::get_field<float>(j, "layer_norm_epsilon", 1e-6f, source);
  c.init_std = hf::get_field<float>(j, "initializer_factor", 1.0f, source);
  c.max_positions = hf::get_field<int64_t>(j, "n_positions", 512, source);  // not a limit
  const std::string proj = hf::get_field<std::string>(j, "feed_forward_proj", "relu", source);
  const auto dash = proj.find('-');
  c.gated_ffn = dash != std::string::npos;
  DS_CHECK(!c.gated_ffn ||
               (proj.substr(0, dash) == "gated" && proj.find('-', dash + 1) == std::string::npos),
           "[hf_io] {}: feed_forward_proj \"{}\" is not \"<act>\" or \"gated-<act>\"", source,
           proj);
  c.activation = c.gated_ffn ? proj.substr(dash + 1) : proj;
  if (proj == "gated-gelu") c.activation = "gelu_new";  // as T5Config
  DS_CHECK(c.activation == "relu" || c.activation == "gelu" || c.activation == "gelu_new" ||
               c.activation == "gelu_pytorch_tanh" || c.activation == "silu" ||
               c.activation == "swish",
           "[hf_io] {}: feed_forward_proj \"{}\": activation \"{}\" is not supported (relu, gelu, "
           "gelu_new, gelu_pytorch_tanh, silu, swish)",
           source, proj, c.activation);
  if (j.contains("dense_act_fn") && j["dense_act_fn"].is_string())
    DS_CHECK(j["dense_act_fn"].get<std::string>() == c.activation,
             "[hf_io] {}: dense_act_fn \"{}\" disagrees with feed_forward_proj \"{}\" (which "
             "transformers uses: {}); fix config.json",
             source, j["dense_act_fn"].get<std::string>(), proj, c.activation);
  if (j.contains("is_gated_act") && j["is_gated_act"].is_boolean())
    DS_CHECK(j["is_gated_act"].get<bool>() == c.gated_ffn,
             "[hf_io] {}: is_gated_act {} disagrees with feed_forward_proj \"{}\"; fix config.json",
             source, j["is_gated_act"].dump(), proj);
  const bool tie = !j.contains("tie_word_embeddings") || j["tie_word_embeddings"].is_null() ||
                   hf::get_field<bool>(j, "tie_word_embeddings", true, source);
  c.tie_word_embeddings = tie;
  c.scale_decoder_outputs =
      j.contains("scale_decoder_outputs") && !j["scale_decoder_outputs"].is_null()
          ? hf::get_field<bool>(j, "scale_decoder_outputs", true, source)
          : tie;
  c.pad_token_id = hf::get_field<int64_t>(j, "pad_token_id", 0, source);
  c.eos_token_id = hf::get_field<int64_t>(j, "eos_token_id", 1, source);
  c.bos_token_id = c.pad_token_id;  // T5 has no bos; nothing reads it
  c.decoder_start_token_id =
      hf::get_field<int64_t>(j, "decoder_start_token_id", c.pad_token_id, source);
  c.forced_eos_token_id = -1;
  if (j.contains("forced_eos_token_id") && !j["forced_eos_token_id"].is_null())
    c.forced_eos_token_id = hf::get_field<int64_t>(j, "forced_eos_token_id", -1, source);
  try {
    c.validate();
  } catch (const Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
  return c;
}

json write(const Seq2SeqConfig& c) {
  json j = {{"model_type", "t5"},
            {"architectures", json::array({"T5ForConditionalGeneration"})},
            {"vocab_size", c.vocab_size},
            {"d_model", c.d_model},
            {"d_kv", c.d_kv},
            {"d_ff", c.encoder_ffn},
            {"num_layers", c.encoder_layers},
            {"num_decoder_layers", c.decoder_layers},
            {"num_heads", c.encoder_heads},
            {"relative_attention_num_buckets", c.relative_buckets},
            {"relative_attention_max_distance", c.relative_max_distance},
            {"dropout_rate", hf::shortest(c.dropout)},
            {"layer_norm_epsilon", hf::shortest(c.norm_eps)},
            {"initializer_factor", hf::shortest(c.init_std)},
            {"feed_forward_proj",
             (c.gated_ffn ? "gated-" : "") +
                 (c.gated_ffn && c.activation == "gelu_new" ? std::string("gelu") : c.activation)},
            {"pad_token_id", c.pad_token_id},
            {"eos_token_id", c.eos_token_id},
            {"decoder_start_token_id", c.decoder_start_token_id},
            {"is_encoder_decoder", true},
            // As the hub's t5-v1_1 / flan-t5 configs: false = lm_head.weight of its own (written
            // to the file, so transformers 5 unties it) and no output scale.
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"scale_decoder_outputs", c.scale_decoder_outputs}};
  if (c.forced_eos_token_id >= 0) j["forced_eos_token_id"] = c.forced_eos_token_id;
  return j;
}

// Pre-LN (RMS norms) with a final norm; relative position buckets instead of positions.
void set_architecture(Seq2SeqConfig& c) {
  c.pre_norm = true;
  c.embedding_norm = false;
  c.final_norm = true;
  c.position_offset = 0;
}

// T5ForConditionalGeneration._keys_to_ignore_on_load_unexpected.
bool is_buffer(const std::string& name) {
  return name == "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight";
}

Family make() {
  Family f;
  f.name = "t5";
  f.kind = ModelKind::seq2seq;
  f.model_types = {"t5"};
  f.architecture = "T5ForConditionalGeneration";
  f.lora_targets = {"q", "v"};
  f.is_buffer = is_buffer;
  f.seq2seq.read_config = read;
  f.seq2seq.write_config = write;
  f.seq2seq.set_architecture = set_architecture;
  f.seq2seq.shared_embedding = "shared.weight";
  // lm_head.weight is a copy only when tied; an untied model has it as a parameter.
  f.seq2seq.tied_copies = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                           "lm_head.weight"};
  return f;
}

}  // namespace

namespace families {
const Family t5 = make();
}  // namespace families

}  // namespace ds::models
