#include "ds/models/peft_io.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/family.h"
#include "ds/models/hf_io.h"
#include "ds/nn/expert_lora.h"
#include "ds/nn/layers.h"
#include "ds/nn/moe.h"

namespace ds::models {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// Our module name -> the Hugging Face module name ("layers.0.mlp.up_proj" ->
// "model.layers.0.mlp.up_proj").
std::string hf_module(nn::Layout layout, const std::string& module) {
  const std::string w = hf_name(layout, module + ".weight");
  return w.substr(0, w.size() - 7);
}

std::string leaf(const std::string& module) {
  const size_t dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

// The Linear modules of `model` (not the LoRA matrices themselves) and those with LoRA.
void linear_modules(const nn::Module& model, std::vector<std::string>& all,
                    std::vector<std::string>& lora) {
  for (const auto& [name, m] : model.named_modules()) {
    const auto* lin = dynamic_cast<const nn::Linear*>(m);
    if (!lin || nn::is_lora_parameter(name + ".weight")) continue;
    all.push_back(name);
    if (lin->has_lora()) lora.push_back(name);
  }
}

// The stacked expert weights of `model` with LoRA, by our parameter name
// ("layers.0.mlp.experts.gate_up_proj"), in model order, and all of them.
void expert_weights(const nn::Module& model, std::vector<std::string>& all,
                    std::vector<std::string>& lora) {
  for (const auto& [name, m] : model.named_modules()) {
    const auto* ex = dynamic_cast<const nn::MoEExperts*>(m);
    if (!ex) continue;
    all.push_back(name + ".gate_up_proj");
    all.push_back(name + ".down_proj");
    if (ex->gate_up_lora()) lora.push_back(name + ".gate_up_proj");
    if (ex->down_lora()) lora.push_back(name + ".down_proj");
  }
}

// Our LoRA parameter name -> peft's, for every LoRA matrix of `model`. An expert weight's
// ParamWrapper sits on the experts module: peft nests one wrapper per adapted parameter in the
// module's parameter order, so with both adapted gate_up_proj's factors are under
// "<experts>.base_layer.lora_A.weight" and down_proj's under "<experts>.lora_A.weight"; one alone
// is under "<experts>.lora_A.weight".
std::map<std::string, std::string> peft_names(const GPT& model) {
  const GPTConfig& cfg = model.config();
  const Family& family = export_family_of(cfg);
  std::map<std::string, std::string> out;
  for (const auto& [name, m] : model.named_modules()) {
    const auto* ex = dynamic_cast<const nn::MoEExperts*>(m);
    if (!ex || (!ex->gate_up_lora() && !ex->down_lora())) continue;
    const std::string w = family.decoder.place(cfg, name + ".down_proj").name;
    const std::string hf = kPeftPrefix + w.substr(0, w.size() - 10);  // "...mlp.experts"
    for (const char* f : {".lora_A.weight", ".lora_B.weight"}) {
      if (ex->gate_up_lora())
        out[name + ".gate_up_proj" + f] = hf + (ex->down_lora() ? ".base_layer" : "") + f;
      if (ex->down_lora()) out[name + ".down_proj" + f] = hf + f;
    }
  }
  for (const auto& [name, p] : model.named_parameters())
    if (nn::is_lora_parameter(name) && !out.count(name)) out[name] = peft_name(cfg.layout, name);
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DS_CHECK(out.good(), "[peft] cannot write '{}'", tmp.string());
    out << text;
    DS_CHECK(out.good(), "[peft] writing '{}' failed (disk full?)", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  DS_CHECK(!ec, "[peft] cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
}

}  // namespace

std::string peft_name(nn::Layout layout, const std::string& ours) {
  DS_CHECK(nn::is_lora_parameter(ours), "[peft] '{}' is not a LoRA matrix", ours);
  const size_t cut = ours.rfind(".lora_");
  return kPeftPrefix + hf_module(layout, ours.substr(0, cut)) + ours.substr(cut);
}

namespace {

// target_modules: the adapted modules' last names when they select exactly the adapted modules
// among all Linear modules (PEFT's rule: equal or ending in ".<name>"), else their full Hugging
// Face names (`hf` maps ours to those).
json target_modules(const std::vector<std::string>& modules,
                    const std::vector<std::string>& all_linear_modules,
                    const std::function<std::string(const std::string&)>& hf) {
  std::set<std::string> leaves, adapted(modules.begin(), modules.end()), selected;
  for (const auto& m : modules) leaves.insert(leaf(m));
  for (const auto& m : all_linear_modules)
    if (leaves.count(leaf(m))) selected.insert(m);
  json targets = json::array();
  if (selected == adapted) {
    for (const auto& l : leaves) targets.push_back(l);
  } else {
    for (const auto& m : modules) targets.push_back(hf(m));
  }
  return targets;
}

json adapter_config(const nn::LoraConfig& lora, json targets, const char* task_type,
                    bool fan_in_fan_out, json modules_to_save,
                    const std::string& base_model_name_or_path) {
  return json{
      {"peft_type", "LORA"},
      {"task_type", task_type},
      {"base_model_name_or_path", base_model_name_or_path},
      {"r", lora.r},
      // An integral alpha as an integer, as peft writes it.
      {"lora_alpha", lora.alpha == std::floor(lora.alpha) ? json(static_cast<int64_t>(lora.alpha))
                                                          : json(lora.alpha)},
      {"lora_dropout", lora.dropout},
      {"target_modules", std::move(targets)},
      {"bias", "none"},
      {"fan_in_fan_out", fan_in_fan_out},
      {"use_rslora", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"modules_to_save", std::move(modules_to_save)},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"inference_mode", true},
      {"revision", nullptr},
  };
}

// Reads the tensors `want` (PEFT name -> our parameter) from an adapter; every tensor of the file
// must be wanted and every wanted one there with the parameter's shape.
int64_t read_adapter(const fs::path& path,
                     const std::vector<std::pair<std::string, Tensor>>& want) {
  const fs::path file =
      fs::is_directory(path) ? path / "adapter_model.safetensors" : fs::path(path);
  DS_CHECK(fs::exists(file), "[peft] no adapter at '{}' (expected adapter_model.safetensors)",
           path.string());
  safetensors::Reader reader(file.string());
  std::vector<std::string> problems;
  std::set<std::string> used;
  std::vector<std::pair<std::string, Tensor>> todo;
  for (const auto& [pn, p] : want) {
    if (!reader.contains(pn)) {
      problems.push_back("missing " + pn);
      continue;
    }
    used.insert(pn);
    if (reader.entry(pn).shape != p.shape()) {
      problems.push_back(fmt::format("{}: shape {} in the file, {} in the model", pn,
                                     shape_str(reader.entry(pn).shape), shape_str(p.shape())));
      continue;
    }
    todo.emplace_back(pn, p);
  }
  for (const auto& n : reader.names())
    if (!used.count(n)) problems.push_back("unexpected " + n);
  DS_CHECK(todo.size() + problems.size() > 0,
           "[peft] the model has no LoRA matrices: apply LoRA before loading an adapter");
  DS_CHECK(problems.empty(), "[peft] {} does not match the model's LoRA: {}", file.string(),
           fmt::join(problems, "; "));
  for (const auto& [pn, p] : todo) reader.read_into(pn, p);
  return static_cast<int64_t>(todo.size());
}

}  // namespace

json peft_adapter_config(const GPTConfig& config, const nn::LoraConfig& lora,
                         const std::vector<std::string>& modules,
                         const std::vector<std::string>& all_linear_modules,
                         const std::string& base_model_name_or_path) {
  const json targets = target_modules(modules, all_linear_modules, [&](const std::string& m) {
    return hf_module(config.layout, m);
  });
  return adapter_config(lora, targets, "CAUSAL_LM", config.layout == nn::Layout::gpt2, nullptr,
                        base_model_name_or_path);
}

json peft_target_parameters(const GPTConfig& config, const std::vector<std::string>& weights,
                            const std::vector<std::string>& all_expert_weights) {
  const Family& family = export_family_of(config);
  return target_modules(weights, all_expert_weights,
                        [&](const std::string& w) { return family.decoder.place(config, w).name; });
}

void export_peft_adapter(const GPT& model,
                         const std::vector<std::pair<std::string, Tensor>>& named_weights,
                         const nn::LoraConfig& lora, const fs::path& dir,
                         const std::string& base_model_name_or_path, DType dtype) {
  autograd::NoGradGuard no_grad;
  const auto names = peft_names(model);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : named_weights) {
    if (!nn::is_lora_parameter(name)) continue;
    const auto it = names.find(name);
    DS_CHECK(it != names.end(), "[peft] '{}' is not a LoRA matrix of the model", name);
    tensors.emplace_back(it->second, t.detach().contiguous().to(dtype));
  }
  DS_CHECK(!tensors.empty(),
           "[peft] the weights hold no LoRA matrix: apply LoRA (--lora_dim) before exporting an "
           "adapter");
  std::vector<std::string> all, adapted;
  linear_modules(model, all, adapted);
  // A module that the family's Hugging Face class fuses with another (GLM's gate_proj and up_proj
  // are one gate_up_proj there) has no module of its own for PEFT to adapt.
  const GPTConfig& cfg = model.config();
  const Family& family = export_family_of(cfg);
  for (const auto& m : adapted) {
    const HFPlace p = family.decoder.place(cfg, m + ".weight");
    DS_CHECK(p.parts == 1,
             "[peft] LoRA on '{}' cannot be written as a PEFT adapter for {}: that class holds it "
             "as part of '{}'. Target other modules (--lora_module_name), or pass --merge_lora to "
             "export the weights with the adapter folded in",
             m, family.architecture, p.name);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[peft] cannot create '{}': {}", dir.string(), ec.message());
  // PEFT's loader requires the format metadata, as transformers does.
  safetensors::save((dir / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  json config = peft_adapter_config(model.config(), lora, adapted, all, base_model_name_or_path);
  std::vector<std::string> all_experts, adapted_experts;
  expert_weights(model, all_experts, adapted_experts);
  // peft's LoraConfig(target_parameters=...): the stacked expert weights (ParamWrapper).
  if (!adapted_experts.empty())
    config["target_parameters"] = peft_target_parameters(cfg, adapted_experts, all_experts);
  write_text(dir / "adapter_config.json", config.dump(2) + "\n");
}

int64_t load_peft_adapter(GPT& model, const fs::path& path) {
  const auto names = peft_names(model);
  std::vector<std::pair<std::string, Tensor>> want;
  for (const auto& [name, p] : model.named_parameters())
    if (nn::is_lora_parameter(name)) want.emplace_back(names.at(name), p);
  return read_adapter(path, want);
}

namespace {

// Writes an adapter folder for a task model (SEQ_CLS, SEQ_2_SEQ_LM) from whole weights by our
// names: the LoRA matrices and the modules to save, under peft's names (`peft_of`), in `dtype`;
// adapter_config.json is `config` with target_modules by PEFT's rule over the model's Linear
// modules (`hf_module` maps our module names to the class's). Throws when the weights hold no
// LoRA matrix.
void write_task_adapter(const nn::Module& model,
                        const std::vector<std::pair<std::string, Tensor>>& named_weights,
                        const nn::LoraConfig& lora, const fs::path& dir,
                        const std::function<std::string(const std::string&)>& peft_of,
                        const std::function<std::string(const std::string&)>& hf_module,
                        json config, DType dtype) {
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors;
  bool any_lora = false;
  for (const auto& [name, t] : named_weights) {
    const bool is_lora = nn::is_lora_parameter(name);
    if (!is_lora && !nn::in_modules_to_save(lora, name)) continue;
    any_lora = any_lora || is_lora;
    tensors.emplace_back(peft_of(name), t.detach().contiguous().to(dtype));
  }
  DS_CHECK(any_lora,
           "[peft] the weights hold no LoRA matrix: apply LoRA (--lora_dim) before exporting an "
           "adapter");
  std::vector<std::string> all, adapted;
  linear_modules(model, all, adapted);
  config["target_modules"] = target_modules(adapted, all, hf_module);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[peft] cannot create '{}': {}", dir.string(), ec.message());
  // PEFT's loader requires the format metadata, as transformers does.
  safetensors::save((dir / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  write_text(dir / "adapter_config.json", config.dump(2) + "\n");
}

}  // namespace

// ---- encoder sequence classifiers (TaskType.SEQ_CLS) -----------------------------------------

std::string peft_classifier_name(const EncoderConfig& config, const std::string& ours) {
  const Family& f = family_of(config);
  if (!nn::is_lora_parameter(ours)) return kPeftPrefix + f.encoder.place(config, ours).name;
  const size_t cut = ours.rfind(".lora_");
  const std::string w = f.encoder.place(config, ours.substr(0, cut) + ".weight").name;
  return kPeftPrefix + w.substr(0, w.size() - 7) + ours.substr(cut);
}

void export_peft_classifier_adapter(
    const SequenceClassifier& model,
    const std::vector<std::pair<std::string, Tensor>>& named_weights, const nn::LoraConfig& lora,
    const fs::path& dir, const std::string& base_model_name_or_path, DType dtype) {
  const EncoderConfig& cfg = model.config();
  const Family& f = family_of(cfg);
  const json to_save = lora.modules_to_save.empty() ? json(nullptr) : json(lora.modules_to_save);
  write_task_adapter(
      model, named_weights, lora, dir,
      [&](const std::string& ours) { return peft_classifier_name(cfg, ours); },
      [&](const std::string& m) {
        const std::string w = f.encoder.place(cfg, m + ".weight").name;
        return w.substr(0, w.size() - 7);
      },
      adapter_config(lora, nullptr, "SEQ_CLS", false, to_save, base_model_name_or_path), dtype);
}

int64_t load_peft_classifier_adapter(SequenceClassifier& model, const nn::LoraConfig& lora,
                                     const fs::path& path) {
  std::vector<std::pair<std::string, Tensor>> want;
  for (const auto& [name, p] : model.named_parameters())
    if (nn::is_lora_parameter(name) || nn::in_modules_to_save(lora, name))
      want.emplace_back(peft_classifier_name(model.config(), name), p);
  return read_adapter(path, want);
}

// ---- encoder-decoders (TaskType.SEQ_2_SEQ_LM) -------------------------------------------------

std::string peft_seq2seq_name(const std::string& ours) {
  DS_CHECK(nn::is_lora_parameter(ours), "[peft] '{}' is not a LoRA matrix", ours);
  return kPeftPrefix + ours;  // our names are the class's
}

void export_peft_seq2seq_adapter(const Seq2Seq& model,
                                 const std::vector<std::pair<std::string, Tensor>>& named_weights,
                                 const nn::LoraConfig& lora, const fs::path& dir,
                                 const std::string& base_model_name_or_path, DType dtype) {
  DS_CHECK(lora.modules_to_save.empty(),
           "[peft] a SEQ_2_SEQ_LM adapter saves no modules besides LoRA; modules_to_save {} given",
           fmt::join(lora.modules_to_save, ","));
  write_task_adapter(
      model, named_weights, lora, dir, peft_seq2seq_name, [](const std::string& m) { return m; },
      adapter_config(lora, nullptr, "SEQ_2_SEQ_LM", false, nullptr, base_model_name_or_path),
      dtype);
}

int64_t load_peft_seq2seq_adapter(Seq2Seq& model, const fs::path& path) {
  std::vector<std::pair<std::string, Tensor>> want;
  for (const auto& [name, p] : model.named_parameters())
    if (nn::is_lora_parameter(name)) want.emplace_back(peft_seq2seq_name(name), p);
  return read_adapter(path, want);
}

}  // namespace ds::models
