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
#include "ds/models/family.h"
#include "ds/ops/ops.h"
#include "hf_weights.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
  const Family* family =
      typed ? &family_for_model_type(type, source, ModelKind::encoder_classifier) : nullptr;
  if (j.contains("ds_cpp")) {
    try {
      return EncoderConfig::from_json(j["ds_cpp"]);
    } catch (const Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  DS_CHECK(family, "[hf_io] {}: no \"model_type\"; an encoder classifier's config.json names {}",
           source, supported_model_types(ModelKind::encoder_classifier));
  return family->encoder.read_config(j, type, source);
}

json encoder_config_to_json(const EncoderConfig& c) {
  const Family& f = family_of(c);
  json j = f.encoder.write_config(c);
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
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return std::nullopt;
  const Family* f = find_family(j["model_type"].get<std::string>());
  if (!f || f->kind != ModelKind::encoder_classifier) return std::nullopt;
  return encoder_config_from_json(j, file.string());
}

EncoderLoadReport load_hf_encoder_weights(SequenceClassifier& model, const fs::path& path,
                                          bool allow_missing_head) {
  const EncoderConfig& cfg = model.config();
  const Family& family = family_of(cfg);
  const EncoderParts& enc = family.encoder;
  std::vector<detail::Target> targets;
  for (const auto& [ours, p] : model.named_parameters())
    targets.push_back({ours, p, enc.place(cfg, ours), allow_missing_head && enc.is_head(ours)});
  auto pretraining_head = [&](const std::string& key) {
    for (const auto& p : enc.pretraining_heads)
      if (key.rfind(p, 0) == 0) return true;
    return false;
  };
  detail::ImportRules rules;
  rules.prefix = family.prefix;
  rules.describe = fmt::format("a {} classifier ({} layers, hidden {}, vocab {}, {} labels)",
                               family.name, cfg.n_layer, cfg.n_embd, cfg.vocab_size,
                               cfg.num_labels);
  rules.unused = [&](const std::string& key, const detail::FileTensor& t, const detail::FileIndex&) {
    if (family.is_buffer(t.entry->name) || (allow_missing_head && pretraining_head(key)))
      return detail::Unused{detail::Unused::ignored, ""};
    return detail::Unused{detail::Unused::extra,
                          pretraining_head(key)
                              ? " (a pretraining head: load with allow_missing_head to start a "
                                "classifier from this checkpoint)"
                              : ""};
  };
  rules.shape_note = [&](const detail::Target& t, const Shape& file) -> std::string {
    if (enc.is_head(t.ours) && !file.empty() && file[0] != cfg.num_labels &&
        t.tensor.shape()[0] == cfg.num_labels)
      return fmt::format(" (the file's head has {} labels, config.json {})", file[0],
                         cfg.num_labels);
    return "";
  };
  const detail::ImportReport r = detail::import_weights(path, targets, rules);
  return {r.files, r.tensors, r.ignored, r.missing};
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
  const Family& family = family_of(cfg);
  const auto place = [&](const std::string& ours) { return family.encoder.place(cfg, ours); };
  detail::write_hf_folder(dir, detail::export_tensors(model.named_parameters(), place, dtype),
                          encoder_config_to_json(cfg), dtype);
}

}  // namespace ds::models
