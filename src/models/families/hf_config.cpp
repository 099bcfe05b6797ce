#include "hf_config.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ds::models::hf {

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

void check_known_fields(const json& j, const std::set<std::string>& handled,
                        const std::string& model_type, const std::string& source) {
  for (const auto& [k, v] : j.items())
    DS_CHECK(handled.count(k) || harmless_key(k),
             "[hf_io] {}: field \"{}\" is not understood for model_type {} and may change the "
             "model's math, so the import stops; docs/models.md lists the fields read (remove it "
             "from config.json only if you know it changes nothing)",
             source, k, model_type);
}

void check_dtype_fields(const json& j, const std::string& source) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const auto d = get_field<std::string>(j, key, "", source);
    DS_CHECK(d == "float32" || d == "bfloat16" || d == "float16" || d == "auto",
             "[hf_io] {}: {} \"{}\" is not supported (float32, bfloat16, float16)", source, key, d);
  }
}

double shortest(float v) {
  return std::stod(fmt::format("{}", v));
}

namespace {

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

// rope parameter `key` as a number; nullopt when absent or null.
std::optional<double> rope_number(const json& rp, const char* key, const std::string& field,
                                  const std::string& source) {
  if (!rp.contains(key) || rp[key].is_null()) return std::nullopt;
  DS_CHECK(rp[key].is_number(), "[hf_io] {}: {}.{} must be a number, got {}", source, field, key,
           rp[key].dump());
  return rp[key].get<double>();
}

// LongRoPE's fields (transformers' _compute_longrope_parameters): short_factor and long_factor
// (one per rotary pair), original_max_position_embeddings (required), factor (default
// max_position_embeddings / original_max_position_embeddings; it sets the default
// attention_factor), attention_factor.
void read_longrope(const json& rp, const std::string& field, int64_t max_positions,
                   const std::string& source, nn::RopeScaling& s, std::set<std::string>& allowed) {
  allowed.insert(
      {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor"});
  const auto o = rope_number(rp, "original_max_position_embeddings", field, source);
  DS_CHECK(o && *o > 0,
           "[hf_io] {}: {}.original_max_position_embeddings is required for rope_type longrope "
           "(the context short_factor covers)",
           source, field);
  s.original_max_position = static_cast<int64_t>(*o);
  const auto f = rope_number(rp, "factor", field, source);
  s.factor = f ? *f : static_cast<double>(max_positions) / static_cast<double>(*o);
  if (auto a = rope_number(rp, "attention_factor", field, source)) s.attention_factor = *a;
  for (const char* key : {"short_factor", "long_factor"}) {
    const bool ok =
        rp.contains(key) && rp[key].is_array() &&
        std::all_of(rp[key].begin(), rp[key].end(), [](const json& v) { return v.is_number(); });
    DS_CHECK(ok, "[hf_io] {}: {}.{} must be a list of numbers for rope_type longrope, got {}",
             source, field, key, rp.value(key, json()).dump());
    (std::string(key) == "short_factor" ? s.short_factor : s.long_factor) =
        rp[key].get<std::vector<double>>();
  }
}

// rope_theta and RopeScaling from the merged rope parameters; unknown keys and types are errors.
void read_rope(const json& rp, const std::string& field, int64_t max_positions,
               const std::string& source, GPTConfig& c, bool longrope) {
  auto num = [&](const char* key) { return rope_number(rp, key, field, source); };
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rp.contains(key) && rp[key].is_string()) {
      type = rp[key].get<std::string>();
      break;
    }
  nn::RopeScaling& s = c.rope_scaling;
  s = nn::RopeScaling{};
  s.type = type;
  std::vector<std::string> names = nn::RopeScaling::type_names();
  if (!longrope) names.erase(std::find(names.begin(), names.end(), "longrope"));
  DS_CHECK(std::find(names.begin(), names.end(), type) != names.end(),
           "[hf_io] {}: {}.rope_type \"{}\" is not supported (supported: {}); dynamic changes the "
           "frequencies with the sequence length{}",
           source, field, type, fmt::join(names, ", "),
           longrope ? "" : "; longrope is read for model_type phi3");
  c.rope_theta = static_cast<float>(*num("rope_theta"));
  if (auto p = num("partial_rotary_factor")) {
    DS_CHECK(*p > 0.0 && *p <= 1.0, "[hf_io] {}: {}.partial_rotary_factor {} must be in (0, 1]",
             source, field, *p);
    c.partial_rotary_factor = static_cast<float>(*p);
  }
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "longrope") {
    allowed.insert("factor");
    read_longrope(rp, field, max_positions, source, s, allowed);
  } else if (type != "default") {
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

}  // namespace

void read_rope_fields(const json& j, int64_t max_positions, const std::string& source, GPTConfig& c,
                      bool longrope) {
  std::string field;
  const json rp = rope_parameters_of(j, source, field);
  read_rope(rp, field, max_positions, source, c, longrope);
}

// transformers 5's rope_parameters for our rope_theta and RopeScaling.
json rope_parameters(const GPTConfig& c) {
  const nn::RopeScaling& s = c.rope_scaling;
  json r = {{"rope_type", s.type}, {"rope_theta", shortest(c.rope_theta)}};
  if (c.partial_rotary_factor != 1.0f)
    r["partial_rotary_factor"] = shortest(c.partial_rotary_factor);
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
  if (s.type == "longrope") {
    r["original_max_position_embeddings"] = s.original_max_position;
    r["short_factor"] = s.short_factor;
    r["long_factor"] = s.long_factor;
    if (s.attention_factor > 0.0) r["attention_factor"] = s.attention_factor;
  }
  return r;
}

const std::set<std::string>& decoder_fields() {
  static const std::set<std::string> f = {"vocab_size",
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
  return f;
}

GPTConfig read_decoder_fields(const json& j, const std::string& type, const std::string& source,
                              const DecoderDefaults& d) {
  GPTConfig c = GPTConfig::defaults(nn::Layout::llama);
  c.family = type;
  c.vocab_size = get_field<int64_t>(j, "vocab_size", d.vocab_size, source);
  const int64_t max_positions =
      get_field<int64_t>(j, "max_position_embeddings", d.max_positions, source);
  c.block_size = max_positions;
  c.n_embd = get_field<int64_t>(j, "hidden_size", d.hidden_size, source);
  c.n_layer = get_field<int64_t>(j, "num_hidden_layers", d.layers, source);
  c.n_head = get_field<int64_t>(j, "num_attention_heads", d.heads, source);
  c.ffn_hidden = get_field<int64_t>(j, "intermediate_size", 0, source);
  c.norm_eps = get_field<float>(j, "rms_norm_eps", d.rms_norm_eps, source);
  c.tie_embeddings = get_field<bool>(j, "tie_word_embeddings", d.tie_word_embeddings, source);
  c.dropout = get_field<float>(j, "attention_dropout", 0.0f, source);
  const int64_t kv = get_field<int64_t>(j, "num_key_value_heads",
                                        d.kv_heads > 0 ? d.kv_heads : c.n_head, source);
  DS_CHECK(kv > 0 && c.n_head > 0 && c.n_head % kv == 0,
           "[hf_io] {}: num_key_value_heads {} must divide num_attention_heads {}", source, kv,
           c.n_head);
  c.n_kv_head = kv == c.n_head ? 0 : kv;
  const bool divisible = c.n_head > 0 && c.n_embd % c.n_head == 0;
  const int64_t hd_default = d.head_dim > 0 ? d.head_dim : (divisible ? c.n_embd / c.n_head : 0);
  const int64_t hd = get_field<int64_t>(j, "head_dim", hd_default, source);
  DS_CHECK(hd > 0,
           "[hf_io] {}: head_dim {} must be positive (hidden_size {} / "
           "num_attention_heads {})",
           source, hd, c.n_embd, c.n_head);
  c.head_size = divisible && hd == c.n_embd / c.n_head ? 0 : hd;
  const auto act = get_field<std::string>(j, "hidden_act", "silu", source);
  DS_CHECK(act == "silu", "[hf_io] {}: hidden_act \"{}\" is not supported (model_type {} uses silu)",
           source, act, type);
  check_dtype_fields(j, source);
  read_rope_fields(j, max_positions, source, c, d.longrope);
  return c;
}

json write_decoder_fields(const GPTConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.block_size},
          {"hidden_size", c.n_embd},
          {"intermediate_size", c.resolved_ffn_hidden()},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.kv_heads()},
          {"head_dim", c.head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", shortest(c.norm_eps)},
          {"rope_parameters", rope_parameters(c)},
          {"attention_dropout", shortest(c.dropout)},
          {"tie_word_embeddings", c.tie_embeddings}};
}

void finish_classifier_config(const json& j, EncoderConfig& c, const std::string& source) {
  const bool has_id2label = j.contains("id2label") && j["id2label"].is_object();
  if (has_id2label) c.num_labels = static_cast<int64_t>(j["id2label"].size());
  if (j.contains("num_labels") && !j["num_labels"].is_null()) {
    const int64_t n = hf::get_field<int64_t>(j, "num_labels", 2, source);
    DS_CHECK(!has_id2label || n == c.num_labels,
             "[hf_io] {}: num_labels {} disagrees with id2label's {} labels", source, n,
             c.num_labels);
    c.num_labels = n;
  }
  DS_CHECK(c.num_labels >= 1, "[hf_io] {}: id2label / num_labels gives {} labels; at least 1",
           source, c.num_labels);
  c.problem_type = hf::get_field<std::string>(j, "problem_type", "", source);
  DS_CHECK(c.problem_type.empty() || c.problem_type == "regression" ||
               c.problem_type == "single_label_classification" ||
               c.problem_type == "multi_label_classification",
           "[hf_io] {}: problem_type \"{}\" is unknown (regression, single_label_classification, "
           "multi_label_classification)",
           source, c.problem_type);
  try {
    c.validate();
  } catch (const Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
}

json write_encoder_common(const EncoderConfig& c) {
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < c.num_labels; ++i) {
    id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
    label2id["LABEL_" + std::to_string(i)] = i;
  }
  json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.n_embd},
            {"num_hidden_layers", c.n_layer},
            {"num_attention_heads", c.n_head},
            {"intermediate_size", c.ffn_hidden},
            {"hidden_act", c.hidden_act},
            {"hidden_dropout_prob", shortest(c.hidden_dropout)},
            {"attention_probs_dropout_prob", shortest(c.attention_dropout)},
            {"max_position_embeddings", c.max_positions},
            {"type_vocab_size", c.type_vocab_size},
            {"initializer_range", shortest(c.initializer_range)},
            {"layer_norm_eps", shortest(c.norm_eps)},
            {"pad_token_id", c.pad_token_id},
            {"id2label", id2label},
            {"label2id", label2id}};
  if (!c.problem_type.empty()) j["problem_type"] = c.problem_type;
  return j;
}

}  // namespace ds::models::hf
