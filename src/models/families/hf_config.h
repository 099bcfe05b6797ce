#pragma once
// Reading and writing Hugging Face config.json fields, shared by the family entries
// (src/models/families/*.cpp). Internal to src/models: not a public header.
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/models/encoder.h"
#include "ds/models/gpt.h"
#include "ds/models/seq2seq.h"

namespace ds::models::hf {

using nlohmann::json;

template <class T>
T get_field(const json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  // The JSON library converts 1e30 or 2^64 to an integer by a cast that wraps (1e30 layers read as
  // a negative count) and takes 2.5 as 2: sizes must be whole numbers an int64 holds. Exponent
  // forms of whole numbers (1e5) are fine.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (v.is_number_float()) {
      const double d = v.get<double>();
      DS_CHECK(std::isfinite(d) && d == std::trunc(d),
               "[hf_io] {}: \"{}\" = {} is not a whole number; sizes and counts are integers",
               source, key, v.dump());
      DS_CHECK(std::abs(d) <= 9.2e18,
               "[hf_io] {}: \"{}\" = {} is out of range (beyond 9.2e18); check the config", source,
               key, v.dump());
      return static_cast<T>(d);
    }
    DS_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX),
             "[hf_io] {}: \"{}\" = {} is out of range (above 9.2e18); check the config", source,
             key, v.dump());
  }
  try {
    return j[key].get<T>();
  } catch (const json::exception& e) {
    DS_THROW("[hf_io] {}: bad value for \"{}\": {}", source, key, j[key].dump());
  }
}

// The sequence-classification fields every encoder family reads the same way, then the config's
// own validation: num_labels from id2label's size (transformers writes it) or num_labels (older
// files; the two must agree; PretrainedConfig's default 2), and problem_type. Errors name `source`.
void finish_classifier_config(const json& j, EncoderConfig& c, const std::string& source);

// The config.json fields every encoder family writes the same way: sizes, activation, dropouts,
// norm epsilon, pad id, id2label / label2id ("LABEL_<i>") and problem_type when set. A family adds
// its own fields to the result.
json write_encoder_common(const EncoderConfig& c);

// Config keys that never change a model's math: bookkeeping, token ids, generation defaults and
// PretrainedConfig's generic switches.
bool harmless_key(const std::string& k);
// Every key of j must be in `handled` or harmless: anything else stops the import, naming it.
void check_known_fields(const json& j, const std::set<std::string>& handled,
                        const std::string& model_type, const std::string& source);
// "dtype" / "torch_dtype" must be float32, bfloat16, float16 or auto.
void check_dtype_fields(const json& j, const std::string& source);
// Reads rope_theta, rope scaling and partial_rotary_factor (4.x top-level rope_theta/rope_scaling
// or 5.x rope_parameters, possibly nested by layer type) into c; unknown keys and types are errors.
// The family's check() decides whether a partial_rotary_factor other than 1 is expressible;
// rope_type longrope is read only for a family that passes longrope (its class computes it: Phi-3).
void read_rope_fields(const json& j, int64_t max_positions, const std::string& source, GPTConfig& c,
                      bool longrope = false);
// transformers 5's rope_parameters for our rope_theta, RopeScaling and partial_rotary_factor.
json rope_parameters(const GPTConfig& c);
// The fields a LLaMA-like decoder class shares (LlamaConfig's names): vocab_size,
// max_position_embeddings, hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, intermediate_size, rms_norm_eps, tie_word_embeddings, attention_dropout,
// hidden_act (silu only), head_dim, the rope fields and dtype. `d` holds the class's defaults for
// fields config.json omits. The result has layout llama and family = model_type; the family's
// reader checks and reads the rest (check_known_fields with decoder_fields() plus its own).
struct DecoderDefaults {
  int64_t vocab_size = 32000;
  int64_t max_positions = 2048;
  int64_t hidden_size = 4096;
  int64_t layers = 32;
  int64_t heads = 32;
  int64_t kv_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool longrope = false;  // rope_type longrope is read (read_rope_fields)
};
const std::set<std::string>& decoder_fields();
GPTConfig read_decoder_fields(const json& j, const std::string& model_type,
                              const std::string& source, const DecoderDefaults& d);
// The same fields written for c (transformers 5 form: rope_parameters).
json write_decoder_fields(const GPTConfig& c);
// A float field as the decimal it was written as (1e-5, not 9.999999747378752e-06).
double shortest(float v);

}  // namespace ds::models::hf
