// Gemma (v1): GemmaForCausalLM ("gemma": gemma-2b, gemma-7b, CodeGemma, the 1.1 releases;
// transformers 5, 4.x configs read too). The llama layout with three of Gemma's choices, each a
// GPTConfig feature: RMSNorm scaling by (1 + w) (norm_unit_offset), GeGLU with gelu_pytorch_tanh
// (geglu), token embeddings times sqrt(hidden_size) rounded to the embedding's dtype (embed_scale);
// head_dim apart from hidden_size / heads (256; gemma-7b's C 3072 / NH 16 is 192), a tied head,
// scores scaled by head_dim^-0.5, no sandwich norms, no soft-capping and no sliding window
// (Gemma 2 and 3 add those: gemma.cpp).
//
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
//   model.layers.{i}.post_attention_layernorm.weight,
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight; lm_head.weight only when
//   untied.
//
// The activation: transformers 5.24's GemmaMLP applies hidden_act, turning the released configs'
// "gelu" into gelu_pytorch_tanh; 4.x applied hidden_activation (gelu_pytorch_tanh when null) and
// ignored hidden_act. Both read the same for hidden_act gelu / gelu_pytorch_tanh with
// hidden_activation null or gelu_pytorch_tanh; anything else is refused by name.
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

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert({"hidden_activation", "attention_bias", "use_bidirectional_attention"});
  hf::check_known_fields(j, handled, type, source);
  const auto act = hf::get_field<std::string>(j, "hidden_act", "gelu_pytorch_tanh", source);
  DS_CHECK(act == "gelu_pytorch_tanh" || act == "gelu",
           "[hf_io] {}: hidden_act \"{}\" is not supported for gemma (gelu_pytorch_tanh, or "
           "gelu, which GemmaConfig turns into it)",
           source, act);
  const auto act4 = hf::get_field<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", source);
  DS_CHECK(act4 == "gelu_pytorch_tanh",
           "[hf_io] {}: hidden_activation \"{}\" is not supported for gemma (gelu_pytorch_tanh)",
           source, act4);
  DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
           "[hf_io] {}: attention_bias true is not supported for gemma", source);
  DS_CHECK(!hf::get_field<bool>(j, "use_bidirectional_attention", false, source),
           "[hf_io] {}: use_bidirectional_attention true is not supported; decoders attend "
           "causally",
           source);
  json jj = j;
  jj.erase("hidden_act");  // checked above: read_decoder_fields knows silu only
  jj.erase("hidden_activation");
  // GemmaConfig's defaults (gemma-7b's sizes).
  if (!has(jj, "intermediate_size")) jj["intermediate_size"] = 24576;
  hf::DecoderDefaults d;
  d.vocab_size = 256000;
  d.max_positions = 8192;
  d.hidden_size = 3072;
  d.layers = 28;
  d.heads = 16;
  d.kv_heads = 16;
  d.head_dim = 256;
  d.rms_norm_eps = 1e-6f;
  d.tie_word_embeddings = true;
  GPTConfig c = hf::read_decoder_fields(jj, type, source, d);
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for gemma (rotary embedding on "
           "the whole head only)",
           source, c.partial_rotary_factor);
  c.norm_unit_offset = c.geglu = c.embed_scale = true;
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["attention_bias"] = false;
  j["use_bidirectional_attention"] = false;
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex buffer(
      R"((model\.)?((layers\.\d+\.self_attn\.)?rotary_emb\..*inv_freq|embed_tokens\.embed_scale))");
  return std::regex_match(name, buffer);
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family gemma needs the llama layout");
  DS_CHECK(c.norm_unit_offset && c.geglu && c.embed_scale,
           "[model] family gemma has (1 + w) norms, GeGLU and scaled embeddings: "
           "norm_unit_offset, geglu and embed_scale true");
  DS_CHECK(!c.bias && !c.qkv_bias, "[model] family gemma has no biases");
  DS_CHECK(c.sliding_window == 0, "[model] family gemma attends to every key (sliding_window 0)");
}

Family make() {
  Family f;
  f.name = "gemma";
  f.model_types = {"gemma"};
  f.architecture = "GemmaForCausalLM";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};  // peft's default for gemma
  f.prefix = "model.";
  f.features = {"norm_unit_offset", "geglu", "embed_scale"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family gemma = make();
}  // namespace families

}  // namespace ds::models
