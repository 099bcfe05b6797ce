#include "ds/models/hf_io.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <type_traits>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/json_text.h"
#include "ds/core/safetensors.h"
#include "ds/ops/ops.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const char* prefix_of(nn::Layout layout) {
  return layout == nn::Layout::gpt2 ? "transformer." : "model.";
}

// Our name for a file tensor name: the model prefix stripped (lm_head.weight has none).
std::string strip_prefix(nn::Layout layout, const std::string& name) {
  const std::string p = prefix_of(layout);
  return name.rfind(p, 0) == 0 ? name.substr(p.size()) : name;
}

// Tensors some files carry that are not parameters: GPT-2's causal-mask buffers, LLaMA's rotary
// frequencies, and the LM head when it is tied to the token embedding (Hugging Face may save it).
bool ignorable(const GPTConfig& c, const std::string& ours) {
  static const std::regex gpt2_buffers(R"(h\.\d+\.attn\.(masked_)?bias)");
  static const std::regex llama_buffers(R"(layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  if (c.tie_embeddings && ours == "lm_head.weight") return true;
  return std::regex_match(ours, c.layout == nn::Layout::gpt2 ? gpt2_buffers : llama_buffers);
}

// Index of the first NaN or Inf of a contiguous floating-point tensor (f32, bf16, f16), or -1.
// Tested by exponent bits (all ones), a block at a time so the common all-finite case vectorises.
int64_t first_non_finite(const Tensor& t) {
  const int64_t n = t.numel();
  auto scan = [n](const auto* p, auto mask) -> int64_t {
    constexpr int64_t kBlock = 4096;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= (p[i] & mask) == mask;
      if (!any) continue;
      for (int64_t i = b; i < e; ++i)
        if ((p[i] & mask) == mask) return i;
    }
    return -1;
  };
  switch (t.dtype()) {
    case DType::f32:
      return scan(static_cast<const uint32_t*>(t.raw_data()), uint32_t{0x7F800000});
    case DType::bf16:
      return scan(static_cast<const uint16_t*>(t.raw_data()), uint16_t{0x7F80});
    case DType::f16:
      return scan(static_cast<const uint16_t*>(t.raw_data()), uint16_t{0x7C00});
    default:
      return -1;
  }
}

// The safetensors files of a folder or the file itself.
std::vector<fs::path> weight_files(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  DS_CHECK(fs::is_directory(path, ec),
           "[hf_io] '{}' does not exist; --init_from takes a Hugging Face model folder "
           "(config.json + model.safetensors) or a .safetensors file",
           path.string());
  if (fs::is_regular_file(path / "model.safetensors")) return {path / "model.safetensors"};
  const fs::path index = path / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      DS_THROW("[hf_io] {}: not valid JSON ({})", index.string(), e.what());
    }
    DS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
             "[hf_io] {}: no \"weight_map\" object", index.string());
    std::set<std::string> names;
    for (const auto& [k, v] : j["weight_map"].items()) {
      // Shards are files of this folder (model-00001-of-00002.safetensors). A name with a path in
      // it ("../x", "/etc/x", "sub/x") would read a file outside the model folder: refuse it. A
      // shard that is a symbolic link (the Hugging Face cache's blobs) is still fine.
      const std::string name = v.is_string() ? v.get<std::string>() : std::string();
      DS_CHECK(v.is_string() && !name.empty() && name != "." && name != ".." &&
                   name.find_first_of("/\\") == std::string::npos && name.find('\0') == std::string::npos,
               "[hf_io] {}: weight_map[\"{}\"] = {} is not a file name in the model folder (shards "
               "must sit beside the index, without a path); the index is damaged or not from "
               "save_pretrained: fix or re-export it",
               index.string(), k, json_show(v));
      names.insert(name);
    }
    std::vector<fs::path> out;
    for (const auto& n : names) out.push_back(path / n);
    return out;
  }
  std::vector<std::string> seen;
  for (const auto& e : fs::directory_iterator(path)) seen.push_back(e.path().filename().string());
  std::sort(seen.begin(), seen.end());
  const bool has_bin = std::find(seen.begin(), seen.end(), "pytorch_model.bin") != seen.end();
  DS_THROW(
      "[hf_io] {}: no model.safetensors or model.safetensors.index.json (the folder holds: {}){}",
      path.string(),
      seen.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(seen, ", ")),
      has_bin ? "; pytorch_model.bin is a pickle, which is not read here: convert it with "
                "transformers (model.save_pretrained(dir, safe_serialization=True))"
              : "");
}

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

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DS_CHECK(out.good(), "[hf_io] cannot write '{}'", tmp.string());
    out << text;
    out.flush();
    if (!out.good()) {
      out.close();
      fs::remove(tmp, ec);  // a full disk must not leave the temporary behind
      DS_THROW("[hf_io] write to '{}' failed (disk full?)", tmp.string());
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    DS_THROW("[hf_io] cannot rename '{}' to '{}': {}", tmp.string(), path.string(), why);
  }
}

}  // namespace

std::string hf_name(nn::Layout layout, const std::string& ours) {
  if (ours == "lm_head.weight") return ours;
  return prefix_of(layout) + ours;
}

bool hf_transposed(nn::Layout layout, const std::string& ours) {
  if (layout != nn::Layout::gpt2 || !ends_with(ours, ".weight")) return false;
  for (const char* m : {".attn.c_attn.", ".attn.c_proj.", ".mlp.c_fc.", ".mlp.c_proj."})
    if (ours.find(m) != std::string::npos) return true;
  return false;
}

namespace {

bool is_llama_family(const std::string& type) {
  return type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3";
}

// Config keys that never change a model's math: bookkeeping, token ids, generation defaults and
// PretrainedConfig's generic switches. Anything neither handled nor listed here stops the import.
bool harmless_key(const std::string& k) {
  static const std::set<std::string> keys = {
      "architectures",
      "model_type",
      "transformers_version",
      "bos_token_id",
      "eos_token_id",
      "pad_token_id",
      "sep_token_id",
      "decoder_start_token_id",
      "use_cache",
      "initializer_range",
      "pretraining_tp",  // 4.x: split matmuls, the same math up to rounding (v5 drops it)
      "return_dict",
      "output_hidden_states",
      "output_attentions",
      "torchscript",
      "use_bfloat16",
      "pruned_heads",
      "chunk_size_feed_forward",
      "is_encoder_decoder",
      "is_decoder",
      "add_cross_attention",
      "tie_encoder_decoder",
      "finetuning_task",
      "id2label",
      "label2id",
      "tokenizer_class",
      "prefix",
      "task_specific_params",
      "problem_type",
      "max_length",
      "min_length",
      "do_sample",
      "early_stopping",
      "num_beams",
      "num_beam_groups",
      "diversity_penalty",
      "temperature",
      "top_k",
      "top_p",
      "typical_p",
      "repetition_penalty",
      "length_penalty",
      "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size",
      "bad_words_ids",
      "num_return_sequences",
      "output_scores",
      "return_dict_in_generate",
      "forced_bos_token_id",
      "forced_eos_token_id",
      "remove_invalid_values",
      "exponential_decay_length_penalty",
      "suppress_tokens",
      "begin_suppress_tokens",
      "cross_attention_hidden_size",
      "tf_legacy_loss",
      "dtype",
      "torch_dtype",
      "ds_cpp"};
  return keys.count(k) > 0 || (!k.empty() && k[0] == '_');  // _name_or_path, _attn_implementation
}

// The rope parameters of a llama-family config, merged as transformers 5 does: a 4.x top-level
// rope_scaling (with "type" or "rope_type") wins over rope_parameters; top-level rope_theta,
// partial_rotary_factor and original_max_position_embeddings fill what the dict lacks; 5.x
// rope_parameters nested by layer type must agree across types. `field` is the name errors use.
json rope_parameters_of(const json& j, const std::string& source, std::string& field) {
  json rp = json::object();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    rp = j["rope_scaling"];
    field = "rope_scaling";
  } else if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    rp = j["rope_parameters"];
    field = "rope_parameters";
  } else {
    field = "rope_parameters";
  }
  DS_CHECK(rp.is_object(), "[hf_io] {}: \"{}\" must be an object, got {}", source, field,
           rp.dump());
  // Nested by layer type ({"full_attention": {...}, "sliding_attention": {...}}): every value an
  // object. One set of frequencies per model here, so the layer types must agree.
  bool nested = !rp.empty();
  for (const auto& [k, v] : rp.items()) nested = nested && v.is_object();
  if (nested) {
    const auto first = rp.begin();
    for (const auto& [k, v] : rp.items())
      DS_CHECK(v == first.value(),
               "[hf_io] {}: \"{}\" differs between layer types \"{}\" and \"{}\"; per-layer "
               "rope parameters are not supported (one set for every layer)",
               source, field, first.key(), k);
    field += "." + first.key();
    rp = first.value();
  }
  if (!rp.contains("rope_theta"))
    rp["rope_theta"] =
        j.contains("rope_theta") && !j["rope_theta"].is_null() ? j["rope_theta"] : json(10000.0);
  if (!rp.contains("partial_rotary_factor") && j.contains("partial_rotary_factor") &&
      !j["partial_rotary_factor"].is_null())
    rp["partial_rotary_factor"] = j["partial_rotary_factor"];
  if (!rp.contains("original_max_position_embeddings") &&
      j.contains("original_max_position_embeddings"))
    rp["original_max_position_embeddings"] = j["original_max_position_embeddings"];
  return rp;
}

// rope_theta and RopeScaling from the merged rope parameters; unknown keys and types are errors.
void read_rope(const json& rp, const std::string& field, int64_t max_positions,
               const std::string& source, GPTConfig& c) {
  auto num = [&](const char* key) -> std::optional<double> {
    if (!rp.contains(key) || rp[key].is_null()) return std::nullopt;
    DS_CHECK(rp[key].is_number(), "[hf_io] {}: {}.{} must be a number, got {}", source, field, key,
             rp[key].dump());
    return rp[key].get<double>();
  };
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rp.contains(key) && rp[key].is_string()) {
      type = rp[key].get<std::string>();
      break;
    }
  nn::RopeScaling& s = c.rope_scaling;
  s = nn::RopeScaling{};
  s.type = type;
  const auto& names = nn::RopeScaling::type_names();
  DS_CHECK(std::find(names.begin(), names.end(), type) != names.end(),
           "[hf_io] {}: {}.rope_type \"{}\" is not supported (supported: {}); dynamic and "
           "longrope change the frequencies with the sequence length",
           source, field, type, fmt::join(names, ", "));
  c.rope_theta = static_cast<float>(*num("rope_theta"));
  if (auto p = num("partial_rotary_factor"))
    DS_CHECK(*p == 1.0,
             "[hf_io] {}: {}.partial_rotary_factor {} is not supported (rotary embedding on the "
             "whole head only)",
             source, field, *p);
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type != "default") {
    allowed.insert("factor");
    const auto f = num("factor");
    DS_CHECK(f || type == "yarn", "[hf_io] {}: {}.factor is required for rope_type {}", source,
             field, type);
    if (f) s.factor = *f;
  }
  if (type == "llama3" || type == "yarn") {
    allowed.insert("original_max_position_embeddings");
    const auto o = num("original_max_position_embeddings");
    s.original_max_position = o ? static_cast<int64_t>(*o) : max_positions;
  }
  if (type == "llama3") {
    allowed.insert({"low_freq_factor", "high_freq_factor"});
    const auto lo = num("low_freq_factor"), hi = num("high_freq_factor");
    DS_CHECK(lo && hi,
             "[hf_io] {}: {}.low_freq_factor and high_freq_factor are required for "
             "rope_type llama3",
             source, field);
    s.low_freq_factor = *lo;
    s.high_freq_factor = *hi;
  }
  if (type == "yarn") {
    allowed.insert(
        {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"});
    if (!num("factor"))  // transformers: the context extension itself
      s.factor = static_cast<double>(max_positions) / static_cast<double>(s.original_max_position);
    if (auto v = num("beta_fast"); v && *v != 0.0) s.beta_fast = *v;
    if (auto v = num("beta_slow"); v && *v != 0.0) s.beta_slow = *v;
    if (rp.contains("truncate") && !rp["truncate"].is_null()) {
      DS_CHECK(rp["truncate"].is_boolean(), "[hf_io] {}: {}.truncate must be true or false", source,
               field);
      s.truncate = rp["truncate"].get<bool>();
    }
    const auto af = num("attention_factor"), ms = num("mscale"), msa = num("mscale_all_dim");
    auto mscale = [&](double m) {
      return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0;
    };
    if (af) {
      s.attention_factor = *af;
    } else if (ms && msa && *ms != 0.0 && *msa != 0.0) {
      s.attention_factor = mscale(*ms) / mscale(*msa);  // DeepSeek's form
    }
  }
  for (const auto& [k, v] : rp.items())
    DS_CHECK(allowed.count(k), "[hf_io] {}: {}.{} is not understood for rope_type {} (known: {})",
             source, field, k, type, fmt::join(allowed, ", "));
  try {
    s.validate();
  } catch (const ds::Error& e) {
    DS_THROW("[hf_io] {}: {}: {}", source, field, e.what());
  }
}

// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM configs (defaults
// from transformers 5's configuration_*.py where a field is missing).
GPTConfig llama_family_config(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = {"vocab_size",
                                   "max_position_embeddings",
                                   "hidden_size",
                                   "num_hidden_layers",
                                   "num_attention_heads",
                                   "num_key_value_heads",
                                   "intermediate_size",
                                   "rms_norm_eps",
                                   "rope_theta",
                                   "rope_scaling",
                                   "rope_parameters",
                                   "partial_rotary_factor",
                                   "original_max_position_embeddings",
                                   "tie_word_embeddings",
                                   "attention_dropout",
                                   "hidden_act",
                                   "head_dim"};
  if (type == "llama") handled.insert({"attention_bias", "mlp_bias"});
  if (type == "mistral") handled.insert("sliding_window");
  if (type == "qwen2" || type == "qwen3")
    handled.insert(
        {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "use_mrope"});
  if (type == "qwen3") handled.insert("attention_bias");
  for (const auto& [k, v] : j.items())
    DS_CHECK(handled.count(k) || harmless_key(k),
             "[hf_io] {}: field \"{}\" is not understood for model_type {} and may change the "
             "model's math, so the import stops; docs/models.md lists the fields read (remove it "
             "from config.json only if you know it changes nothing)",
             source, k, type);

  GPTConfig c = GPTConfig::defaults(nn::Layout::llama);
  c.family = type;
  c.vocab_size = get_field<int64_t>(j, "vocab_size", 32000, source);
  const int64_t max_positions =
      get_field<int64_t>(j, "max_position_embeddings",
                         type == "mistral" ? 131072 : (type == "llama" ? 2048 : 32768), source);
  c.block_size = max_positions;
  c.n_embd = get_field<int64_t>(j, "hidden_size", 4096, source);
  c.n_layer = get_field<int64_t>(j, "num_hidden_layers", 32, source);
  c.n_head = get_field<int64_t>(j, "num_attention_heads", 32, source);
  c.ffn_hidden = get_field<int64_t>(j, "intermediate_size", 0, source);
  c.norm_eps = get_field<float>(j, "rms_norm_eps", 1e-6f, source);
  c.tie_embeddings = get_field<bool>(j, "tie_word_embeddings", false, source);
  c.dropout = get_field<float>(j, "attention_dropout", 0.0f, source);
  const int64_t kv_default = type == "mistral" ? 8 : (type == "llama" ? c.n_head : 32);
  const int64_t kv = get_field<int64_t>(j, "num_key_value_heads", kv_default, source);
  DS_CHECK(kv > 0 && c.n_head % kv == 0,
           "[hf_io] {}: num_key_value_heads {} must divide num_attention_heads {}", source, kv,
           c.n_head);
  c.n_kv_head = kv == c.n_head ? 0 : kv;
  const bool divisible = c.n_head > 0 && c.n_embd % c.n_head == 0;
  const int64_t hd_default = type == "qwen3" ? 128 : (divisible ? c.n_embd / c.n_head : 0);
  const int64_t hd = get_field<int64_t>(j, "head_dim", hd_default, source);
  DS_CHECK(hd > 0,
           "[hf_io] {}: head_dim {} must be positive (hidden_size {} / "
           "num_attention_heads {})",
           source, hd, c.n_embd, c.n_head);
  c.head_size = divisible && hd == c.n_embd / c.n_head ? 0 : hd;

  const auto act = get_field<std::string>(j, "hidden_act", "silu", source);
  DS_CHECK(act == "silu",
           "[hf_io] {}: hidden_act \"{}\" is not supported (the llama family uses silu)", source,
           act);
  if (type == "llama") {
    const bool ab = get_field<bool>(j, "attention_bias", false, source);
    const bool mb = get_field<bool>(j, "mlp_bias", false, source);
    DS_CHECK(ab == mb,
             "[hf_io] {}: attention_bias {} with mlp_bias {} is not supported (both or neither)",
             source, ab, mb);
    c.bias = ab;
  } else if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2: q/k/v always carry biases, o_proj and the MLP none
  } else if (type == "qwen3") {
    c.qk_norm = true;
    DS_CHECK(!get_field<bool>(j, "attention_bias", false, source),
             "[hf_io] {}: attention_bias true is not supported for qwen3", source);
  }
  if (type == "mistral") {
    // Keys within the window see every earlier key: up to the window the attention is plain
    // causal attention, so sequences are limited to the window instead of implementing it.
    const int64_t w = get_field<int64_t>(j, "sliding_window", 0, source);
    DS_CHECK(w >= 0, "[hf_io] {}: sliding_window {} must be >= 0", source, w);
    if (w > 0) {
      c.sliding_window = w;
      c.block_size = std::min(c.block_size, w);
    }
  }
  if (type == "qwen2" || type == "qwen3") {
    const int64_t window_layers = get_field<int64_t>(j, "max_window_layers", 28, source);
    DS_CHECK(!get_field<bool>(j, "use_sliding_window", false, source) || window_layers >= c.n_layer,
             "[hf_io] {}: use_sliding_window true (layers >= max_window_layers {} slide) is not "
             "supported: sliding-window attention is not implemented",
             source, window_layers);
    DS_CHECK(!get_field<bool>(j, "use_mrope", false, source),
             "[hf_io] {}: use_mrope true (multimodal rotary sections) is not supported", source);
    if (j.contains("layer_types") && !j["layer_types"].is_null())
      for (const auto& t : j["layer_types"])
        DS_CHECK(t == "full_attention",
                 "[hf_io] {}: layer_types holds {}: only full_attention layers are supported",
                 source, t.dump());
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const auto d = get_field<std::string>(j, key, "", source);
    DS_CHECK(d == "float32" || d == "bfloat16" || d == "float16" || d == "auto",
             "[hf_io] {}: {} \"{}\" is not supported (float32, bfloat16, float16)", source, key, d);
  }
  std::string field;
  const json rp = rope_parameters_of(j, source, field);
  read_rope(rp, field, max_positions, source, c);
  return c;
}

}  // namespace

GPTConfig hf_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: expected a JSON object", source);
  if (j.contains("ds_cpp")) {
    try {
      return GPTConfig::from_json(j["ds_cpp"]);
    } catch (const ds::Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  std::string type = get_field<std::string>(j, "model_type", "", source);
  if (type.empty() && j.contains("n_embd")) type = "gpt2";
  GPTConfig c;
  if (type == "gpt2") {
    // GPT2Config's fields; summary_* configure GPT2DoubleHeadsModel's classifier, and
    // reorder_and_upcast_attn only the precision of the scores; attention-probability dropout
    // (attn_pdrop) is training-only and not implemented (see docs/models.md).
    static const std::set<std::string> gpt2_fields = {"vocab_size",
                                                      "n_positions",
                                                      "n_ctx",
                                                      "n_embd",
                                                      "n_layer",
                                                      "n_head",
                                                      "n_inner",
                                                      "layer_norm_epsilon",
                                                      "resid_pdrop",
                                                      "embd_pdrop",
                                                      "attn_pdrop",
                                                      "tie_word_embeddings",
                                                      "activation_function",
                                                      "scale_attn_weights",
                                                      "scale_attn_by_inverse_layer_idx",
                                                      "reorder_and_upcast_attn",
                                                      "summary_type",
                                                      "summary_use_proj",
                                                      "summary_activation",
                                                      "summary_proj_to_labels",
                                                      "summary_first_dropout",
                                                      "n_special"};
    for (const auto& [k, v] : j.items())
      DS_CHECK(gpt2_fields.count(k) || harmless_key(k),
               "[hf_io] {}: field \"{}\" is not understood for model_type gpt2 and may change "
               "the model's math, so the import stops; docs/models.md lists the fields read "
               "(remove it from config.json only if you know it changes nothing)",
               source, k);
    c = GPTConfig::defaults(nn::Layout::gpt2);
    c.vocab_size = get_field<int64_t>(j, "vocab_size", 50257, source);
    c.block_size =
        get_field<int64_t>(j, "n_positions", get_field<int64_t>(j, "n_ctx", 1024, source), source);
    c.n_embd = get_field<int64_t>(j, "n_embd", 768, source);
    c.n_layer = get_field<int64_t>(j, "n_layer", 12, source);
    c.n_head = get_field<int64_t>(j, "n_head", 12, source);
    c.ffn_hidden = get_field<int64_t>(j, "n_inner", 0, source);
    c.norm_eps = get_field<float>(j, "layer_norm_epsilon", 1e-5f, source);
    // Our dropout sits where GPT-2's resid_pdrop does (and on the embeddings); attention-prob
    // dropout does not exist in the fused attention kernel.
    c.dropout = get_field<float>(j, "resid_pdrop", 0.1f, source);
    c.tie_embeddings = get_field<bool>(j, "tie_word_embeddings", true, source);
    const auto act = get_field<std::string>(j, "activation_function", "gelu_new", source);
    DS_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             "[hf_io] {}: activation_function \"{}\" is not supported; the gpt2 layout uses the "
             "tanh GELU (\"gelu_new\")",
             source, act);
    DS_CHECK(get_field<bool>(j, "scale_attn_weights", true, source),
             "[hf_io] {}: scale_attn_weights false is not supported", source);
    DS_CHECK(!get_field<bool>(j, "scale_attn_by_inverse_layer_idx", false, source),
             "[hf_io] {}: scale_attn_by_inverse_layer_idx is not supported", source);
  } else if (is_llama_family(type)) {
    c = llama_family_config(j, type, source);
  } else {
    DS_THROW(
        "[hf_io] {}: model_type \"{}\" is not supported (supported: gpt2, llama, mistral, qwen2, "
        "qwen3)",
        source, type);
  }
  try {
    c.validate();
  } catch (const ds::Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
  return c;
}

namespace {
// A float field as the decimal it was written as (1e-5, not 9.999999747378752e-06).
double shortest(float v) {
  return std::stod(fmt::format("{}", v));
}
}  // namespace

namespace {
// transformers 5's rope_parameters for our rope_theta and RopeScaling.
json hf_rope_parameters(const GPTConfig& c) {
  const nn::RopeScaling& s = c.rope_scaling;
  json r = {{"rope_type", s.type}, {"rope_theta", shortest(c.rope_theta)}};
  if (s.is_default()) return r;
  r["factor"] = s.factor;
  if (s.type == "llama3" || s.type == "yarn")
    r["original_max_position_embeddings"] = s.original_max_position;
  if (s.type == "llama3") {
    r["low_freq_factor"] = s.low_freq_factor;
    r["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == "yarn") {
    r["beta_fast"] = s.beta_fast;
    r["beta_slow"] = s.beta_slow;
    r["truncate"] = s.truncate;
    if (s.attention_factor > 0.0) r["attention_factor"] = s.attention_factor;
  }
  return r;
}
}  // namespace

json hf_config_to_json(const GPTConfig& c) {
  json j;
  if (c.layout == nn::Layout::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.block_size},
         {"n_ctx", c.block_size},
         {"n_embd", c.n_embd},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"n_inner", c.ffn_hidden > 0 ? json(c.ffn_hidden) : json(nullptr)},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", shortest(c.norm_eps)},
         {"resid_pdrop", shortest(c.dropout)},
         {"embd_pdrop", shortest(c.dropout)},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"tie_word_embeddings", c.tie_embeddings}};
  } else {
    const std::string fam = c.resolved_family();
    const char* arch = fam == "mistral" ? "MistralForCausalLM"
                       : fam == "qwen2" ? "Qwen2ForCausalLM"
                       : fam == "qwen3" ? "Qwen3ForCausalLM"
                                        : "LlamaForCausalLM";
    j = {{"architectures", {arch}},
         {"model_type", fam},
         {"vocab_size", c.vocab_size},
         {"max_position_embeddings", c.block_size},
         {"hidden_size", c.n_embd},
         {"intermediate_size", c.resolved_ffn_hidden()},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.kv_heads()},
         {"head_dim", c.head_dim()},
         {"hidden_act", "silu"},
         {"rms_norm_eps", shortest(c.norm_eps)},
         {"rope_parameters", hf_rope_parameters(c)},
         {"attention_dropout", shortest(c.dropout)},
         {"tie_word_embeddings", c.tie_embeddings}};
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
  }
  // GPT-2's <|endoftext|> for models on the GPT-2 vocabulary (as our presets are). An imported
  // model's own special-token ids are not part of GPTConfig.
  // TODO(tokenizer export): take bos/eos/pad ids from the exported tokenizer when there is one.
  if (c.vocab_size > 50256 && c.vocab_size <= 50304) j["bos_token_id"] = j["eos_token_id"] = 50256;
  j["dtype"] = "float32";
  j["ds_cpp"] = c.to_json();  // our exact config (read back by hf_config_from_json)
  return j;
}

std::optional<GPTConfig> read_hf_config(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  const fs::path file = path / "config.json";
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    DS_THROW("[hf_io] {}: not valid JSON ({})", file.string(), e.what());
  }
  return hf_config_from_json(j, file.string());
}

HFLoadReport load_hf_weights(GPT& model, const fs::path& path) {
  const GPTConfig& cfg = model.config();
  const nn::Layout layout = cfg.layout;
  HFLoadReport report;
  std::vector<safetensors::Reader> readers;
  for (const auto& f : weight_files(path)) {
    DS_CHECK(fs::is_regular_file(f), "[hf_io] '{}' (named by the index) does not exist",
             f.string());
    readers.emplace_back(f.string());
    report.files.push_back(f.string());
  }
  const std::string where = report.files.size() == 1 ? report.files[0] : path.string();

  struct Found {
    size_t reader;
    const safetensors::Entry* entry;
  };
  std::map<std::string, Found> by_ours;  // our name -> the file tensor
  std::vector<std::string> problems;
  for (size_t r = 0; r < readers.size(); ++r) {
    for (const auto& e : readers[r].entries()) {
      const std::string ours = strip_prefix(layout, e.name);
      auto [it, inserted] = by_ours.emplace(ours, Found{r, &e});
      if (!inserted)
        problems.push_back(fmt::format("duplicate: '{}' and '{}' are the same parameter '{}'",
                                       it->second.entry->name, e.name, ours));
    }
  }

  // A pipeline stage holds part of the model: the file's other tensors belong to other stages
  // (checked against the whole model's names, so a wrong file is still an error), and a tied
  // head's copy of the embedding (GPT::tied_head_weight) is filled from the embedding's tensor.
  std::set<std::string> other_stages;
  std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  if (!model.is_whole()) {
    std::set<std::string> here;
    for (const auto& [name, p] : params) here.insert(name);
    nn::PartitionedInit no_memory;  // names only: the parameters get no storage
    const GPT whole(cfg, nullptr, /*init=*/false);
    for (const auto& [name, p] : whole.named_parameters())
      if (!here.count(name)) other_stages.insert(name);
    if (Tensor h = model.tied_head_weight(); h.defined())
      params.emplace_back(layout == nn::Layout::gpt2 ? "wte.weight" : "embed_tokens.weight", h);
  }
  std::set<std::string> used;
  std::vector<std::pair<Tensor, Found>> plan;  // parameter <- file tensor
  for (const auto& [name, param] : params) {
    const bool transpose = hf_transposed(layout, name);
    Shape want = param.shape();
    if (transpose) std::swap(want[0], want[1]);
    auto it = by_ours.find(name);
    if (it == by_ours.end()) {
      problems.push_back(fmt::format("missing: '{}' {}", hf_name(layout, name), shape_str(want)));
      continue;
    }
    used.insert(name);
    const safetensors::Entry& e = *it->second.entry;
    if (e.shape != want) {
      problems.push_back(fmt::format("mis-shaped: '{}' is {} in the file, the model needs {}{}",
                                     e.name, shape_str(e.shape), shape_str(want),
                                     transpose ? " (Conv1D layout: (in, out))" : ""));
    } else if (!e.supported) {
      problems.push_back(fmt::format("unsupported dtype: '{}' is {} (F32, BF16 and F16 are read)",
                                     e.name, e.dtype_name));
    } else {
      plan.emplace_back(param, it->second);
    }
  }
  for (const auto& [ours, found] : by_ours) {
    if (used.count(ours) || other_stages.count(ours)) continue;
    if (ignorable(cfg, ours)) {
      report.ignored.push_back(found.entry->name);
      continue;
    }
    problems.push_back(fmt::format("extra: '{}' {} is not a parameter of this model",
                                   found.entry->name, shape_str(found.entry->shape)));
  }
  if (!problems.empty())
    DS_THROW(
        "[hf_io] {}: {} problem{} loading weights into a {} model ({} layers, n_embd {}, vocab "
        "{}):\n  {}\nCheck that --model (or config.json) describes the model these weights belong "
        "to",
        where, problems.size(), problems.size() == 1 ? "" : "s", nn::layout_name(layout),
        cfg.n_layer, cfg.n_embd, cfg.vocab_size, fmt::join(problems, "\n  "));

  autograd::NoGradGuard no_grad;
  for (const auto& [param, found] : plan) {
    Tensor t = readers[found.reader].get(found.entry->name);
    if (hf_transposed(layout, strip_prefix(layout, found.entry->name))) {
      t = ops::transpose(t, 0, 1);
      ++report.transposed;
    }
    param.detach().copy_from(t);
    // A NaN or Inf in the weights (a checkpoint saved after training diverged, or a damaged file)
    // would otherwise surface as "!!!!!!" from ds_generate or a loss blamed on the learning rate.
    // Checked after the copy, so a value the model's dtype cannot hold counts too.
    const int64_t bad = first_non_finite(param.detach());
    DS_CHECK(bad < 0,
             "[hf_io] {}: tensor '{}' holds a non-finite value (NaN or Inf) at element {} of {}{}; "
             "these weights cannot be used: take an earlier checkpoint, or check how this file "
             "was written",
             readers[found.reader].path(), found.entry->name, bad, param.numel(),
             param.dtype() != found.entry->dtype
                 ? fmt::format(" (after conversion from {} to {})", found.entry->dtype_name,
                               dtype_name(param.dtype()))
                 : std::string());
    ++report.tensors;
  }
  return report;
}

void export_hf(const GPT& model, const fs::path& dir, DType dtype) {
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const auto& [name, param] : model.named_parameters()) weights.emplace_back(name, param);
  export_hf(model.config(), weights, dir, dtype);
}

void export_hf(const GPTConfig& config,
               const std::vector<std::pair<std::string, Tensor>>& named_weights,
               const fs::path& dir, DType dtype) {
  const nn::Layout layout = config.layout;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[hf_io] cannot create '{}': {}", dir.string(), ec.message());
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, param] : named_weights) {
    Tensor t = param.detach();
    if (hf_transposed(layout, name)) t = ops::transpose(t, 0, 1).contiguous();
    tensors.emplace_back(hf_name(layout, name), t.to(dtype));
  }
  // transformers refuses a safetensors file without format metadata.
  safetensors::save((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  json cfg = hf_config_to_json(config);
  cfg["dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  write_text_atomic(dir / "config.json", cfg.dump(2) + "\n");
}

}  // namespace ds::models
