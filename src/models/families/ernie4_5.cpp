// ERNIE 4.5 (dense): Ernie4_5ForCausalLM ("ernie4_5": ERNIE-4.5-0.3B; transformers 5, 4.x configs
// read too). The llama layout with rotary embedding on the whole head rotating pairs (2i, 2i+1)
// (rope_interleaved, as GLM), head_dim apart from hidden_size / heads (128 by default), a tied head
// by default, and use_bias putting a bias on every projection (q, k, v, o, gate, up, down: our
// bias, as llama's attention_bias with mlp_bias).
//
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias with use_bias),
//   model.layers.{i}.post_attention_layernorm.weight,
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight (+ .bias with use_bias), model.norm.weight;
//   lm_head.weight only when untied.
//
// attention_dropout is read and ignored, as the class ignores it (its attention_dropout is 0.0).
// The class's rotary base defaults to 500000 (Ernie4_5Config.default_theta) when the config names
// none. The MoE models (ernie4_5_moe) and the remote-code checkpoints (model_type "ernie4_5" with
// Baidu's own fields, such as "use_rmsnorm" or "fuse_rope") are not read: the unknown fields stop
// the import by name.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

bool has(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// Whether the config names a rotary base anywhere transformers reads one.
bool names_theta(const json& j) {
  if (has(j, "rope_theta")) return true;
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (has(j, k) && j[k].is_object() && has(j[k], "rope_theta")) return true;
  return false;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert("use_bias");
  hf::check_known_fields(j, handled, type, source);
  json jj = j;
  jj.erase("attention_dropout");  // not a field of the class: Ernie4_5Attention never drops out
  if (!names_theta(j)) jj["rope_theta"] = 500000.0;  // Ernie4_5Config.default_theta
  // Ernie4_5Config's defaults (ERNIE-4.5-0.3B's sizes).
  if (!has(jj, "intermediate_size")) jj["intermediate_size"] = 3072;
  hf::DecoderDefaults d;
  d.vocab_size = 103424;
  d.max_positions = 131072;
  d.hidden_size = 1024;
  d.layers = 18;
  d.heads = 16;
  d.kv_heads = 2;
  d.head_dim = 128;
  d.rms_norm_eps = 1e-5f;
  d.tie_word_embeddings = true;
  GPTConfig c = hf::read_decoder_fields(jj, type, source, d);
  // Ernie4_5RotaryEmbedding rotates the whole head whatever partial_rotary_factor says.
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for ernie4_5 (its class "
           "rotates the whole head)",
           source, c.partial_rotary_factor);
  c.rope_interleaved = true;
  c.bias = hf::get_field<bool>(j, "use_bias", false, source);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["use_bias"] = c.bias;
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?rotary_emb\.(original_)?inv_freq)");
  return std::regex_match(name, rotary);
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family ernie4_5 needs the llama layout");
  DS_CHECK(c.rope_interleaved && c.partial_rotary_factor == 1.0f,
           "[model] family ernie4_5 rotates pairs (2i, 2i+1) of the whole head: rope_interleaved "
           "true, partial_rotary_factor 1");
  DS_CHECK(!c.qkv_bias || c.bias,
           "[model] family ernie4_5 has biases on every projection or none (bias), not on q/k/v "
           "alone (qkv_bias)");
  DS_CHECK(c.sliding_window == 0,
           "[model] family ernie4_5 attends to every key (sliding_window 0)");
}

Family make() {
  Family f;
  f.name = "ernie4_5";
  f.model_types = {"ernie4_5"};
  f.architecture = "Ernie4_5ForCausalLM";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};  // as llama (peft has no default for ernie4_5)
  f.prefix = "model.";
  f.features = {"rope_interleaved"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family ernie4_5 = make();
}  // namespace families

}  // namespace ds::models
