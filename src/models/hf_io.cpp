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
#include "ds/models/encoder_family.h"
#include "ds/models/family.h"
#include "ds/ops/ops.h"
#include "families/hf_config.h"
#include "hf_files.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace detail {

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

}  // namespace detail

using detail::first_non_finite;
using detail::weight_files;
using detail::write_text_atomic;

std::string hf_name(nn::Layout layout, const std::string& ours) {
  const Family& f = layout == nn::Layout::gpt2 ? families::gpt2 : families::llama;
  return f.place(GPTConfig::defaults(layout), ours).name;
}

bool hf_transposed(nn::Layout layout, const std::string& ours) {
  const Family& f = layout == nn::Layout::gpt2 ? families::gpt2 : families::llama;
  return f.place(GPTConfig::defaults(layout), ours).transposed;
}

GPTConfig hf_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: expected a JSON object", source);
  if (j.contains("ds_cpp")) {
    // An encoder classifier's export (ds/models/encoder_io.h) has a "ds_cpp" block of its own:
    // its model_type names the importer to use instead.
    if (j.contains("model_type") && j["model_type"].is_string() &&
        find_encoder_family(j["model_type"].get<std::string>()))
      family_for_model_type(j["model_type"].get<std::string>(), source);  // throws, saying so
    try {
      return GPTConfig::from_json(j["ds_cpp"]);
    } catch (const ds::Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  std::string type = hf::get_field<std::string>(j, "model_type", "", source);
  if (type.empty() && j.contains("n_embd")) type = "gpt2";  // GPT-2 configs before model_type
  const Family& family = family_for_model_type(type, source);
  GPTConfig c = family.read_config(j, type, source);
  try {
    c.validate();
  } catch (const ds::Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
  return c;
}

json hf_config_to_json(const GPTConfig& config) {
  const Family& family = export_family_of(config);
  GPTConfig c = config;
  if (family.name != config.resolved_family()) c.family = family.name;  // chatglm -> glm
  json j = family.write_config(c);
  j["architectures"] = {family.architecture};
  j["model_type"] = family.model_types.front();
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

namespace {

// A file tensor name without the family's module prefix (optional on import).
std::string key_of(const Family& f, const std::string& name) {
  return !f.prefix.empty() && name.rfind(f.prefix, 0) == 0 ? name.substr(f.prefix.size()) : name;
}

// Our parameters grouped by the file tensor holding them (HFPlace), in the order of their first
// parameter; the parts of a stacked tensor in part order.
struct Group {
  HFPlace place;  // of part 0 (name, parts, transposed)
  std::vector<std::pair<std::string, Tensor>> parts;  // (our name, tensor), part order
};

std::vector<Group> group_by_file_tensor(const Family& f, const GPTConfig& c,
                                        const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Group> groups;
  std::map<std::string, size_t> index;
  for (const auto& [name, t] : named) {
    const HFPlace p = f.place(c, name);
    DS_CHECK(p.parts >= 1 && p.part >= 0 && p.part < p.parts && (p.parts == 1 || !p.transposed),
             "[hf_io] internal: family {} places '{}' as part {} of {}", f.name, name, p.part,
             p.parts);
    auto [it, fresh] = index.emplace(p.name, groups.size());
    if (fresh) {
      groups.push_back({p, {}});
      groups.back().parts.resize(static_cast<size_t>(p.parts));
    }
    Group& g = groups[it->second];
    DS_CHECK(g.place.parts == p.parts && !g.parts[static_cast<size_t>(p.part)].second.defined(),
             "[hf_io] internal: family {} places two parameters at part {} of '{}'", f.name,
             p.part, p.name);
    g.parts[static_cast<size_t>(p.part)] = {name, t};
  }
  return groups;
}

// The file shape of a group: the parameter's (swapped when transposed), or the parts' rows stacked.
Shape file_shape(const Group& g) {
  Shape s = g.parts[0].second.shape();
  if (g.place.transposed) std::swap(s[0], s[1]);
  for (size_t i = 1; i < g.parts.size(); ++i) s[0] += g.parts[i].second.size(0);
  return s;
}

}  // namespace

GPTConfig resolve_model_config(const std::string& name, const std::string& tool) {
  const auto presets = GPTConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), name) != presets.end())
    return GPTConfig::preset(name);
  std::error_code ec;
  if (fs::is_directory(name, ec)) {
    auto c = read_hf_config(name);
    DS_CHECK(c.has_value(), "[{}] --model {}: no config.json in that folder", tool, name);
    return *c;
  }
  DS_CHECK(fs::is_regular_file(name, ec),
           "[{}] --model '{}' is neither a preset ({}), a Hugging Face folder with config.json, "
           "nor a model JSON file",
           tool, name, fmt::join(presets, ", "));
  return GPTConfig::load(name);
}

namespace {

// A file tensor: which reader holds it, and its entry.
struct Found {
  size_t reader;
  const safetensors::Entry* entry;
};

// Every file tensor by its key (the name without the family's prefix); a name twice is a problem.
std::map<std::string, Found> index_file_tensors(const Family& family,
                                                const std::vector<safetensors::Reader>& readers,
                                                std::vector<std::string>& problems) {
  std::map<std::string, Found> by_key;
  for (size_t r = 0; r < readers.size(); ++r)
    for (const auto& e : readers[r].entries()) {
      const std::string key = key_of(family, e.name);
      auto [it, inserted] = by_key.emplace(key, Found{r, &e});
      if (!inserted)
        problems.push_back(fmt::format("duplicate: '{}' and '{}' are the same tensor '{}'",
                                       it->second.entry->name, e.name, key));
    }
  return by_key;
}

// A pipeline stage holds part of the model: the keys of the file's tensors that belong to other
// stages (checked against the whole model's names, so a wrong file is still an error). A tied
// head's copy of the embedding (GPT::tied_head_weight) joins `params`, filled from the
// embedding's tensor.
std::set<std::string> other_stage_keys(const GPT& model, const Family& family,
                                       std::vector<std::pair<std::string, Tensor>>& params) {
  std::set<std::string> other_stages;
  if (model.is_whole()) return other_stages;
  const GPTConfig& cfg = model.config();
  std::set<std::string> here;
  for (const auto& [name, p] : params) here.insert(key_of(family, family.place(cfg, name).name));
  nn::PartitionedInit no_memory;  // names only: the parameters get no storage
  const GPT whole(cfg, nullptr, /*init=*/false);
  for (const auto& [name, p] : whole.named_parameters()) {
    const std::string key = key_of(family, family.place(cfg, name).name);
    if (!here.count(key)) other_stages.insert(key);
  }
  if (Tensor h = model.tied_head_weight(); h.defined()) {
    const std::string embedding =
        cfg.layout == nn::Layout::gpt2 ? "wte.weight" : "embed_tokens.weight";
    params.emplace_back(embedding, h);
    other_stages.erase(key_of(family, family.place(cfg, embedding).name));
  }
  return other_stages;
}

// The file tensor of group `g`, or the problem with it (missing, mis-shaped, unsupported dtype).
std::optional<Found> match_group(const Group& g, const Family& family,
                                 const std::map<std::string, Found>& by_key,
                                 std::set<std::string>& used, std::vector<std::string>& problems) {
  std::vector<std::string> absent;
  for (size_t i = 0; i < g.parts.size(); ++i)
    if (!g.parts[i].second.defined()) absent.push_back(std::to_string(i));
  DS_CHECK(absent.empty(), "[hf_io] internal: parts {} of '{}' are not parameters here",
           fmt::join(absent, ", "), g.place.name);
  const Shape want = file_shape(g);
  const std::string key = key_of(family, g.place.name);
  auto it = by_key.find(key);
  if (it == by_key.end()) {
    problems.push_back(fmt::format("missing: '{}' {}", g.place.name, shape_str(want)));
    return std::nullopt;
  }
  used.insert(key);
  const safetensors::Entry& e = *it->second.entry;
  if (e.shape != want) {
    std::string layout_note;
    if (g.place.transposed) layout_note = " (Conv1D layout: (in, out))";
    if (g.parts.size() > 1) {
      std::vector<std::string> names;
      for (const auto& [n, t] : g.parts) names.push_back(n + " " + shape_str(t.shape()));
      layout_note = fmt::format(" (our {} stacked)", fmt::join(names, " and "));
    }
    problems.push_back(fmt::format("mis-shaped: '{}' is {} in the file, the model needs {}{}",
                                   e.name, shape_str(e.shape), shape_str(want), layout_note));
    return std::nullopt;
  }
  if (!e.supported) {
    problems.push_back(fmt::format("unsupported dtype: '{}' is {} (F32, BF16 and F16 are read)",
                                   e.name, e.dtype_name));
    return std::nullopt;
  }
  return it->second;
}

// Group `g`'s parameters from its file tensor (split into its parts, transposed back), each
// checked for non-finite values after the copy.
void copy_group(const Group& g, const Found& found,
                const std::vector<safetensors::Reader>& readers, HFLoadReport& report) {
  Tensor t = readers[found.reader].get(found.entry->name);
  if (g.place.transposed) {
    t = ops::transpose(t, 0, 1);
    ++report.transposed;
  }
  int64_t row = 0;
  for (const auto& [name, param] : g.parts) {
    const int64_t rows = param.size(0);
    const Tensor part = g.parts.size() == 1 ? t : ops::slice(t, 0, row, row + rows);
    row += rows;
    param.detach().copy_from(part);
    // A NaN or Inf in the weights (a checkpoint saved after training diverged, or a damaged file)
    // would otherwise surface as "!!!!!!" from ds_generate or a loss blamed on the learning rate.
    // Checked after the copy, so a value the model's dtype cannot hold counts too.
    const int64_t bad = first_non_finite(param.detach());
    DS_CHECK(bad < 0,
             "[hf_io] {}: tensor '{}'{} holds a non-finite value (NaN or Inf) at element {} of "
             "{}{}; these weights cannot be used: take an earlier checkpoint, or check how this "
             "file was written",
             readers[found.reader].path(), found.entry->name,
             g.parts.size() > 1 ? fmt::format(" (its part {})", name) : std::string(), bad,
             param.numel(),
             param.dtype() != found.entry->dtype
                 ? fmt::format(" (after conversion from {} to {})", found.entry->dtype_name,
                               dtype_name(param.dtype()))
                 : std::string());
    ++report.tensors;
  }
}

}  // namespace

HFLoadReport load_hf_weights(GPT& model, const fs::path& path) {
  const GPTConfig& cfg = model.config();
  const Family& family = family_of(cfg);
  HFLoadReport report;
  std::vector<safetensors::Reader> readers;
  for (const auto& f : weight_files(path)) {
    DS_CHECK(fs::is_regular_file(f), "[hf_io] '{}' (named by the index) does not exist",
             f.string());
    readers.emplace_back(f.string());
    report.files.push_back(f.string());
  }
  const std::string where = report.files.size() == 1 ? report.files[0] : path.string();
  std::vector<std::string> problems;
  const std::map<std::string, Found> by_key = index_file_tensors(family, readers, problems);
  std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  const std::set<std::string> other_stages = other_stage_keys(model, family, params);
  const std::string tied_head_key =
      cfg.tie_embeddings ? key_of(family, family.place(cfg, "lm_head.weight").name) : "";
  std::set<std::string> used;
  std::vector<std::pair<const Group*, Found>> plan;  // parameters <- file tensor
  const std::vector<Group> groups = group_by_file_tensor(family, cfg, params);
  for (const Group& g : groups)
    if (auto found = match_group(g, family, by_key, used, problems)) plan.emplace_back(&g, *found);
  for (const auto& [key, found] : by_key) {
    if (used.count(key) || other_stages.count(key)) continue;
    if (key == tied_head_key || family.is_buffer(found.entry->name)) {
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
        where, problems.size(), problems.size() == 1 ? "" : "s", family.name, cfg.n_layer,
        cfg.n_embd, cfg.vocab_size, fmt::join(problems, "\n  "));
  autograd::NoGradGuard no_grad;
  for (const auto& [group, found] : plan) copy_group(*group, found, readers, report);
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
  const Family& family = export_family_of(config);
  GPTConfig c = config;
  if (family.name != config.resolved_family()) c.family = family.name;  // chatglm -> glm
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[hf_io] cannot create '{}': {}", dir.string(), ec.message());
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Group& g : group_by_file_tensor(family, c, named_weights)) {
    std::vector<Tensor> parts;
    for (const auto& [name, t] : g.parts) {
      DS_CHECK(t.defined(), "[hf_io] export: '{}' lacks part '{}'", g.place.name, name);
      parts.push_back(t.detach());
    }
    Tensor t = parts.size() == 1 ? parts[0] : ops::concat(parts, 0);
    if (g.place.transposed) t = ops::transpose(t, 0, 1).contiguous();
    tensors.emplace_back(g.place.name, t.contiguous().to(dtype));
  }
  // transformers refuses a safetensors file without format metadata.
  safetensors::save((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  json cfg = hf_config_to_json(c);
  cfg["dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  write_text_atomic(dir / "config.json", cfg.dump(2) + "\n");
}

}  // namespace ds::models
