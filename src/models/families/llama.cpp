// LLaMA 2/3, Mistral, Qwen2 and Qwen3: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM (transformers 5; 4.x configs read too). One module layout (nn::Layout::llama),
// four classes that differ in biases, q/k norms and defaults.
//
//   [model.]embed_tokens.weight, [model.]layers.{i}.input_layernorm.weight,
//   [model.]layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q/k/v .bias: qkv_bias or bias),
//   [model.]layers.{i}.self_attn.{q,k}_norm.weight (qwen3), ...post_attention_layernorm.weight,
//   [model.]layers.{i}.mlp.{gate,up,down}_proj.weight, [model.]norm.weight, lm_head.weight
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

// Defaults from transformers 5's configuration_{llama,mistral,qwen2,qwen3}.py.
hf::DecoderDefaults defaults_of(const std::string& type) {
  hf::DecoderDefaults d;
  if (type == "mistral") {
    d.max_positions = 131072;
    d.kv_heads = 8;
  } else if (type == "qwen2" || type == "qwen3") {
    d.max_positions = 32768;
    d.kv_heads = 32;
    if (type == "qwen3") d.head_dim = 128;
  }
  return d;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  if (type == "llama") handled.insert({"attention_bias", "mlp_bias"});
  if (type == "mistral") handled.insert("sliding_window");
  if (type == "qwen2" || type == "qwen3")
    handled.insert(
        {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "use_mrope"});
  if (type == "qwen3") handled.insert("attention_bias");
  hf::check_known_fields(j, handled, type, source);

  GPTConfig c = hf::read_decoder_fields(j, type, source, defaults_of(type));
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for model_type {} (rotary "
           "embedding on the whole head only)",
           source, c.partial_rotary_factor, type);
  if (type == "llama") {
    const bool ab = hf::get_field<bool>(j, "attention_bias", false, source);
    const bool mb = hf::get_field<bool>(j, "mlp_bias", false, source);
    DS_CHECK(ab == mb,
             "[hf_io] {}: attention_bias {} with mlp_bias {} is not supported (both or neither)",
             source, ab, mb);
    c.bias = ab;
  } else if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2: q/k/v always carry biases, o_proj and the MLP none
  } else if (type == "qwen3") {
    c.qk_norm = true;
    DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
             "[hf_io] {}: attention_bias true is not supported for qwen3", source);
  }
  if (type == "mistral") {
    // Keys within the window see every earlier key: up to the window the attention is plain
    // causal attention, so sequences are limited to the window instead of implementing it.
    const int64_t w = hf::get_field<int64_t>(j, "sliding_window", 0, source);
    DS_CHECK(w >= 0, "[hf_io] {}: sliding_window {} must be >= 0", source, w);
    if (w > 0) {
      c.sliding_window = w;
      c.block_size = std::min(c.block_size, w);
    }
  }
  if (type == "qwen2" || type == "qwen3") {
    const int64_t window_layers = hf::get_field<int64_t>(j, "max_window_layers", 28, source);
    DS_CHECK(
        !hf::get_field<bool>(j, "use_sliding_window", false, source) || window_layers >= c.n_layer,
        "[hf_io] {}: use_sliding_window true (layers >= max_window_layers {} slide) is not "
        "supported: sliding-window attention is not implemented",
        source, window_layers);
    DS_CHECK(!hf::get_field<bool>(j, "use_mrope", false, source),
             "[hf_io] {}: use_mrope true (multimodal rotary sections) is not supported", source);
    if (j.contains("layer_types") && !j["layer_types"].is_null())
      for (const auto& t : j["layer_types"])
        DS_CHECK(t == "full_attention",
                 "[hf_io] {}: layer_types holds {}: only full_attention layers are supported",
                 source, t.dump());
  }
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  const std::string fam = c.resolved_family();
  if (fam == "llama") {
    j["attention_bias"] = c.bias;
    j["mlp_bias"] = c.bias;
  } else if (fam == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  } else {  // qwen2, qwen3: full attention in every layer
    if (fam == "qwen3") j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
    j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.n_layer), "full_attention");
  }
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  return std::regex_match(name, rotary);
}

void check(const GPTConfig& c) {
  const std::string fam = c.resolved_family();
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family \"{}\" needs the llama layout", fam);
  DS_CHECK(fam != "qwen3" || (c.qk_norm && !c.bias && !c.qkv_bias),
           "[model] family qwen3 has qk_norm and no biases");
  DS_CHECK(fam != "qwen2" || (c.qkv_bias && !c.bias),
           "[model] family qwen2 has q/k/v biases only: qkv_bias true, bias false");
  DS_CHECK(fam == "qwen2" || !c.qkv_bias || c.bias,
           "[model] qkv_bias (q/k/v biases alone) needs family qwen2 or glm (got {})", fam);
  DS_CHECK(fam != "mistral" || !c.bias, "[model] family mistral has no biases");
}

Family make(const std::string& name, const std::string& arch) {
  Family f;
  f.name = name;
  f.model_types = {name};
  f.architecture = arch;
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  if (name == "qwen3") f.features = {"qk_norm"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family llama = make("llama", "LlamaForCausalLM");
const Family mistral = make("mistral", "MistralForCausalLM");
const Family qwen2 = make("qwen2", "Qwen2ForCausalLM");
const Family qwen3 = make("qwen3", "Qwen3ForCausalLM");
}  // namespace families

}  // namespace ds::models
