// Hugging Face import and export of encoder classifiers (ds/models/encoder_io.h).
#include "ds/models/encoder_io.h"

#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/encoder_family.h"
#include "ds/ops/ops.h"
#include "hf_files.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool starts_with(const std::string& s, std::string_view p) {
  return s.rfind(p, 0) == 0;
}

// A file tensor's name without the family's base-model prefix (present or not).
std::string key_of(const EncoderFamily& f, const std::string& name) {
  return starts_with(name, f.prefix) ? name.substr(f.prefix.size()) : name;
}

bool is_pretraining_head(const EncoderFamily& f, const std::string& key) {
  for (const auto& p : f.pretraining_heads)
    if (starts_with(key, p)) return true;
  return false;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  DS_CHECK(in.good(), "[hf_io] cannot read '{}'", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    DS_THROW("[hf_io] {}: not valid JSON ({})", p.string(), e.what());
  }
}

}  // namespace

EncoderConfig encoder_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: config.json must be a JSON object", source);
  // The model_type decides first: a decoder's export carries a "ds_cpp" block of its own.
  const bool typed = j.contains("model_type") && j["model_type"].is_string();
  const std::string type = typed ? j["model_type"].get<std::string>() : "";
  const EncoderFamily* family = typed ? &encoder_family_for_model_type(type, source) : nullptr;
  if (j.contains("ds_cpp")) {
    try {
      return EncoderConfig::from_json(j["ds_cpp"]);
    } catch (const Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  DS_CHECK(family,
           "[hf_io] {}: no \"model_type\"; an encoder classifier's config.json names bert, "
           "roberta or deberta-v2",
           source);
  return family->read_config(j, type, source);
}

json encoder_config_to_json(const EncoderConfig& c) {
  const EncoderFamily& f = encoder_family_of(c);
  json j = f.write_config(c);
  j["model_type"] = f.model_types.front();
  j["architectures"] = json::array({f.architecture});
  j["ds_cpp"] = c.to_json();
  return j;
}

std::optional<EncoderConfig> read_hf_encoder_config(const fs::path& path) {
  const fs::path file = path / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  const json j = read_json_file(file);
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string() ||
      !find_encoder_family(j["model_type"].get<std::string>()))
    return std::nullopt;
  return encoder_config_from_json(j, file.string());
}

EncoderLoadReport load_hf_encoder_weights(SequenceClassifier& model, const fs::path& path,
                                          bool allow_missing_head) {
  const EncoderConfig& cfg = model.config();
  const EncoderFamily& family = encoder_family_of(cfg);
  EncoderLoadReport report;
  std::vector<safetensors::Reader> readers;
  for (const auto& f : detail::weight_files(path)) {
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
  std::map<std::string, Found> by_key;  // file tensor name without the prefix -> the tensor
  std::vector<std::string> problems;
  for (size_t r = 0; r < readers.size(); ++r)
    for (const auto& e : readers[r].entries()) {
      auto [it, inserted] = by_key.emplace(key_of(family, e.name), Found{r, &e});
      if (!inserted)
        problems.push_back(fmt::format("duplicate: '{}' and '{}' are the same tensor",
                                       it->second.entry->name, e.name));
    }

  std::set<std::string> used;
  std::vector<std::pair<Tensor, Found>> plan;
  for (const auto& [ours, param] : model.named_parameters()) {
    const std::string file_name = family.place(cfg, ours);
    const std::string key = key_of(family, file_name);
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      if (allow_missing_head && family.is_head(ours)) {
        report.missing_head.push_back(ours);
        continue;
      }
      problems.push_back(fmt::format("missing: '{}' {}", file_name, shape_str(param.shape())));
      continue;
    }
    used.insert(key);
    const safetensors::Entry& e = *it->second.entry;
    if (e.shape != param.shape()) {
      std::string why;
      if (family.is_head(ours) && !e.shape.empty() && e.shape[0] != cfg.num_labels &&
          param.shape()[0] == cfg.num_labels)
        why = fmt::format(" (the file's head has {} labels, config.json {})", e.shape[0],
                          cfg.num_labels);
      problems.push_back(fmt::format("mis-shaped: '{}' is {} in the file, the model needs {}{}",
                                     e.name, shape_str(e.shape), shape_str(param.shape()), why));
    } else if (!e.supported) {
      problems.push_back(fmt::format("unsupported dtype: '{}' is {} (F32, BF16 and F16 are read)",
                                     e.name, e.dtype_name));
    } else {
      plan.emplace_back(param, it->second);
    }
  }
  for (const auto& [key, found] : by_key) {
    if (used.count(key)) continue;
    if (family.is_buffer(found.entry->name) ||
        (allow_missing_head && is_pretraining_head(family, key))) {
      report.ignored.push_back(found.entry->name);
      continue;
    }
    problems.push_back(fmt::format("extra: '{}' {} is not a parameter of this model{}",
                                   found.entry->name, shape_str(found.entry->shape),
                                   is_pretraining_head(family, key)
                                       ? " (a pretraining head: load with allow_missing_head to "
                                         "start a classifier from this checkpoint)"
                                       : ""));
  }
  if (!problems.empty())
    DS_THROW(
        "[hf_io] {}: {} problem{} loading weights into a {} classifier ({} layers, hidden {}, "
        "vocab {}, {} labels):\n  {}\nCheck that config.json describes the model these weights "
        "belong to",
        where, problems.size(), problems.size() == 1 ? "" : "s", family.name, cfg.n_layer,
        cfg.n_embd, cfg.vocab_size, cfg.num_labels, fmt::join(problems, "\n  "));

  autograd::NoGradGuard no_grad;
  for (const auto& [param, found] : plan) {
    param.detach().copy_from(readers[found.reader].get(found.entry->name));
    const int64_t bad = detail::first_non_finite(param.detach());
    DS_CHECK(bad < 0,
             "[hf_io] {}: tensor '{}' holds a non-finite value (NaN or Inf) at element {} of {}; "
             "these weights cannot be used: take an earlier checkpoint, or check how this file "
             "was written",
             readers[found.reader].path(), found.entry->name, bad, param.numel());
    ++report.tensors;
  }
  return report;
}

void write_hf_label_names(const fs::path& dir, const std::vector<std::string>& names) {
  const fs::path file = dir / "config.json";
  json cfg;
  try {
    cfg = json::parse(std::ifstream(file));
  } catch (const json::exception& e) {
    DS_THROW("[hf_io] {}: not valid JSON ({})", file.string(), e.what());
  }
  const int64_t nl = cfg.value(
      "num_labels", static_cast<int64_t>(cfg.value("id2label", json::object()).size()));
  DS_CHECK(static_cast<int64_t>(names.size()) == nl,
           "[hf_io] {}: {} label names for a model of {} labels", file.string(), names.size(), nl);
  json id2label = json::object(), label2id = json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = static_cast<int64_t>(i);
  }
  cfg["id2label"] = id2label;
  cfg["label2id"] = label2id;
  detail::write_text_atomic(file, cfg.dump(2) + "\n");
}

void export_hf_encoder(const SequenceClassifier& model, const fs::path& dir, DType dtype) {
  const EncoderConfig& cfg = model.config();
  const EncoderFamily& family = encoder_family_of(cfg);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[hf_io] cannot create '{}': {}", dir.string(), ec.message());
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [ours, p] : model.named_parameters())
    tensors.emplace_back(family.place(cfg, ours), p.detach().contiguous().to(dtype));
  // transformers refuses a safetensors file without format metadata.
  safetensors::save((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  json j = encoder_config_to_json(cfg);
  j["dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  detail::write_text_atomic(dir / "config.json", j.dump(2) + "\n");
}

}  // namespace ds::models
