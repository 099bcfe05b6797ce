#include "ds/models/hf_io.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
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
    for (const auto& [k, v] : j["weight_map"].items()) names.insert(v.get<std::string>());
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
  } else if (type == "llama") {
    c = GPTConfig::defaults(nn::Layout::llama);
    c.vocab_size = get_field<int64_t>(j, "vocab_size", 32000, source);
    c.block_size = get_field<int64_t>(j, "max_position_embeddings", 2048, source);
    c.n_embd = get_field<int64_t>(j, "hidden_size", 4096, source);
    c.n_layer = get_field<int64_t>(j, "num_hidden_layers", 32, source);
    c.n_head = get_field<int64_t>(j, "num_attention_heads", 32, source);
    c.ffn_hidden = get_field<int64_t>(j, "intermediate_size", 0, source);
    c.norm_eps = get_field<float>(j, "rms_norm_eps", 1e-6f, source);
    c.rope_theta = get_field<float>(j, "rope_theta", 10000.0f, source);
    c.tie_embeddings = get_field<bool>(j, "tie_word_embeddings", false, source);
    c.bias = get_field<bool>(j, "attention_bias", false, source);
    c.dropout = get_field<float>(j, "attention_dropout", 0.0f, source);
    const int64_t kv = get_field<int64_t>(j, "num_key_value_heads", c.n_head, source);
    DS_CHECK(kv == c.n_head,
             "[hf_io] {}: num_key_value_heads {} != num_attention_heads {}: grouped-query "
             "attention is not supported yet",
             source, kv, c.n_head);
    DS_CHECK(get_field<bool>(j, "mlp_bias", c.bias, source) == c.bias,
             "[hf_io] {}: mlp_bias must equal attention_bias (one bias switch here)", source);
    DS_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
             "[hf_io] {}: rope_scaling {} is not supported", source, j["rope_scaling"].dump());
    const auto act = get_field<std::string>(j, "hidden_act", "silu", source);
    DS_CHECK(act == "silu", "[hf_io] {}: hidden_act \"{}\" is not supported (silu only)", source,
             act);
  } else {
    DS_THROW("[hf_io] {}: model_type \"{}\" is not supported; gpt2 and llama are", source, type);
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
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"vocab_size", c.vocab_size},
         {"max_position_embeddings", c.block_size},
         {"hidden_size", c.n_embd},
         {"intermediate_size", c.resolved_ffn_hidden()},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.n_head},
         {"hidden_act", "silu"},
         {"rms_norm_eps", shortest(c.norm_eps)},
         {"rope_theta", shortest(c.rope_theta)},
         {"attention_bias", c.bias},
         {"mlp_bias", c.bias},
         {"attention_dropout", shortest(c.dropout)},
         {"tie_word_embeddings", c.tie_embeddings}};
  }
  if (c.vocab_size > 50256) j["bos_token_id"] = j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  j["torch_dtype"] = "float32";
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

  std::set<std::string> used;
  std::vector<std::pair<Tensor, Found>> plan;  // parameter <- file tensor
  for (const auto& [name, param] : model.named_parameters()) {
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
    if (used.count(ours)) continue;
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
    param.copy_from(t);
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
  cfg["torch_dtype"] = dtype == DType::bf16  ? "bfloat16"
                       : dtype == DType::f16 ? "float16"
                                             : "float32";
  write_text_atomic(dir / "config.json", cfg.dump(2) + "\n");
}

}  // namespace ds::models
