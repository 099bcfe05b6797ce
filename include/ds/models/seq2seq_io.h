#pragma once
// Hugging Face import and export for models::Seq2Seq (ds/models/seq2seq.h):
// BartForConditionalGeneration, BlenderbotForConditionalGeneration and T5ForConditionalGeneration
// folders (config.json + model.safetensors or shards, F32 / BF16 / F16), transformers 4.x or 5.x
// config form.
//
//   auto cfg = models::read_hf_seq2seq_config("bart-folder");   // from config.json
//   auto model = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
//   models::load_hf_seq2seq_weights(*model, "bart-folder");
//   ...
//   models::export_hf_seq2seq(*model, "out/hf_model");          // config.json + model.safetensors
//
// Tensor names are the class's (model.shared.weight, model.encoder.layers.0.fc1.weight, ...,
// final_logits_bias). Tied copies of the shared embedding (model.encoder.embed_tokens.weight,
// model.decoder.embed_tokens.weight, lm_head.weight: 4.x files carry them) are checked to equal
// model.shared.weight and skipped; a file without final_logits_bias leaves it zero (transformers'
// _keys_to_ignore_on_load_missing). T5: names without the "model." prefix (shared.weight,
// encoder.block.0.layer.0.SelfAttention.q.weight, ...); the tied copies are
// {encoder,decoder}.embed_tokens.weight and, when tied, lm_head.weight; an untied model has
// lm_head.weight as a parameter; decoder.block.0.layer.1.EncDecAttention.relative_attention_bias
// .weight is skipped (transformers' _keys_to_ignore_on_load_unexpected). Any other tensor that is not a parameter is an error, and so
// is every missing or mis-shaped tensor: one error lists them all.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/dtype.h"
#include "ds/models/seq2seq.h"

namespace ds::models {

// The Seq2SeqConfig a config.json describes (model_type bart or blenderbot:
// src/models/families/bart.cpp; t5: src/models/families/t5.cpp, which refuses by name a
// feed_forward_proj it does not compute, tie_encoder_decoder, is_decoder and unknown fields). Our exporter also writes our own config under "ds_cpp", used as
// is when present. Throws "[hf_io] <source>: ..." naming the field for another model type, for an
// unknown field (it may change the math), for an unsupported activation_function, for
// tie_word_embeddings false, for layerdrop, and for the 4.x architecture switches
// (normalize_before, add_final_layer_norm, normalize_embedding, extra_pos_embeddings,
// static_position_embeddings, add_bias_logits, layernorm_variant, extra_layer_norm) when they
// describe another architecture than the model_type's.
Seq2SeqConfig seq2seq_config_from_json(const nlohmann::json& j,
                                       const std::string& source = "config.json");
// The config.json our exporter writes: the class's fields plus "ds_cpp".
nlohmann::json seq2seq_config_to_json(const Seq2SeqConfig& c);
// The config.json of a folder whose model_type is bart, blenderbot or t5; nullopt for a folder
// without config.json or with another model_type. T5 as transformers 5.24 loads it: a config
// that says tied but a folder whose lm_head.weight differs from shared.weight gives an untied
// model (tie_word_embeddings false).
std::optional<Seq2SeqConfig> read_hf_seq2seq_config(const std::filesystem::path& path);

// Generation options of a checkpoint: dir/generation_config.json (transformers 5 saves one), or
// else the generation keys of dir/config.json (4.x checkpoints keep num_beams, length_penalty,
// min_length, max_length, no_repeat_ngram_size, encoder_no_repeat_ngram_size there), with
// transformers' GenerationConfig defaults for what is absent (num_beams 1, max_length 20,
// length_penalty 1, early_stopping false, eos / forced eos from `c`). max_length counts the
// decoder start token: max_new_tokens = max_length - 1 unless max_new_tokens is given. Throws
// "[hf_io] <file>: ..." naming a setting we do not implement (do_sample true, num_beam_groups,
// repetition_penalty, forced_bos_token_id, bad_words_ids, suppress_tokens, num_return_sequences,
// several eos ids, ...) or an unknown generation_config.json key.
BeamOptions read_hf_generation_options(const std::filesystem::path& dir, const Seq2SeqConfig& c);

struct Seq2SeqLoadReport {
  std::vector<std::string> files;    // safetensors files read
  int64_t tensors = 0;               // parameters and buffers filled
  std::vector<std::string> ignored;  // tied copies skipped
};

// Fills every parameter and final_logits_bias of `model` from `path` (a folder or a
// .safetensors file), converting to the parameter dtype. Nothing is written unless every
// parameter has exactly one tensor of the right shape. Throws "[hf_io] <file>: ..." listing every
// problem.
Seq2SeqLoadReport load_hf_seq2seq_weights(Seq2Seq& model, const std::filesystem::path& path);

// Writes dir/config.json and dir/model.safetensors (tensors in `dtype`, final_logits_bias
// included (BART / BlenderBot), tied copies left out as transformers 5 saves them; T5: the
// hub's config form, tie_word_embeddings false with lm_head.weight when untied), creating dir.
void export_hf_seq2seq(const Seq2Seq& model, const std::filesystem::path& dir,
                       DType dtype = DType::f32);

}  // namespace ds::models
