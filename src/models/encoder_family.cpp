#include "ds/models/encoder_family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"

namespace ds::models {

const std::vector<const EncoderFamily*>& all_encoder_families() {
  static const std::vector<const EncoderFamily*> all = {
      &encoder_families::bert, &encoder_families::roberta, &encoder_families::deberta_v2};
  return all;
}

std::string supported_encoder_model_types() {
  std::vector<std::string> types;
  for (const EncoderFamily* f : all_encoder_families())
    for (const auto& t : f->model_types) types.push_back(t);
  return fmt::format("{}", fmt::join(types, ", "));
}

const EncoderFamily* find_encoder_family(const std::string& model_type) {
  for (const EncoderFamily* f : all_encoder_families())
    for (const auto& t : f->model_types)
      if (t == model_type) return f;
  return nullptr;
}

const EncoderFamily& encoder_family_for_model_type(const std::string& model_type,
                                                   const std::string& source) {
  if (const EncoderFamily* f = find_encoder_family(model_type)) return *f;
  DS_THROW("[hf_io] {}: model_type \"{}\" is not an encoder classifier we read (supported: {}){}",
           source, model_type, supported_encoder_model_types(),
           model_type == "deberta" ? "; DeBERTa (v1) is not supported, DeBERTa-v2 is" : "");
}

bool EncoderFamily::is_head(const std::string& ours) const {
  for (const auto& p : head_prefixes)
    if (ours.rfind(p, 0) == 0) return true;
  return false;
}

std::shared_ptr<SequenceClassifier> make_encoder_classifier(const EncoderConfig& c, bool init) {
  return encoder_family_of(c).build(c, init);
}

const EncoderFamily& encoder_family_of(const EncoderConfig& c) {
  for (const EncoderFamily* f : all_encoder_families())
    if (f->name == c.family) return *f;
  DS_THROW("[model] encoder family \"{}\" is unknown (known: {})", c.family,
           supported_encoder_model_types());
}

}  // namespace ds::models
