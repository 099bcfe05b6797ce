// GLM: transformers' GlmForCausalLM ("glm", GLM-4 0414's predecessor glm-4-9b-hf) and
// Glm4ForCausalLM ("glm4", with sandwich norms), and ChatGLM2/3's remote-code checkpoints
// ("chatglm"), which are the same math under other names and are imported as glm.
//
// The module is the llama layout with: q/k/v biases (attention_bias) and none on o_proj or the MLP,
// rotary embedding on the first head_dim * partial_rotary_factor dims (0.5 by default) rotating
// pairs (2i, 2i+1), an untied head, and for glm4 an RMSNorm after attention and after the MLP.
//
//   glm/glm4:  model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//              model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}, ...o_proj.weight,
//              model.layers.{i}.post_attention_layernorm.weight,
//              model.layers.{i}.mlp.gate_up_proj.weight = [gate_proj; up_proj] (2H, C),
//              model.layers.{i}.mlp.down_proj.weight, (glm4) post_self_attn_layernorm.weight and
//              post_mlp_layernorm.weight, model.norm.weight, lm_head.weight
//   chatglm:   transformer.embedding.word_embeddings.weight,
//              transformer.encoder.layers.{i}.input_layernorm.weight,
//              ...self_attention.query_key_value.{weight,bias} = [q; k; v] (NH*hd + 2*G*hd, C),
//              ...self_attention.dense.weight, ...post_attention_layernorm.weight,
//              ...mlp.dense_h_to_4h.weight = [gate; up], ...mlp.dense_4h_to_h.weight,
//              transformer.encoder.final_layernorm.weight, transformer.output_layer.weight;
//              rope base 10000 * rope_ratio, rotary dims kv_channels / 2.
// ChatGLM-6B (v1: 2D rotary, prefix-LM mask, alpha-scaled residuals) is different math and is
// refused by name.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

// ---- glm, glm4 ----

GPTConfig read_glm(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert("attention_bias");
  hf::check_known_fields(j, handled, type, source);
  // GlmConfig / Glm4Config default partial_rotary_factor to 0.5 when the config names none.
  json jj = j;
  auto names_factor = [](const json& o) {
    return o.is_object() && o.contains("partial_rotary_factor") &&
           !o["partial_rotary_factor"].is_null();
  };
  bool named = names_factor(j);
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (j.contains(k) && j[k].is_object()) {
      named = named || names_factor(j[k]);
      for (const auto& [lt, v] : j[k].items()) named = named || names_factor(v);
    }
  if (!named) jj["partial_rotary_factor"] = 0.5;
  hf::DecoderDefaults d;
  d.vocab_size = 151552;
  d.max_positions = 131072;
  d.hidden_size = 4096;
  d.layers = 40;
  d.heads = 32;
  d.kv_heads = 2;
  d.head_dim = 128;
  d.rms_norm_eps = 1.5625e-07f;
  GPTConfig c = hf::read_decoder_fields(jj, type, source, d);
  // q/k/v biases follow attention_bias (default true); o_proj and the MLP never have one.
  c.qkv_bias = hf::get_field<bool>(j, "attention_bias", true, source);
  c.rope_interleaved = true;
  c.sandwich_norm = type == "glm4";
  DS_CHECK(c.rotary_dim() > 0 && c.rotary_dim() % 2 == 0,
           "[hf_io] {}: partial_rotary_factor {} gives {} rotary dims of head_dim {}; they must "
           "be even and positive",
           source, c.partial_rotary_factor, c.rotary_dim(), c.head_dim());
  return c;
}

json write_glm(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["attention_bias"] = c.qkv_bias;
  // The default would be 0.5: write it even when 1 (in rope_parameters, where transformers 5
  // reads it).
  j["rope_parameters"]["partial_rotary_factor"] = hf::shortest(c.partial_rotary_factor);
  // GlmConfig's default pad_token_id (151329, GLM-4's <|endoftext|>) becomes the embedding's
  // padding_idx, which torch refuses outside the vocabulary: name it only where it exists.
  j["pad_token_id"] = c.vocab_size > 151329 ? json(151329) : json(nullptr);
  return j;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "layers.3.mlp.gate_proj.weight" -> ("layers.3.", "mlp.gate_proj.weight"); ("", ours) elsewhere.
std::pair<std::string, std::string> split_layer(const std::string& ours) {
  static const std::regex layer(R"((layers\.\d+\.)(.*))");
  std::smatch m;
  if (std::regex_match(ours, m, layer)) return {m[1].str(), m[2].str()};
  return {"", ours};
}

HFPlace place_glm(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  const auto [layer, rest] = split_layer(ours);
  if (rest == "mlp.gate_proj.weight") return {"model." + layer + "mlp.gate_up_proj.weight", 0, 2};
  if (rest == "mlp.up_proj.weight") return {"model." + layer + "mlp.gate_up_proj.weight", 1, 2};
  return {"model." + ours};
}

bool is_buffer_glm(const std::string& name) {
  return ends_with(name, "rotary_emb.inv_freq");
}

void check_glm(const GPTConfig& c) {
  const std::string fam = c.resolved_family();
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family \"{}\" needs the llama layout", fam);
  DS_CHECK(!c.bias && c.sliding_window == 0,
           "[model] family {} has q/k/v biases at most (qkv_bias), no other biases and no sliding "
           "window",
           fam);
  DS_CHECK(c.rope_interleaved, "[model] family {} rotates pairs (2i, 2i+1): rope_interleaved true",
           fam);
  DS_CHECK(c.sandwich_norm == (fam == "glm4"),
           "[model] sandwich_norm is {} for family {} (glm4 has it, glm has not)",
           c.sandwich_norm, fam);
}

// ---- chatglm (ChatGLM2-6B, ChatGLM3-6B; remote code) ----

GPTConfig read_chatglm(const json& j, const std::string&, const std::string& source) {
  // ChatGLM-6B (v1) is another model: say which ones are read instead.
  DS_CHECK(!j.contains("position_encoding_2d") && !j.contains("inner_hidden_size") &&
               !j.contains("gmask_token_id"),
           "[hf_io] {}: this is ChatGLM-6B (v1: 2D rotary positions, prefix-LM attention, "
           "alpha-scaled residuals), which is not supported; ChatGLM2-6B, ChatGLM3-6B "
           "(model_type chatglm with multi_query_attention) and GLM-4 (model_type glm or glm4) "
           "are",
           source);
  static const std::set<std::string> handled = {
      "num_layers", "padded_vocab_size", "vocab_size", "hidden_size", "ffn_hidden_size",
      "kv_channels", "num_attention_heads", "seq_length", "hidden_dropout", "attention_dropout",
      "classifier_dropout", "layernorm_epsilon", "rmsnorm", "apply_residual_connection_post_layernorm",
      "post_layer_norm", "add_bias_linear", "add_qkv_bias", "bias_dropout_fusion",
      "multi_query_attention", "multi_query_group_num", "rope_ratio",
      "apply_query_key_layer_scaling", "attention_softmax_in_fp32", "fp32_residual_connection",
      "quantization_bit", "pre_seq_len", "prefix_projection", "original_rope", "auto_map",
      "interleaved_qkv", "tie_word_embeddings"};
  hf::check_known_fields(j, handled, "chatglm", source);
  auto get_i = [&](const char* k, int64_t d) { return hf::get_field<int64_t>(j, k, d, source); };
  auto get_b = [&](const char* k, bool d) { return hf::get_field<bool>(j, k, d, source); };
  // Switches that change the math from what ChatGLM2/3 ship with.
  DS_CHECK(get_b("rmsnorm", true), "[hf_io] {}: rmsnorm false (LayerNorm) is not supported", source);
  DS_CHECK(!get_b("apply_residual_connection_post_layernorm", false),
           "[hf_io] {}: apply_residual_connection_post_layernorm true is not supported", source);
  DS_CHECK(get_b("post_layer_norm", true),
           "[hf_io] {}: post_layer_norm false (no final norm) is not supported", source);
  DS_CHECK(!get_b("add_bias_linear", false),
           "[hf_io] {}: add_bias_linear true is not supported (ChatGLM2/3 have q/k/v biases only)",
           source);
  DS_CHECK(!get_b("interleaved_qkv", false),
           "[hf_io] {}: interleaved_qkv true is not supported", source);
  DS_CHECK(get_b("original_rope", true), "[hf_io] {}: original_rope false is not supported",
           source);
  DS_CHECK(!j.contains("quantization_bit") || j["quantization_bit"].is_null() ||
               j["quantization_bit"] == 0,
           "[hf_io] {}: quantization_bit {} (a quantized checkpoint) is not supported", source,
           j.value("quantization_bit", json()).dump());
  DS_CHECK(!j.contains("pre_seq_len") || j["pre_seq_len"].is_null(),
           "[hf_io] {}: pre_seq_len {} (a P-tuning v2 prefix encoder) is not supported", source,
           j.value("pre_seq_len", json()).dump());
  hf::check_dtype_fields(j, source);
  GPTConfig c = GPTConfig::defaults(nn::Layout::llama);
  c.family = "chatglm";
  c.n_layer = get_i("num_layers", 28);
  c.vocab_size = get_i("padded_vocab_size", 65024);
  c.n_embd = get_i("hidden_size", 4096);
  c.n_head = get_i("num_attention_heads", 32);
  c.ffn_hidden = get_i("ffn_hidden_size", 13696);
  c.block_size = get_i("seq_length", 32768);
  c.norm_eps = hf::get_field<float>(j, "layernorm_epsilon", 1e-5f, source);
  // Our dropout sits on the attention and MLP outputs: ChatGLM's hidden_dropout (0 in its configs).
  c.dropout = hf::get_field<float>(j, "hidden_dropout", 0.0f, source);
  c.tie_embeddings = get_b("tie_word_embeddings", false);
  const int64_t hd = get_i("kv_channels", c.n_head > 0 ? c.n_embd / c.n_head : 0);
  DS_CHECK(hd > 0, "[hf_io] {}: kv_channels {} must be positive", source, hd);
  c.head_size = c.n_head > 0 && c.n_embd % c.n_head == 0 && hd == c.n_embd / c.n_head ? 0 : hd;
  if (get_b("multi_query_attention", false)) {
    const int64_t g = get_i("multi_query_group_num", 1);
    DS_CHECK(g > 0 && c.n_head % g == 0,
             "[hf_io] {}: multi_query_group_num {} must divide num_attention_heads {}", source, g,
             c.n_head);
    c.n_kv_head = g == c.n_head ? 0 : g;
  }
  c.qkv_bias = get_b("add_qkv_bias", true);
  const double ratio = hf::get_field<double>(j, "rope_ratio", 1.0, source);
  DS_CHECK(ratio > 0.0, "[hf_io] {}: rope_ratio {} must be positive", source, ratio);
  c.rope_theta = static_cast<float>(10000.0 * ratio);
  c.partial_rotary_factor = 0.5f;  // RotaryEmbedding(kv_channels // 2)
  c.rope_interleaved = true;
  return c;
}

HFPlace place_chatglm(const GPTConfig&, const std::string& ours) {
  if (ours == "embed_tokens.weight") return {"transformer.embedding.word_embeddings.weight"};
  if (ours == "norm.weight") return {"transformer.encoder.final_layernorm.weight"};
  if (ours == "lm_head.weight") return {"transformer.output_layer.weight"};
  const auto [layer, rest] = split_layer(ours);
  const std::string p = "transformer.encoder." + layer;
  static const std::regex qkv(R"(self_attn\.([qkv])_proj\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(rest, m, qkv)) {
    const int part = m[1].str() == "q" ? 0 : m[1].str() == "k" ? 1 : 2;
    return {p + "self_attention.query_key_value." + m[2].str(), part, 3};
  }
  if (rest == "self_attn.o_proj.weight") return {p + "self_attention.dense.weight"};
  if (rest == "mlp.gate_proj.weight") return {p + "mlp.dense_h_to_4h.weight", 0, 2};
  if (rest == "mlp.up_proj.weight") return {p + "mlp.dense_h_to_4h.weight", 1, 2};
  if (rest == "mlp.down_proj.weight") return {p + "mlp.dense_4h_to_h.weight"};
  return {p + rest};  // input_layernorm, post_attention_layernorm
}

bool is_buffer_chatglm(const std::string& name) {
  return ends_with(name, "rotary_pos_emb.inv_freq");
}

void check_chatglm(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama && !c.bias && c.rope_interleaved &&
               c.partial_rotary_factor == 0.5f,
           "[model] family chatglm is ChatGLM2/3's layout: llama layout, q/k/v biases at most, "
           "rotary on half of each head (pairs 2i, 2i+1), no other norms");
}

Family make_glm(const std::string& name, const std::string& arch) {
  Family f;
  f.name = name;
  f.model_types = {name};
  f.architecture = arch;
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  f.features = {"partial_rotary_factor", "rope_interleaved"};
  if (name == "glm4") f.features.push_back("sandwich_norm");
  f.decoder.read_config = read_glm;
  f.decoder.write_config = write_glm;
  f.decoder.place = place_glm;
  f.is_buffer = is_buffer_glm;
  f.decoder.check = check_glm;
  return f;
}

Family make_chatglm() {
  Family f;
  f.name = "chatglm";
  f.model_types = {"chatglm"};
  f.architecture = "ChatGLMForConditionalGeneration";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "";  // names are placed whole
  f.export_as = "glm";  // remote code: exported as native glm, which transformers loads itself
  f.features = {"partial_rotary_factor", "rope_interleaved"};
  f.decoder.read_config = read_chatglm;
  f.decoder.write_config = write_glm;
  f.decoder.place = place_chatglm;
  f.is_buffer = is_buffer_chatglm;
  f.decoder.check = check_chatglm;
  return f;
}

}  // namespace

namespace families {
const Family glm = make_glm("glm", "GlmForCausalLM");
const Family glm4 = make_glm("glm4", "Glm4ForCausalLM");
const Family chatglm = make_chatglm();
}  // namespace families

}  // namespace ds::models
