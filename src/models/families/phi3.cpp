// Phi-3: transformers' Phi3ForCausalLM ("phi3"; Phi-3-mini and -medium 4k and 128k, Phi-3.5-mini,
// Phi-4-mini; not Phi-3-small, whose remote-code "phi3small" is other math). The math is the llama
// layout's; the file fuses projections and the 128k models scale their rotary frequencies with
// LongRoPE.
//
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.qkv_proj.weight = [q_proj; k_proj; v_proj]
//       (NH*hd + 2*KV*hd, C): parts of different sizes under grouped-query attention,
//   model.layers.{i}.self_attn.o_proj.weight, model.layers.{i}.post_attention_layernorm.weight,
//   model.layers.{i}.mlp.gate_up_proj.weight = [gate_proj; up_proj] (2H, C),
//   model.layers.{i}.mlp.down_proj.weight, model.norm.weight, lm_head.weight (or tied)
//
// No biases, rotate_half pairs on the first head_dim * partial_rotary_factor dims, rope_type
// default or longrope ("su" and "yarn" are longrope to Phi3Config). LongRoPE's
// original_max_position_embeddings is the top-level field (default 4096), which transformers puts
// over rope_parameters' own. resid_pdrop is our dropout; embd_pdrop is not used by the class.
#include <algorithm>
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

constexpr int64_t kOriginalMaxPositions = 4096;  // Phi3Config's original_max_position_embeddings

// The rope dict transformers reads (rope_scaling wins over rope_parameters), or nullptr.
json* rope_dict(json& j) {
  for (const char* k : {"rope_scaling", "rope_parameters"})
    if (j.contains(k) && j[k].is_object()) return &j[k];
  return nullptr;
}

// config.json as Phi3Config reads it, in the form hf::read_decoder_fields reads: "su" and "yarn"
// are longrope, whose original_max_position_embeddings is the top-level field's (default 4096);
// the top-level field is dropped (it means nothing to the other rope types).
json normalized(const json& j) {
  json jj = j;
  const json top = jj.value("original_max_position_embeddings", json());
  jj.erase("original_max_position_embeddings");
  if (!jj.contains("intermediate_size") || jj["intermediate_size"].is_null())
    jj["intermediate_size"] = 8192;
  json* rp = rope_dict(jj);
  if (rp == nullptr) return jj;
  for (const char* k : {"rope_type", "type"})
    if (rp->contains(k) && (*rp)[k].is_string()) {
      if ((*rp)[k] == "su" || (*rp)[k] == "yarn") (*rp)[k] = "longrope";
      if ((*rp)[k] == "longrope")
        (*rp)["original_max_position_embeddings"] =
            top.is_null() ? json(kOriginalMaxPositions) : top;
      break;
    }
  return jj;
}

hf::DecoderDefaults defaults() {
  hf::DecoderDefaults d;  // Phi3Config's (Phi-3-mini-4k)
  d.vocab_size = 32064;
  d.max_positions = 4096;
  d.hidden_size = 3072;
  d.layers = 32;
  d.heads = 32;
  d.rms_norm_eps = 1e-5f;
  d.longrope = true;
  return d;
}

// What Phi3ForCausalLM can express: no biases or q/k norms, rotate_half pairs, rope default or
// longrope with one factor per rotary pair.
void check_phi3(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family phi3 needs the llama layout");
  DS_CHECK(!c.bias && !c.qkv_bias, "[model] family phi3 has no biases: bias and qkv_bias false");
  const nn::RopeScaling& s = c.rope_scaling;
  DS_CHECK(s.is_default() || s.type == "longrope",
           "[model] family phi3 has rope_type default or longrope, not {}", s.type);
  const size_t pairs = static_cast<size_t>(c.rotary_dim() / 2);
  DS_CHECK(
      s.type != "longrope" || (s.short_factor.size() == pairs && s.long_factor.size() == pairs),
      "[model] longrope's short_factor and long_factor need one factor per rotary pair ({} = "
      "rotary dims {} / 2), got {} and {}",
      pairs, c.rotary_dim(), s.short_factor.size(), s.long_factor.size());
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  // auto_map: Phi-3's first checkpoints name their remote code, the same class as transformers'.
  handled.insert({"resid_pdrop", "embd_pdrop", "sliding_window", "attention_bias", "auto_map"});
  hf::check_known_fields(j, handled, type, source);
  // Phi3ForCausalLM has no biases whatever attention_bias says: a true would mean bias tensors
  // that transformers drops, so it is refused rather than guessed.
  DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
           "[hf_io] {}: attention_bias true is not supported for phi3 (Phi3ForCausalLM has no "
           "biases)",
           source);
  GPTConfig c = hf::read_decoder_fields(normalized(j), type, source, defaults());
  // Dropout is training-only; ours sits where resid_pdrop does (attention and MLP outputs).
  DS_CHECK(hf::get_field<float>(j, "attention_dropout", 0.0f, source) == 0.0f,
           "[hf_io] {}: attention_dropout {} (dropout on attention probabilities) is not "
           "supported for phi3; set it to 0 (resid_pdrop is read as our dropout)",
           source, j.value("attention_dropout", json()).dump());
  c.dropout = hf::get_field<float>(j, "resid_pdrop", 0.0f, source);
  // As Mistral's: within the window sliding attention is causal attention, so sequences are
  // limited to it (Phi-3-mini-4k: 2047) instead of implementing it.
  const int64_t w = hf::get_field<int64_t>(j, "sliding_window", 0, source);
  DS_CHECK(w >= 0, "[hf_io] {}: sliding_window {} must be >= 0", source, w);
  if (w > 0) {
    c.sliding_window = w;
    c.block_size = std::min(c.block_size, w);
  }
  return c;  // hf_config_from_json validates it (check_phi3 among the rest)
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["resid_pdrop"] = j["attention_dropout"];
  j["attention_dropout"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  // Phi3Config puts its top-level field over rope_parameters' for longrope.
  if (c.rope_scaling.type == "longrope")
    j["original_max_position_embeddings"] = c.rope_scaling.original_max_position;
  // Phi3Config's default pad_token_id (32000) becomes the embedding's padding_idx, which torch
  // refuses outside the vocabulary: name it only where it exists.
  j["pad_token_id"] = c.vocab_size > 32000 ? json(32000) : json(nullptr);
  return j;
}

// "layers.3.self_attn.k_proj.weight" -> ("layers.3.", "self_attn.k_proj.weight").
std::pair<std::string, std::string> split_layer(const std::string& ours) {
  static const std::regex layer(R"((layers\.\d+\.)(.*))");
  std::smatch m;
  if (std::regex_match(ours, m, layer)) return {m[1].str(), m[2].str()};
  return {"", ours};
}

// Stacked parts take their rows from our parameters' shapes (hf_io), so q (NH*hd rows) and k, v
// (KV*hd rows each) need nothing more than their order.
HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  const auto [layer, rest] = split_layer(ours);
  const std::string p = "model." + layer;
  if (rest == "self_attn.q_proj.weight") return {p + "self_attn.qkv_proj.weight", 0, 3};
  if (rest == "self_attn.k_proj.weight") return {p + "self_attn.qkv_proj.weight", 1, 3};
  if (rest == "self_attn.v_proj.weight") return {p + "self_attn.qkv_proj.weight", 2, 3};
  if (rest == "mlp.gate_proj.weight") return {p + "mlp.gate_up_proj.weight", 0, 2};
  if (rest == "mlp.up_proj.weight") return {p + "mlp.gate_up_proj.weight", 1, 2};
  return {"model." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.\w*inv_freq)");
  return std::regex_match(name, rotary);
}

Family make() {
  Family f;
  f.name = "phi3";
  f.model_types = {"phi3"};
  f.architecture = "Phi3ForCausalLM";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  f.features = {"partial_rotary_factor", "rope type longrope"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check_phi3;
  return f;
}

}  // namespace

namespace families {
const Family phi3 = make();
}  // namespace families

}  // namespace ds::models
