#include "ds/models/hf_io.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/ops/ops.h"
#include "ds/models/family.h"
#include "families/hf_config.h"
#include "hf_weights.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

std::string hf_name(nn::Layout layout, const std::string& ours) {
  const Family& f = layout == nn::Layout::gpt2 ? families::gpt2 : families::llama;
  return f.decoder.place(GPTConfig::defaults(layout), ours).name;
}

bool hf_transposed(nn::Layout layout, const std::string& ours) {
  const Family& f = layout == nn::Layout::gpt2 ? families::gpt2 : families::llama;
  return f.decoder.place(GPTConfig::defaults(layout), ours).transposed;
}

GPTConfig hf_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: expected a JSON object", source);
  if (j.contains("ds_cpp")) {
    // Every kind's export has a "ds_cpp" block: a model_type of another kind is refused, naming
    // the kind.
    if (j.contains("model_type") && j["model_type"].is_string() &&
        find_family(j["model_type"].get<std::string>()))
      family_for_model_type(j["model_type"].get<std::string>(), source);
    try {
      return GPTConfig::from_json(j["ds_cpp"]);
    } catch (const ds::Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  std::string type = hf::get_field<std::string>(j, "model_type", "", source);
  if (type.empty() && j.contains("n_embd")) type = "gpt2";  // GPT-2 configs before model_type
  const Family& family = family_for_model_type(type, source);
  GPTConfig c = family.decoder.read_config(j, type, source);
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
  json j = family.decoder.write_config(c);
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

// A pipeline stage holds part of the model: the keys of the file's tensors that belong to other
// stages (checked against the whole model's names, so a wrong file is still an error). A tied
// head's copy of the embedding (GPT::tied_head_weight) joins `targets`, filled from the
// embedding's tensor.
std::set<std::string> other_stage_keys(const GPT& model, const Family& family,
                                       std::vector<detail::Target>& targets) {
  std::set<std::string> other_stages;
  if (model.is_whole()) return other_stages;
  const GPTConfig& cfg = model.config();
  auto key = [&](const std::string& ours) {
    const std::string n = family.decoder.place(cfg, ours).name;
    return n.rfind(family.prefix, 0) == 0 ? n.substr(family.prefix.size()) : n;
  };
  std::set<std::string> here;
  for (const detail::Target& t : targets) here.insert(key(t.ours));
  nn::PartitionedInit no_memory;  // names only: the parameters get no storage
  const GPT whole(cfg, nullptr, /*init=*/false);
  for (const auto& [name, p] : whole.named_parameters())
    if (!here.count(key(name))) other_stages.insert(key(name));
  if (Tensor h = model.tied_head_weight(); h.defined()) {
    const std::string embedding =
        cfg.layout == nn::Layout::gpt2 ? "wte.weight" : "embed_tokens.weight";
    targets.push_back({embedding, h, family.decoder.place(cfg, embedding)});
    other_stages.erase(key(embedding));
  }
  return other_stages;
}

// Every tensor name in the weight files of path (full names, prefix included).
std::set<std::string> file_names(const fs::path& path) {
  std::set<std::string> names;
  for (const fs::path& f : detail::weight_files(path)) {
    const safetensors::Reader r(f.string());
    for (const auto& e : r.entries()) names.insert(e.name);
  }
  return names;
}

// A parameter read from an older layout's pieces (DecoderParts::legacy_pieces): the pieces'
// temporaries are targets of the import, then copied into `param` in order.
struct Assembled {
  Tensor param;
  std::vector<Tensor> pieces;
};

// Replaces each target that the file holds in its legacy pieces by those pieces; returns what to
// assemble after the import.
std::vector<Assembled> use_legacy_pieces(const GPTConfig& cfg, const Family& family,
                                         const fs::path& path,
                                         std::vector<detail::Target>& targets) {
  std::vector<Assembled> out;
  if (!family.decoder.legacy_pieces) return out;
  const std::set<std::string> names = file_names(path);
  auto holds = [&](const std::string& n) {
    return names.count(n) > 0 ||
           (n.rfind(family.prefix, 0) == 0 && names.count(n.substr(family.prefix.size())) > 0);
  };
  std::vector<detail::Target> kept;
  for (const detail::Target& t : targets) {
    const std::vector<HFPiece> pieces = family.decoder.legacy_pieces(cfg, t.ours);
    if (pieces.empty() || holds(t.place.name) || !holds(pieces.front().name)) {
      kept.push_back(t);
      continue;
    }
    Assembled a{t.tensor, {}};
    for (size_t i = 0; i < pieces.size(); ++i) {
      Tensor tmp = Tensor::zeros(pieces[i].shape, t.tensor.dtype());
      a.pieces.push_back(tmp);
      kept.push_back({t.ours + " (" + pieces[i].name + ")", tmp, HFPlace{pieces[i].name}});
    }
    out.push_back(std::move(a));
  }
  targets = std::move(kept);
  return out;
}

void assemble(const std::vector<Assembled>& parts) {
  for (const Assembled& a : parts) {
    std::vector<Tensor> flat;
    for (const Tensor& p : a.pieces) flat.push_back(ops::reshape(p, {-1}));
    const Tensor all = ops::concat(flat, 0);
    DS_CHECK(all.numel() == a.param.numel(),
             "[hf_io] internal: legacy pieces hold {} values for a parameter of {}", all.numel(),
             a.param.numel());
    a.param.detach().copy_from(ops::reshape(all, a.param.shape()));
  }
}

}  // namespace

HFLoadReport load_hf_weights(GPT& model, const fs::path& path) {
  const GPTConfig& cfg = model.config();
  const Family& family = family_of(cfg);
  std::vector<detail::Target> targets;
  for (const auto& [name, p] : model.named_parameters())
    targets.push_back({name, p, family.decoder.place(cfg, name)});
  detail::ImportRules rules;
  rules.prefix = family.prefix;
  rules.describe = fmt::format("a {} model ({} layers, n_embd {}, vocab {})", family.name,
                               cfg.n_layer, cfg.n_embd, cfg.vocab_size);
  rules.advice = "Check that --model (or config.json) describes the model these weights belong to";
  rules.elsewhere = other_stage_keys(model, family, targets);
  const std::vector<Assembled> legacy = use_legacy_pieces(cfg, family, path, targets);
  std::string tied_head = cfg.tie_embeddings ? family.decoder.place(cfg, "lm_head.weight").name : "";
  if (tied_head.rfind(family.prefix, 0) == 0) tied_head = tied_head.substr(family.prefix.size());
  rules.unused = [&](const std::string& key, const detail::FileTensor& t, const detail::FileIndex&) {
    const bool skip = key == tied_head || family.is_buffer(t.entry->name);
    return detail::Unused{skip ? detail::Unused::ignored : detail::Unused::extra, ""};
  };
  const detail::ImportReport r = detail::import_weights(path, targets, rules);
  {
    autograd::NoGradGuard no_grad;
    assemble(legacy);
  }
  return {r.files, r.tensors, r.transposed, r.ignored};
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
  const auto place = [&](const std::string& ours) { return family.decoder.place(c, ours); };
  detail::write_hf_folder(dir, detail::export_tensors(named_weights, place, dtype),
                          hf_config_to_json(c), dtype);
}

}  // namespace ds::models
