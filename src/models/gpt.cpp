#include "ds/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "ds/autograd/checkpoint.h"
#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/family.h"
#include "ds/ops/ops.h"

namespace ds::models {

using nn::Layout;

// ---- configuration ----

GPTConfig GPTConfig::defaults(Layout layout) {
  GPTConfig c;
  c.layout = layout;
  if (layout == Layout::llama) {
    c.norm_eps = 1e-6f;
    c.bias = false;
    c.tie_embeddings = false;
  }
  return c;
}

namespace {

struct Preset {
  const char* name;
  Layout layout;
  int64_t n_layer, n_head, n_embd, vocab_size, block_size;
};

// The GPT-2 family uses OpenAI's vocabulary and context; "tiny" is the small benchmark model
// (16.1M parameters; bench/RESULTS.md). llama-tiny keeps the GPT-2 vocabulary so that it trains
// on the project's tokenizer and data.
constexpr Preset kPresets[] = {
    {"tiny", Layout::gpt2, 4, 4, 256, 50257, 256},
    {"gpt2", Layout::gpt2, 12, 12, 768, 50257, 1024},
    {"gpt2-124m", Layout::gpt2, 12, 12, 768, 50257, 1024},
    {"gpt2-350m", Layout::gpt2, 24, 16, 1024, 50257, 1024},
    {"gpt2-medium", Layout::gpt2, 24, 16, 1024, 50257, 1024},
    {"gpt2-774m", Layout::gpt2, 36, 20, 1280, 50257, 1024},
    {"gpt2-large", Layout::gpt2, 36, 20, 1280, 50257, 1024},
    {"gpt2-1.5b", Layout::gpt2, 48, 25, 1600, 50257, 1024},
    {"gpt2-xl", Layout::gpt2, 48, 25, 1600, 50257, 1024},
    {"llama-tiny", Layout::llama, 4, 4, 256, 50257, 256},
    {"test-gpt2", Layout::gpt2, 2, 4, 32, 64, 16},
    {"test-llama", Layout::llama, 2, 4, 32, 64, 16},
};

}  // namespace

std::vector<std::string> GPTConfig::preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

GPTConfig GPTConfig::preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    GPTConfig c = defaults(p.layout);
    c.n_layer = p.n_layer;
    c.n_head = p.n_head;
    c.n_embd = p.n_embd;
    c.vocab_size = p.vocab_size;
    c.block_size = p.block_size;
    // test-llama exercises LLaMA's rounding rule at a small size: 2/3 * 4 * 32 = 85 -> 96.
    if (name == "test-llama") c.ffn_multiple_of = 16;
    return c;
  }
  std::string names;
  for (const auto& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  DS_THROW("[model] unknown model preset '{}' (known: {}); or give a model JSON file", name, names);
}

int64_t GPTConfig::resolved_ffn_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (layout == Layout::gpt2) return 4 * n_embd;
  const int64_t h = 2 * (4 * n_embd) / 3;  // LLaMA: int(2 * hidden / 3), then round up
  return (h + ffn_multiple_of - 1) / ffn_multiple_of * ffn_multiple_of;
}

void GPTConfig::validate() const {
  DS_CHECK(vocab_size > 0, "[model] vocab_size must be positive, got {}", vocab_size);
  DS_CHECK(block_size > 0, "[model] block_size must be positive, got {}", block_size);
  DS_CHECK(n_layer > 0, "[model] n_layer must be positive, got {}", n_layer);
  DS_CHECK(n_head > 0, "[model] n_head must be positive, got {}", n_head);
  DS_CHECK(n_embd > 0, "[model] n_embd must be positive, got {}", n_embd);
  DS_CHECK(head_size > 0 || n_embd % n_head == 0,
           "[model] n_embd {} not divisible by n_head {}", n_embd, n_head);
  DS_CHECK(head_size >= 0, "[model] head_size must be >= 0 (0 = n_embd / n_head), got {}",
           head_size);
  DS_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0,
           "[model] n_kv_head {} must divide n_head {} (0 = n_head)", n_kv_head, n_head);
  DS_CHECK(sliding_window >= 0, "[model] sliding_window must be >= 0, got {}", sliding_window);
  DS_CHECK(sliding_window == 0 || sliding_window >= block_size || !layer_types.empty(),
           "[model] sliding_window {} < block_size {} on every layer (no layer_types) is not "
           "supported; use block_size <= sliding_window (every window then holds the whole "
           "sequence), or layer_types to name the sliding layers",
           sliding_window, block_size);
  DS_CHECK(layer_types.empty() || static_cast<int64_t>(layer_types.size()) == n_layer,
           "[model] layer_types has {} entries for n_layer {}", layer_types.size(), n_layer);
  for (const auto& t : layer_types)
    DS_CHECK(t == "full_attention" || t == "sliding_attention",
             "[model] layer_types entry \"{}\" is unknown (full_attention, sliding_attention)", t);
  DS_CHECK(rope_local_theta >= 0.0f && query_pre_attn_scalar >= 0.0f &&
               attn_logit_softcapping >= 0.0f && final_logit_softcapping >= 0.0f,
           "[model] rope_local_theta {}, query_pre_attn_scalar {}, attn_logit_softcapping {} and "
           "final_logit_softcapping {} must be >= 0 (0 = unset)",
           rope_local_theta, query_pre_attn_scalar, attn_logit_softcapping,
           final_logit_softcapping);
  if (layout == Layout::gpt2) {
    DS_CHECK(kv_heads() == n_head && head_dim() * n_head == n_embd && !qkv_bias && !qk_norm &&
                 rope_scaling.is_default() && sliding_window == 0 && layer_types.empty() &&
                 rope_local_theta == 0.0f && !norm_unit_offset && !geglu && !embed_scale &&
                 query_pre_attn_scalar == 0.0f && attn_logit_softcapping == 0.0f &&
                 final_logit_softcapping == 0.0f,
             "[model] n_kv_head, head_size, qkv_bias, qk_norm, rope_scaling, sliding_window, "
             "layer_types, rope_local_theta, norm_unit_offset, geglu, embed_scale, "
             "query_pre_attn_scalar and the soft-cappings are llama-layout fields; the gpt2 "
             "layout has none of them");
  } else {
    DS_CHECK(head_dim() % 2 == 0,
             "[model] rotary embeddings need an even head size, got {} (n_embd {} / n_head {} or "
             "head_size)",
             head_dim(), n_embd, n_head);
    DS_CHECK(rotary_dim() > 0 && rotary_dim() % 2 == 0,
             "[model] rotary_dim {} (head size {} * partial_rotary_factor {}) must be even and "
             "positive",
             rotary_dim(), head_dim(), partial_rotary_factor);
  }
  rope_scaling.validate();
  DS_CHECK(partial_rotary_factor > 0.0f && partial_rotary_factor <= 1.0f,
           "[model] partial_rotary_factor must be in (0, 1], got {}", partial_rotary_factor);
  if (layout == Layout::gpt2)
    DS_CHECK(partial_rotary_factor == 1.0f && !rope_interleaved && !sandwich_norm,
             "[model] partial_rotary_factor, rope_interleaved and sandwich_norm are llama-layout "
             "fields; the gpt2 layout has none of them");
  DS_CHECK(num_experts >= 0 && moe_ffn_hidden >= 0 && router_aux_loss_coef >= 0.0f,
           "[model] num_experts {}, moe_ffn_hidden {} and router_aux_loss_coef {} must be >= 0",
           num_experts, moe_ffn_hidden, router_aux_loss_coef);
  DS_CHECK(moe_capacity_factor > 0.0f && moe_eval_capacity_factor > 0.0f && moe_min_capacity >= 0,
           "[model] moe_capacity_factor {} and moe_eval_capacity_factor {} must be > 0 and "
           "moe_min_capacity {} >= 0",
           moe_capacity_factor, moe_eval_capacity_factor, moe_min_capacity);
  DS_CHECK(!moe_drop_tokens || num_experts > 0,
           "[model] moe_drop_tokens needs a mixture of experts (num_experts > 0)");
  if (num_experts > 0)
    DS_CHECK(layout == Layout::llama && experts_per_tok >= 1 && experts_per_tok <= num_experts,
             "[model] mixture of experts needs the llama layout and experts_per_tok in [1, "
             "num_experts {}], got layout {} and experts_per_tok {}",
             num_experts, nn::layout_name(layout), experts_per_tok);
  // What the family's Hugging Face class can express, so that an export loads as the same model.
  check_features(family_of(*this), *this);
  family_of(*this).decoder.check(*this);
  DS_CHECK(ffn_hidden >= 0, "[model] ffn_hidden must be >= 0 (0 = default), got {}", ffn_hidden);
  DS_CHECK(ffn_multiple_of > 0, "[model] ffn_multiple_of must be positive, got {}",
           ffn_multiple_of);
  DS_CHECK(norm_eps > 0.0f, "[model] norm_eps must be positive, got {}", norm_eps);
  DS_CHECK(rope_theta > 0.0f, "[model] rope_theta must be positive, got {}", rope_theta);
  DS_CHECK(dropout >= 0.0f && dropout < 1.0f, "[model] dropout must be in [0, 1), got {}", dropout);
}

nn::BlockConfig GPTConfig::block_config() const {
  nn::BlockConfig b;
  b.layout = layout;
  b.n_embd = n_embd;
  b.n_head = n_head;
  b.n_kv_head = kv_heads();
  b.head_dim = head_dim();
  b.qkv_bias = qkv_bias;
  b.qk_norm = qk_norm;
  b.rotary_dim = layout == Layout::llama ? rotary_dim() : 0;
  b.rope_interleaved = rope_interleaved;
  b.sandwich_norm = sandwich_norm;
  b.rope_scaling = rope_scaling;
  b.ffn_hidden = resolved_ffn_hidden();
  b.norm_eps = norm_eps;
  b.rope_theta = rope_theta;
  b.dropout = dropout;
  b.bias = bias;
  b.norm_unit_offset = norm_unit_offset;
  b.geglu = geglu;
  b.attn_scale = query_pre_attn_scalar > 0.0f ? 1.0f / std::sqrt(query_pre_attn_scalar) : 0.0f;
  b.attn_softcap = attn_logit_softcapping;
  b.num_experts = num_experts;
  b.experts_per_tok = experts_per_tok;
  b.moe_ffn_hidden = num_experts > 0 ? resolved_moe_ffn_hidden() : 0;
  b.norm_topk_prob = norm_topk_prob;
  b.drop_tokens = moe_drop_tokens;
  b.capacity_factor = moe_capacity_factor;
  b.eval_capacity_factor = moe_eval_capacity_factor;
  b.min_capacity = moe_min_capacity;
  return b;
}

bool GPTConfig::layer_slides(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(layer_types.size()) &&
         layer_types[static_cast<size_t>(layer)] == "sliding_attention";
}

nn::BlockConfig GPTConfig::block_config(int64_t layer) const {
  nn::BlockConfig b = block_config();
  if (!layer_slides(layer)) return b;
  // A window that holds the whole sequence changes nothing: the kernels' plain causal path.
  if (sliding_window > 0 && sliding_window < block_size) b.sliding_window = sliding_window;
  if (rope_local_theta > 0.0f) {
    b.rope_theta = rope_local_theta;
    b.rope_scaling = nn::RopeScaling{};
  }
  return b;
}

int64_t GPTConfig::num_parameters() const {
  // In 128 bits: a config.json may say anything (1e9 layers, hidden_size 1e12), and the count must
  // not wrap around into a small number that then "fits".
  using I = __int128;
  const I C = n_embd, H = resolved_ffn_hidden(), V = vocab_size, b = bias ? 1 : 0;
  I per_layer = 0, total = V * C;
  if (layout == Layout::gpt2) {
    total += I(block_size) * C;                   // wpe
    per_layer = 2 * (C + b * C)                   // ln_1, ln_2
                + 3 * C * C + b * 3 * C           // c_attn
                + C * C + b * C                   // attn.c_proj
                + H * C + b * H + H * C + b * C;  // c_fc, mlp.c_proj
    total += C + b * C;                           // ln_f
  } else {
    const I Q = I(n_head) * head_dim(), KV = I(kv_heads()) * head_dim();
    const I qb = (bias || qkv_bias) ? 1 : 0;
    per_layer = 2 * C                               // input / post-attention norms
                + 2 * C * Q + 2 * C * KV            // q, o; k, v
                + qb * (Q + 2 * KV) + b * C         // q/k/v biases, o bias
                + (qk_norm ? 2 * I(head_dim()) : 0)  // q_norm, k_norm
                + (sandwich_norm ? 2 * C : 0)        // post-attention / post-MLP norms (GLM-4)
                + (num_experts > 0                  // router + experts, or gate, up, down
                       ? I(num_experts) * C + I(num_experts) * 3 * I(resolved_moe_ffn_hidden()) * C
                       : 3 * H * C + b * (2 * H + C));
    total += C;                                     // norm
  }
  total += I(n_layer) * per_layer;
  if (!tie_embeddings) total += V * C;  // lm_head (never a bias)
  DS_CHECK(total >= 0 && total <= I(INT64_MAX),
           "[model] the config describes more than 9.2e18 parameters (n_layer {}, n_embd {}, "
           "ffn {}, vocab_size {}): check config.json",
           n_layer, n_embd, resolved_ffn_hidden(), vocab_size);
  return static_cast<int64_t>(total);
}

void check_model_fits(const GPTConfig& c, DType dtype, int64_t available,
                      const std::string& source) {
  const int64_t n = c.num_parameters();
  // The weights, and the model's position ids (block_size int64 values, whatever the layout).
  const double need = static_cast<double>(n) * static_cast<double>(dtype_size(dtype)) +
                      8.0 * static_cast<double>(c.block_size);
  if (available <= 0 || need <= static_cast<double>(available)) return;
  DS_THROW(
      "[model] {} describes {:.3g} parameters (n_layer {}, n_embd {}, ffn {}, vocab_size {}, "
      "block_size {}): {:.1f} GiB of {} weights and position ids alone, but this machine has "
      "{:.1f} GiB available; nothing was allocated. Check the config (a layer count of {} or a "
      "block_size of {} is unusual), or run on a larger machine (DS_MEMORY_LIMIT lowers the "
      "limit, never raises it)",
      source, static_cast<double>(n), c.n_layer, c.n_embd, c.resolved_ffn_hidden(), c.vocab_size,
      c.block_size, need / (1u << 30), dtype_name(dtype),
      static_cast<double>(available) / (1u << 30), c.n_layer, c.block_size);
}

// ---- JSON ----

int64_t GPTConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor);
}

std::string GPTConfig::resolved_family() const {
  if (!family.empty()) return family;
  if (layout == Layout::gpt2) return "gpt2";
  return qk_norm ? "qwen3" : (qkv_bias && !bias) ? "qwen2" : "llama";
}

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j{{"layout", nn::layout_name(layout)},
                   {"vocab_size", vocab_size},
                   {"block_size", block_size},
                   {"n_layer", n_layer},
                   {"n_head", n_head},
                   {"n_embd", n_embd},
                   {"ffn_hidden", ffn_hidden},
                   {"ffn_multiple_of", ffn_multiple_of},
                   {"norm_eps", norm_eps},
                   {"rope_theta", rope_theta},
                   {"dropout", dropout},
                   {"bias", bias},
                   {"tie_embeddings", tie_embeddings},
                   {"seed", seed}};
  // The llama-family fields only when set, so that configs written before them read the same.
  if (n_kv_head != 0) j["n_kv_head"] = n_kv_head;
  if (head_size != 0) j["head_size"] = head_size;
  if (qkv_bias) j["qkv_bias"] = true;
  if (qk_norm) j["qk_norm"] = true;
  if (!rope_scaling.is_default()) j["rope_scaling"] = rope_scaling.to_json();
  if (sliding_window != 0) j["sliding_window"] = sliding_window;
  if (partial_rotary_factor != 1.0f) j["partial_rotary_factor"] = partial_rotary_factor;
  if (rope_interleaved) j["rope_interleaved"] = true;
  if (sandwich_norm) j["sandwich_norm"] = true;
  if (!layer_types.empty()) j["layer_types"] = layer_types;
  if (rope_local_theta != 0.0f) j["rope_local_theta"] = rope_local_theta;
  if (norm_unit_offset) j["norm_unit_offset"] = true;
  if (geglu) j["geglu"] = true;
  if (embed_scale) j["embed_scale"] = true;
  if (query_pre_attn_scalar != 0.0f) j["query_pre_attn_scalar"] = query_pre_attn_scalar;
  if (attn_logit_softcapping != 0.0f) j["attn_logit_softcapping"] = attn_logit_softcapping;
  if (final_logit_softcapping != 0.0f) j["final_logit_softcapping"] = final_logit_softcapping;
  if (num_experts != 0) {
    j["num_experts"] = num_experts;
    j["experts_per_tok"] = experts_per_tok;
    j["moe_ffn_hidden"] = moe_ffn_hidden;
    j["norm_topk_prob"] = norm_topk_prob;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
    if (moe_drop_tokens) {
      j["moe_drop_tokens"] = true;
      j["moe_capacity_factor"] = moe_capacity_factor;
      j["moe_eval_capacity_factor"] = moe_eval_capacity_factor;
      j["moe_min_capacity"] = moe_min_capacity;
    }
  }
  if (!family.empty()) j["family"] = family;
  return j;
}

std::string GPTConfig::to_json_string() const {
  return to_json().dump(2);
}

namespace {

// The value of config field `key` as T. The JSON library casts a float to an integer with
// wrap-around (1e30 layers would read as a negative count) and truncation (2.5 heads as 2), and
// 2^64 to -1: a size must be a whole number an int64 holds (1e5 is fine).
template <class T>
T field_value(const nlohmann::json& v, const char* key) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (v.is_number_float()) {
      const double d = v.get<double>();
      DS_CHECK(std::isfinite(d) && d == std::trunc(d),
               "[model] '{}' = {} in the model config is not a whole number", key, v.dump());
      DS_CHECK(std::is_signed_v<T> ? std::abs(d) <= 9.2e18 : d >= 0 && d <= 1.8e19,
               "[model] '{}' = {} in the model config is out of range", key, v.dump());
      return static_cast<T>(d);
    }
    if constexpr (std::is_signed_v<T>)
      DS_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX),
               "[model] '{}' = {} in the model config is out of range (above 9.2e18)", key,
               v.dump());
  }
  return v.get<T>();
}

using Setter = void (*)(GPTConfig&, const nlohmann::json&);
// clang-format off
#define DS_FIELD(name, type) \
  { #name, [](GPTConfig& c, const nlohmann::json& v) { c.name = field_value<type>(v, #name); } }
// clang-format on
// One entry per JSON key (to_json() writes the same names).
const std::map<std::string, Setter>& config_fields() {
  static const std::map<std::string, Setter> fields = {
      {"layout",
       [](GPTConfig& c, const nlohmann::json& v) {
         c.layout = nn::layout_from_name(v.get<std::string>());
       }},
      DS_FIELD(vocab_size, int64_t),
      DS_FIELD(block_size, int64_t),
      DS_FIELD(n_layer, int64_t),
      DS_FIELD(n_head, int64_t),
      DS_FIELD(n_embd, int64_t),
      DS_FIELD(ffn_hidden, int64_t),
      DS_FIELD(ffn_multiple_of, int64_t),
      DS_FIELD(norm_eps, float),
      DS_FIELD(rope_theta, float),
      DS_FIELD(dropout, float),
      DS_FIELD(bias, bool),
      DS_FIELD(tie_embeddings, bool),
      DS_FIELD(seed, uint64_t),
      DS_FIELD(n_kv_head, int64_t),
      DS_FIELD(head_size, int64_t),
      DS_FIELD(qkv_bias, bool),
      DS_FIELD(qk_norm, bool),
      {"rope_scaling",
       [](GPTConfig& c, const nlohmann::json& v) {
         c.rope_scaling = nn::RopeScaling::from_json(v);
       }},
      DS_FIELD(sliding_window, int64_t),
      DS_FIELD(partial_rotary_factor, float),
      DS_FIELD(rope_interleaved, bool),
      DS_FIELD(sandwich_norm, bool),
      DS_FIELD(layer_types, std::vector<std::string>),
      DS_FIELD(rope_local_theta, float),
      DS_FIELD(norm_unit_offset, bool),
      DS_FIELD(geglu, bool),
      DS_FIELD(embed_scale, bool),
      DS_FIELD(query_pre_attn_scalar, float),
      DS_FIELD(attn_logit_softcapping, float),
      DS_FIELD(final_logit_softcapping, float),
      DS_FIELD(num_experts, int64_t),
      DS_FIELD(experts_per_tok, int64_t),
      DS_FIELD(moe_ffn_hidden, int64_t),
      DS_FIELD(norm_topk_prob, bool),
      DS_FIELD(router_aux_loss_coef, float),
      DS_FIELD(output_router_logits, bool),
      DS_FIELD(moe_drop_tokens, bool),
      DS_FIELD(moe_capacity_factor, float),
      DS_FIELD(moe_eval_capacity_factor, float),
      DS_FIELD(moe_min_capacity, int64_t),
      DS_FIELD(family, std::string),
  };
  return fields;
}
#undef DS_FIELD

}  // namespace

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  DS_CHECK(j.is_object(), "[model] a model config must be a JSON object, got {}", j.type_name());
  GPTConfig c;
  const auto& fields = config_fields();
  try {
    if (j.contains("preset")) {
      c = preset(j.at("preset").get<std::string>());
    } else if (j.contains("layout")) {
      c = defaults(nn::layout_from_name(j.at("layout").get<std::string>()));
    }
    for (const auto& [key, v] : j.items()) {
      if (key == "preset") continue;
      auto it = fields.find(key);
      if (it == fields.end()) {
        std::string known = "preset";
        for (const auto& [name, set] : fields) known += ", " + name;
        DS_THROW("[model] unknown key '{}' in the model config (known: {})", key, known);
      }
      try {
        it->second(c, v);
      } catch (const nlohmann::json::exception& e) {
        DS_THROW("[model] bad value for '{}' in the model config: {}", key, e.what());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[model] bad value in the model config: {}", e.what());
  }
  c.validate();
  return c;
}

GPTConfig GPTConfig::from_json_string(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[model] the model config is not valid JSON: {}", e.what());
  }
  return from_json(j);
}

GPTConfig GPTConfig::load(const std::string& path) {
  std::ifstream f(path);
  DS_CHECK(f.good(), "[model] cannot open model config '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return from_json_string(ss.str());
  } catch (const Error& e) {
    DS_THROW("{} (in {})", e.what(), path);
  }
}

// ---- the model ----

GPT::GPT(GPTConfig config, bool init) : GPT(std::move(config), nullptr, PipeRange{}, init) {}

GPT::GPT(GPTConfig config, std::shared_ptr<nn::TensorParallel> tp, bool init)
    : GPT(std::move(config), std::move(tp), PipeRange{}, init) {}

std::vector<PipeLayerInfo> GPT::pipe_layers(const GPTConfig& c) {
  const int64_t V = c.vocab_size, C = c.n_embd, L = c.n_layer;
  GPTConfig one = c;  // one block's parameters: the count with one layer minus the count with none
  one.n_layer = 1;
  GPTConfig none = c;
  none.n_layer = 0;
  const int64_t per_block = one.num_parameters() - none.num_parameters();
  const int64_t norm = c.layout == Layout::gpt2 ? C + (c.bias ? C : 0) : C;
  std::vector<PipeLayerInfo> out;
  out.push_back({"GPTEmbedding", V * C + (c.layout == Layout::gpt2 ? c.block_size * C : 0)});
  for (int64_t i = 0; i < L; ++i) out.push_back({"TransformerBlock", per_block});
  out.push_back({"GPTHead", norm + V * C});
  return out;
}

GPT::GPT(GPTConfig config, std::shared_ptr<nn::TensorParallel> tp, PipeRange layers, bool init)
    : Module("GPT"), config_(std::move(config)), range_(layers) {
  if (tp && tp->size() > 1) tp_ = std::move(tp);
  config_.validate();
  const GPTConfig& c = config_;
  const int64_t n_pipe = c.n_layer + 2;
  if (range_.end < 0) range_.end = n_pipe;
  DS_CHECK(range_.begin >= 0 && range_.begin < range_.end && range_.end <= n_pipe,
           "[model] pipeline stage layers [{}, {}) outside the model's {} layers (embedding, {} "
           "blocks, head)",
           range_.begin, range_.end, n_pipe, c.n_layer);
  const bool gpt2 = c.layout == Layout::gpt2;
  DS_CHECK(!(tp_ && nn::PartitionedInit::active()),
           "[model] a tensor-parallel model is built whole on each rank (its parts), not under "
           "ZeRO-3's partitioned construction");
  DS_CHECK(is_whole() || !nn::PartitionedInit::active(),
           "[model] a pipeline stage is built whole on its ranks, not under ZeRO-3's partitioned "
           "construction (pipeline parallelism works with ZeRO stages 0-2)");
  if (tp_) {
    auto [b, e] = tp_->part(c.vocab_size, 1, true, "vocabulary");
    vocab_split_ = {0, c.vocab_size, 1, b, e};
  }
  // Registration order is the whole model's, so named_parameters() is a contiguous run of the
  // whole model's list (plus nothing else): param_index_ below relies on it.
  if (has_embedding()) {
    if (tp_)
      tok_emb_ = register_module(gpt2 ? "wte" : "embed_tokens",
                                 std::make_shared<nn::VocabParallelEmbedding>(c.vocab_size,
                                                                              c.n_embd, tp_));
    else
      tok_emb_ = register_module(gpt2 ? "wte" : "embed_tokens",
                                 std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
    if (gpt2)
      pos_emb_ = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  }
  const int64_t first_block = std::max<int64_t>(range_.begin, 1) - 1;
  const int64_t end_block = std::min<int64_t>(range_.end, c.n_layer + 1) - 1;
  if (end_block > first_block) {
    auto list = register_module(gpt2 ? "h" : "layers",
                                std::make_shared<nn::ModuleList>(first_block));
    if (c.num_experts > 0) router_log_ = std::make_shared<nn::RouterLog>();
    for (int64_t i = first_block; i < end_block; ++i) {
      nn::BlockConfig bi = c.block_config(i);
      bi.tp = tp_;
      bi.router_log = router_log_;
      blocks_.push_back(list->append(nn::make_block(bi)));
    }
  }
  if (has_head()) {
    if (gpt2)
      norm_f_ =
          register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.norm_eps, c.bias));
    else
      norm_f_ = register_module(
          "norm", std::make_shared<nn::RMSNorm>(c.n_embd, c.norm_eps, c.norm_unit_offset));
    if (c.tie_embeddings && !has_embedding()) {
      // The head's copy of wte lives outside the parameters (see tied_head_weight()).
      tied_head_ = Tensor::zeros({tp_ ? vocab_split_.end - vocab_split_.begin : c.vocab_size,
                                  c.n_embd});
      tied_head_.set_requires_grad(true);
    } else if (tp_) {
      // A tied head is a Linear over wte's weight: named_parameters() lists the weight once (as
      // wte.weight), while the head stays a module of its own whose hooks ZeRO-3 can use.
      lm_head_ = register_module(
          "lm_head",
          c.tie_embeddings ? std::make_shared<nn::ColumnParallelLinear>(tok_emb_->weight(),
                                                                        vocab_split_, tp_)
                           : std::make_shared<nn::ColumnParallelLinear>(
                                 c.n_embd, c.vocab_size, false, tp_, 1, 1, /*uneven=*/true));
    } else {
      lm_head_ = register_module(
          "lm_head", c.tie_embeddings
                         ? std::make_shared<nn::Linear>(tok_emb_->weight())
                         : std::make_shared<nn::Linear>(c.n_embd, c.vocab_size, false));
    }
  }
  // The whole model's parameter numbers of ours: [embedding][blocks][norm, lm_head].
  {
    const size_t n_emb = gpt2 ? 2 : 1;
    size_t per_block = 0;
    if (!blocks_.empty()) {
      per_block = blocks_.front()->named_parameters().size();
    } else {
      nn::PartitionedInit no_memory;  // only to count a block's parameters
      nn::BlockConfig probe = c.block_config();
      per_block = nn::make_block(probe)->named_parameters().size();
    }
    const size_t n_local = named_parameters().size();
    size_t k = 0;
    if (has_embedding())
      for (size_t i = 0; i < n_emb; ++i) param_index_.push_back(k++);
    for (int64_t b = first_block; b < end_block; ++b)
      for (size_t i = 0; i < per_block; ++i)
        param_index_.push_back(n_emb + static_cast<size_t>(b) * per_block + i);
    const size_t head_first = n_emb + static_cast<size_t>(c.n_layer) * per_block;
    for (size_t i = 0; param_index_.size() < n_local; ++i) param_index_.push_back(head_first + i);
    DS_CHECK(param_index_.size() == n_local,
             "[model] internal: {} parameter numbers for {} parameters", param_index_.size(),
             n_local);
  }
  positions_ = Tensor::arange(c.block_size, DType::i64);
  // Under nn::PartitionedInit the parameters hold no memory: ZeRO-3 initialises each rank's shard
  // from init_values() instead.
  if (init && !nn::PartitionedInit::active()) init_weights();
}

int64_t GPT::full_index(size_t local) const {
  DS_CHECK(local < param_index_.size(), "[model] parameter index {} out of range ({} parameters)",
           local, param_index_.size());
  return static_cast<int64_t>(param_index_[local]);
}

Tensor GPT::tied_embedding_weight() const {
  if (!config_.tie_embeddings || !has_embedding() || has_head()) return {};
  return tok_emb_->weight();
}

void GPT::to(Device device) {
  Module::to(device);
  nn::move_tensor_to(positions_, device);
  nn::move_tensor_to(tied_head_, device);
  if (tied_head_.defined() && tied_head_.grad().defined())
    nn::move_tensor_to(tied_head_.grad(), device);
}

Tensor GPT::forward(const Tensor& in) {
  Tensor x;
  if (has_embedding()) {
    const Tensor& ids = in;
    DS_CHECK(ids.defined() && ids.dim() == 2 &&
                 (ids.dtype() == DType::i32 || ids.dtype() == DType::i64),
             "[model] token ids must be a (B, T) int32/int64 tensor, got {} {}",
             ids.defined() ? shape_str(ids.shape()) : "undefined",
             ids.defined() ? dtype_name(ids.dtype()) : "");
    const int64_t T = ids.size(1);
    DS_CHECK(T >= 1 && T <= config_.block_size,
             "[model] sequence length {} outside [1, block_size {}]", T, config_.block_size);
    x = scale_embedding((*tok_emb_)(ids));                                        // (B, T, C)
    if (pos_emb_) x = ops::add(x, (*pos_emb_)(ops::slice(positions_, 0, 0, T)));  // + (T, C)
    x = ops::dropout(x, config_.dropout, is_training());
  } else {
    DS_CHECK(in.defined() && in.dim() == 3 && in.size(2) == config_.n_embd &&
                 is_floating(in.dtype()),
             "[model] a pipeline stage after the first takes hidden states (B, T, {}), got {} {}",
             config_.n_embd, in.defined() ? shape_str(in.shape()) : "undefined",
             in.defined() ? dtype_name(in.dtype()) : "");
    x = in;
  }
  if (checkpoint_interval_ > 1 && is_training() && autograd::is_grad_enabled()) {
    // Runs of checkpoint_interval_ blocks, each recomputed as one segment in backward.
    const size_t k = static_cast<size_t>(checkpoint_interval_);
    for (size_t r = 0; r < blocks_.size(); r += k) {
      const size_t end = std::min(blocks_.size(), r + k);
      x = autograd::checkpoint(
          [this, r, end](const Tensor& h) {
            Tensor y = h;
            for (size_t i = r; i < end; ++i) y = (*blocks_[i])(y);
            return y;
          },
          x);
    }
  } else {
    for (auto& block : blocks_) x = (*block)(x);  // (B, T, C)
  }
  if (!has_head()) return x;
  x = (*norm_f_)(x);
  if (loss_targets_.defined() && config_.final_logit_softcapping > 0.0f) {
    // Capped logits: formed whole, then the plain cross entropy.
    const Tensor lg = cap_logits(head_logits(x));
    return ops::cross_entropy(ops::reshape(lg, {-1, lg.size(-1)}), loss_targets_, -100);
  }
  if (loss_targets_.defined()) {  // loss(): the head's loss, fused where it can be
    const Tensor targets = loss_targets_;
    if (lm_head_) return lm_head_->cross_entropy(x, targets, -100);
    const Tensor x2 = ops::reshape(x, {-1, config_.n_embd});
    const Tensor w =
        tied_head_.dtype() == x.dtype() ? tied_head_ : ops::cast(tied_head_, x.dtype());
    return x.dtype() == DType::f16 ? ops::cross_entropy(ops::linear(x2, w, Tensor()), targets, -100)
                                   : ops::linear_cross_entropy(x2, w, targets, -100);
  }
  return cap_logits(head_logits(x));  // (B, T, V)
}

Tensor GPT::head_logits(const Tensor& x) {
  if (tied_head_.defined()) {
    // The tied head without its embedding: what ColumnParallelLinear / Linear would compute.
    return ops::linear(tp_ ? nn::tp_copy(x, *tp_) : x,
                       tied_head_.dtype() == x.dtype() ? tied_head_ : ops::cast(tied_head_, x.dtype()),
                       Tensor());
  }
  return (*lm_head_)(x);  // (B, T, V)
}

Tensor GPT::cap_logits(const Tensor& logits) const {
  const float cap = config_.final_logit_softcapping;
  if (cap <= 0.0f) return logits;
  return ops::mul(ops::tanh(ops::mul(logits, 1.0f / cap)), cap);
}

Tensor GPT::decode_embed(const Tensor& ids, std::span<const int64_t> positions) const {
  DS_CHECK(has_embedding(),
           "[generate] decoding needs the embedding: this pipeline stage holds "
           "layers [{}, {})",
           range_.begin, range_.end);
  Tensor x = scale_embedding(tok_emb_->forward(ids));  // (1, N, C)
  if (!pos_emb_) return x;
  const Device dev = pos_emb_->weight().device();
  Tensor pos = Tensor::from_ints(std::vector<int64_t>(positions.begin(), positions.end()),
                                 {static_cast<int64_t>(positions.size())});
  if (!dev.is_cpu()) {
    Tensor d = Tensor::empty(pos.shape(), pos.dtype(), dev);
    d.copy_from(pos);
    pos = d;
  }
  return ops::add(x, pos_emb_->forward(pos));  // + (N, C)
}

Tensor GPT::scale_embedding(const Tensor& x) const {
  if (!config_.embed_scale) return x;
  // sqrt(C) rounded to the embedding's dtype first, as transformers' Gemma embedding does.
  float s = std::sqrt(static_cast<float>(config_.n_embd));
  if (x.dtype() == DType::bf16) s = bf16_to_float(float_to_bf16(s));
  if (x.dtype() == DType::f16) s = f16_to_float(float_to_f16(s));
  return ops::mul(x, s);
}

Tensor GPT::decode_final_norm(const Tensor& x) const {
  DS_CHECK(norm_f_ != nullptr,
           "[generate] decoding needs the final norm: this pipeline stage "
           "holds layers [{}, {})",
           range_.begin, range_.end);
  return norm_f_->forward(x);
}

Tensor GPT::decode_head(const Tensor& x, bool rows) const {
  DS_CHECK(lm_head_ != nullptr,
           "[generate] decoding needs the LM head: this pipeline stage holds "
           "layers [{}, {})",
           range_.begin, range_.end);
  return cap_logits(lm_head_->decode(x, rows));
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) {
  DS_CHECK(has_head(), "[model] loss() needs the LM head: this pipeline stage holds layers [{}, {})",
           range_.begin, range_.end);
  const int64_t B = ids.size(0), T = ids.size(1);
  DS_CHECK(targets.defined() && targets.dim() == 2 && targets.size(0) == B && targets.size(1) == T,
           "[model] targets {} must be (B, T) = ({}, {}), the shape of the input",
           targets.defined() ? shape_str(targets.shape()) : "undefined", B, T);
  const int64_t N = B * T;
  if (!tp_) {
    loss_targets_ = ops::reshape(targets, {N});
    struct Clear {
      Tensor& t;
      ~Clear() { t = Tensor(); }
    } clear{loss_targets_};
    if (!config_.output_router_logits || !router_log_)
      return (*this)(ids);  // forward returns the loss (see loss_targets_)
    return add_router_loss(ids);
  }
  const Tensor lg = logits(ids);  // (B, T, V_local) with tensor parallelism
  const nn::TPSplit& s = vocab_split_;
  return nn::vocab_parallel_cross_entropy(ops::reshape(lg, {N, s.end - s.begin}),
                                          ops::reshape(targets, {N}), s.begin, config_.vocab_size,
                                          *tp_, -100);
}

Tensor GPT::add_router_loss(const Tensor& ids) {
  // Only here would the load-balancing loss be wrong: a recomputed block records its router in
  // no-grad mode, and a pipeline stage sees only its own layers.
  const bool recompute = checkpoint_interval_ > 0 ||
                         (!blocks_.empty() && blocks_.front()->gradient_checkpointing());
  DS_CHECK(!recompute || !autograd::is_grad_enabled(),
           "[model] output_router_logits (the router's load-balancing loss) with activation "
           "checkpointing is not supported: turn one of them off");
  DS_CHECK(is_whole(), "[model] output_router_logits needs the whole model on one stage");
  struct Off {
    nn::RouterLog& log;
    ~Off() {
      log.enabled = false;
      log.clear();
    }
  } off{*router_log_};
  router_log_->clear();
  router_log_->enabled = true;
  const Tensor lm_loss = (*this)(ids);  // forward returns the loss (see loss_targets_)
  if (router_log_->probs.empty()) return lm_loss;
  const Tensor aux = nn::load_balancing_loss(*router_log_);
  return ops::add(lm_loss, ops::mul(aux, config_.router_aux_loss_coef));
}

void GPT::set_gradient_checkpointing(bool on) {
  checkpoint_interval_ = 0;
  for (auto& b : blocks_) b->set_gradient_checkpointing(on);
}

void GPT::set_activation_checkpoint_interval(int k) {
  DS_CHECK(k >= 0, "[model] activation_checkpoint_interval must be >= 0, got {}", k);
  set_gradient_checkpointing(k == 1);
  checkpoint_interval_ = k;
}

double GPT::flops_per_token(int64_t seq_len) const {
  const double T = static_cast<double>(seq_len > 0 ? seq_len : config_.block_size);
  // A token runs experts_per_tok of the num_experts experts: the others' weights do no work for it.
  const GPTConfig& c = config_;
  const double idle = c.num_experts > 0
                          ? static_cast<double>(c.n_layer) *
                                static_cast<double>(c.num_experts - c.experts_per_tok) * 3.0 *
                                static_cast<double>(c.resolved_moe_ffn_hidden()) *
                                static_cast<double>(c.n_embd)
                          : 0.0;
  return 6.0 * (static_cast<double>(num_parameters()) - idle) +
         12.0 * static_cast<double>(config_.n_layer) *
             static_cast<double>(config_.n_head * config_.head_dim()) * T;
}

Tensor GPT::generate(const Tensor& prompt, int64_t max_new_tokens, int64_t top_k, uint64_t seed,
                     float temperature) {
  DS_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(1) >= 1,
           "[generate] prompt must be (B, T0) token ids with T0 >= 1");
  DS_CHECK(max_new_tokens >= 0 && top_k >= 0 && temperature > 0.0f,
           "[generate] need max_new_tokens >= 0, top_k >= 0 and temperature > 0 (got {}, {}, {})",
           max_new_tokens, top_k, temperature);
  DS_CHECK(!tp_ && is_whole(),
           "[generate] not available on a tensor-parallel model or a pipeline stage; export it "
           "(ds_to_fp32 / the HF export) and generate from the whole model");
  autograd::NoGradGuard no_grad;
  struct TrainRestore {  // eval mode (no dropout) while sampling, restored even on error
    GPT& m;
    bool was;
    ~TrainRestore() { m.train(was); }
  } restore{*this, is_training()};
  train(false);

  const int64_t B = prompt.size(0), T0 = prompt.size(1), V = config_.vocab_size;
  const int64_t total = T0 + max_new_tokens;
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  const std::vector<int64_t> p = prompt.to_int_vector();
  for (int64_t b = 0; b < B; ++b)
    seqs[static_cast<size_t>(b)].assign(p.begin() + b * T0, p.begin() + (b + 1) * T0);

  std::vector<int64_t> order(static_cast<size_t>(V));
  std::vector<double> probs(static_cast<size_t>(V));
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t len = T0 + step, ctx = std::min(len, config_.block_size);
    std::vector<int64_t> window;
    window.reserve(static_cast<size_t>(B * ctx));
    for (const auto& s : seqs) window.insert(window.end(), s.end() - ctx, s.end());
    Tensor ids = Tensor::from_ints(window, {B, ctx});
    if (positions_.defined() && !positions_.device().is_cpu()) {  // a model on a GPU
      Tensor d = Tensor::empty(ids.shape(), ids.dtype(), positions_.device());
      d.copy_from(ids);
      ids = d;
    }
    Tensor lg = logits(ids);                                                      // (B, ctx, V)
    const std::vector<float> last = ops::slice(lg, 1, ctx - 1, ctx).to_vector();  // (B, 1, V)
    for (int64_t b = 0; b < B; ++b) {
      const float* row = last.data() + b * V;
      std::iota(order.begin(), order.end(), 0);
      // Most likely first; ties by the lower id, so the choice never depends on the sort.
      auto better = [row](int64_t a, int64_t c) {
        return row[a] > row[c] || (row[a] == row[c] && a < c);
      };
      int64_t next;
      if (top_k == 1) {
        next = *std::min_element(order.begin(), order.end(), better);
      } else {
        const int64_t k = top_k == 0 ? V : std::min(top_k, V);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
        const double mx = row[order[0]];
        double z = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          probs[static_cast<size_t>(i)] =
              std::exp((row[order[static_cast<size_t>(i)]] - mx) / temperature);
          z += probs[static_cast<size_t>(i)];
        }
        const double u = rng::uniform01(rng::hash3(seed, static_cast<uint64_t>(step),
                                                   static_cast<uint64_t>(b))) *
                         z;
        double acc = 0.0;
        next = order[static_cast<size_t>(k - 1)];
        for (int64_t i = 0; i < k; ++i) {
          acc += probs[static_cast<size_t>(i)];
          if (u < acc) {
            next = order[static_cast<size_t>(i)];
            break;
          }
        }
      }
      seqs[static_cast<size_t>(b)].push_back(next);
    }
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(B * total));
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return Tensor::from_ints(out, {B, total});
}

// ---- initialisation ----

std::vector<ParamInit> GPT::init_plan() const {
  const float base = 0.02f;
  // GPT-2 scales the residual projections by 1/sqrt(2L): each block adds two of them to the
  // residual stream, so its variance stays independent of depth.
  const float resid = base / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  std::map<const TensorImpl*, ParamInit> by_param;
  auto set = [&](const Tensor& t, ParamInit init) {
    if (t.defined()) by_param.emplace(t.impl(), init);  // first owner wins (tied weights)
  };
  for (const auto& [path, m] : named_modules()) {
    if (auto* lin = dynamic_cast<const nn::Linear*>(m)) {
      const bool is_resid = config_.layout == Layout::gpt2 && path.size() >= 6 &&
                            path.compare(path.size() - 6, 6, "c_proj") == 0;
      set(lin->weight(), {ParamInit::normal, is_resid ? resid : base});
      set(lin->bias(), {ParamInit::zeros, 0.0f});
    } else if (auto* emb = dynamic_cast<const nn::Embedding*>(m)) {
      set(emb->weight(), {ParamInit::normal, base});
    } else if (auto* ln = dynamic_cast<const nn::LayerNorm*>(m)) {
      set(ln->weight(), {ParamInit::ones, 0.0f});
      set(ln->bias(), {ParamInit::zeros, 0.0f});
    } else if (auto* ex = dynamic_cast<const nn::MoEExperts*>(m)) {
      set(ex->gate_up_proj(), {ParamInit::normal, base});
      set(ex->down_proj(), {ParamInit::normal, base});
    } else if (auto* rms = dynamic_cast<const nn::RMSNorm*>(m)) {
      set(rms->weight(), {rms->unit_offset() ? ParamInit::zeros : ParamInit::ones, 0.0f});
    }
  }
  std::vector<ParamInit> plan;
  for (const auto& [name, p] : named_parameters()) {
    auto it = by_param.find(p.impl());
    DS_CHECK(it != by_param.end(), "[model] no initialisation rule for parameter '{}'", name);
    plan.push_back(it->second);
  }
  return plan;
}

void GPT::init_values(const ParamInit& init, uint64_t seed, uint64_t param_index, int64_t begin,
                      int64_t n, float* out) {
  if (init.kind != ParamInit::normal) {
    std::fill(out, out + n, init.kind == ParamInit::ones ? 1.0f : 0.0f);
    return;
  }
  parallel_for(n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      out[i] = init.std * rng::normal(seed, param_index, static_cast<uint64_t>(begin + i));
  });
}

bool GPT::init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const {
  if (tp_) return false;  // local parts: the model is built whole (see the constructor)
  if (init_plan_cache_.empty()) init_plan_cache_ = init_plan();
  DS_CHECK(index < init_plan_cache_.size(),
           "[model] parameter index {} out of range ({} parameters)", index,
           init_plan_cache_.size());
  init_values(init_plan_cache_[index], config_.seed, static_cast<uint64_t>(full_index(index)),
              begin, count, out);
  return true;
}

void GPT::init_weights() {
  const auto named = named_parameters();
  const auto plan = init_plan();
  // A tensor-parallel part draws the full model's elements at their full-model indices.
  const std::map<std::string, nn::TPSplit> splits =
      tp_ ? nn::tp_splits(*this) : std::map<std::string, nn::TPSplit>{};
  auto fill = [&](const Tensor& p, const ParamInit& init, uint64_t index, const nn::TPSplit* split) {
    Tensor tmp = Tensor::empty(p.shape());
    float* out = tmp.data<float>();
    if (!split || split->replicated()) {
      init_values(init, config_.seed, index, 0, p.numel(), out);
    } else if (const nn::TPSplit& s = *split; s.dim == 0) {
      const int64_t cols = p.dim() == 2 ? p.size(1) : 1, per_block = s.full / s.blocks,
                    len = s.end - s.begin;
      for (int64_t j = 0; j < s.blocks; ++j)
        init_values(init, config_.seed, index, (j * per_block + s.begin) * cols, len * cols,
                    out + j * len * cols);
    } else {
      const int64_t len = s.end - s.begin;
      for (int64_t r = 0; r < p.size(0); ++r)
        init_values(init, config_.seed, index, r * s.full + s.begin, len, out + r * len);
    }
    p.copy_from(tmp);
  };
  for (size_t i = 0; i < named.size(); ++i) {
    const auto it = splits.find(named[i].first);
    fill(named[i].second, plan[i], static_cast<uint64_t>(full_index(i)),
         it == splits.end() ? nullptr : &it->second);
  }
  // The last stage's copy of wte: parameter 0 of the whole model, N(0, 0.02) like every embedding.
  if (tied_head_.defined())
    fill(tied_head_, {ParamInit::normal, 0.02f}, 0, tp_ ? &vocab_split_ : nullptr);
}

}  // namespace ds::models
