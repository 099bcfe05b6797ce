// A model from the config ds_train records, of any kind (ds/models/recorded_model.h).
#include "ds/models/recorded_model.h"

#include <fstream>
#include <map>
#include <set>

#include "ds/core/error.h"
#include "ds/models/encoder.h"
#include "ds/models/encoder_io.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_io.h"

namespace ds::models {
namespace {

// Copies whole named weights into every parameter of `model` (built without initialisation):
// each parameter exactly once, with its shape; no name the model lacks.
void fill_parameters(const nn::Module& model,
                     const std::vector<std::pair<std::string, Tensor>>& named_weights,
                     const char* kind) {
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params.emplace(name, p);
  std::set<std::string> seen;
  for (const auto& [name, w] : named_weights) {
    const auto it = params.find(name);
    DS_CHECK(it != params.end(),
             "[export] weight '{}' is not a parameter of the recorded {} model (is the recorded "
             "config the one these weights were trained with?)",
             name, kind);
    DS_CHECK(seen.insert(name).second, "[export] weight '{}' is given twice", name);
    DS_CHECK(w.shape() == it->second.shape(),
             "[export] weight '{}' has shape {}, the recorded {} model's parameter {}", name,
             shape_str(w.shape()), kind, shape_str(it->second.shape()));
    it->second.copy_from(w);
  }
  for (const auto& [name, p] : params)
    DS_CHECK(seen.count(name), "[export] no weight for parameter '{}' of the recorded {} model",
             name, kind);
}

// Copies the given buffers into the model's buffers of the same names and shapes.
void fill_buffers(const nn::Module& model,
                  const std::vector<std::pair<std::string, Tensor>>& named_buffers,
                  const char* kind) {
  std::map<std::string, Tensor> buffers;
  for (const auto& [name, b] : model.named_buffers()) buffers.emplace(name, b);
  for (const auto& [name, t] : named_buffers) {
    const auto it = buffers.find(name);
    DS_CHECK(it != buffers.end(), "[export] '{}' is not a buffer of the recorded {} model", name,
             kind);
    DS_CHECK(t.shape() == it->second.shape(),
             "[export] buffer '{}' has shape {}, the recorded {} model's {}", name,
             shape_str(t.shape()), kind, shape_str(it->second.shape()));
    it->second.copy_from(t);
  }
}

}  // namespace

ModelKind recorded_model_kind(const nlohmann::json& config) {
  DS_CHECK(config.is_object(), "[export] a recorded model config must be a JSON object");
  const std::string family = config.value("family", std::string());
  for (const Family* f : all_families())
    if (f->name == family) return f->kind;
  return ModelKind::decoder;
}

const Family* hf_folder_family(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return nullptr;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::ifstream(file));
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[hf_io] {}: not valid JSON ({})", file.string(), e.what());
  }
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return nullptr;
  return find_family(j["model_type"].get<std::string>());
}

nlohmann::json recorded_model_json(const std::string& name, const std::string& tool) {
  const std::filesystem::path path(name);
  std::error_code ec;
  const Family* f = std::filesystem::is_directory(path, ec) ? hf_folder_family(path) : nullptr;
  switch (f ? f->kind : ModelKind::decoder) {
    case ModelKind::encoder_classifier:
      return read_hf_encoder_config(path)->to_json();
    case ModelKind::seq2seq:
      return read_hf_seq2seq_config(path)->to_json();
    case ModelKind::decoder:
      break;
  }
  return resolve_model_config(name, tool).to_json();
}

int64_t recorded_vocab_size(const nlohmann::json& config) {
  switch (recorded_model_kind(config)) {
    case ModelKind::encoder_classifier:
      return EncoderConfig::from_json(config).vocab_size;
    case ModelKind::seq2seq:
      return Seq2SeqConfig::from_json(config).vocab_size;
    case ModelKind::decoder:
      break;
  }
  return GPTConfig::from_json(config).vocab_size;
}

void export_hf_recorded(const nlohmann::json& config,
                        const std::vector<std::pair<std::string, Tensor>>& named_weights,
                        const std::filesystem::path& dir, DType dtype,
                        const std::vector<std::pair<std::string, Tensor>>& named_buffers) {
  const ModelKind kind = recorded_model_kind(config);
  switch (kind) {
    case ModelKind::encoder_classifier: {
      const auto model = make_encoder_classifier(EncoderConfig::from_json(config), /*init=*/false);
      fill_parameters(*model, named_weights, model_kind_name(kind));
      fill_buffers(*model, named_buffers, model_kind_name(kind));
      export_hf_encoder(*model, dir, dtype);
      return;
    }
    case ModelKind::seq2seq: {
      Seq2Seq model(Seq2SeqConfig::from_json(config), /*init=*/false);
      fill_parameters(model, named_weights, model_kind_name(kind));
      fill_buffers(model, named_buffers, model_kind_name(kind));
      export_hf_seq2seq(model, dir, dtype);
      return;
    }
    case ModelKind::decoder:
      break;
  }
  DS_CHECK(named_buffers.empty(), "[export] a decoder LM has no buffers, but {} were given ({})",
           named_buffers.size(), named_buffers.front().first);
  export_hf(GPTConfig::from_json(config), named_weights, dir, dtype);
}

}  // namespace ds::models
