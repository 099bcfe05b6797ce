// BERT and RoBERTa: BertForSequenceClassification and RobertaForSequenceClassification
// (ds/models/family.h). Both read BertConfig's fields; they differ in defaults, in position
// ids (RoBERTa's start past pad_token_id) and in the head (bert: pooler.dense + classifier;
// roberta: classifier.dense + classifier.out_proj), which EncoderConfig::family selects.
//
//   [bert.|roberta.]embeddings.{word,position,token_type}_embeddings.weight,
//   embeddings.LayerNorm.*, encoder.layer.{i}.attention.self.{query,key,value}.*,
//   encoder.layer.{i}.attention.output.*, encoder.layer.{i}.intermediate.dense.*,
//   encoder.layer.{i}.output.*, bert.pooler.dense.*, classifier.* (unprefixed). Old files carry
//   embeddings.position_ids (a buffer): skipped.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

struct Defaults {
  int64_t vocab_size;
  int64_t pad_token_id;
};

EncoderConfig read_common(const json& j, const std::string& model_type, const std::string& source,
                          const Defaults& d) {
  // BertConfig's fields (5.x) and the 4.x ones still found on the Hub. gradient_checkpointing is
  // a memory switch; directionality and pooler_* are Google's original config keys that
  // transformers never read; tie_word_embeddings ties an MLM head this class does not have.
  static const std::set<std::string> fields = {"vocab_size",
                                               "hidden_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "intermediate_size",
                                               "hidden_act",
                                               "hidden_dropout_prob",
                                               "attention_probs_dropout_prob",
                                               "max_position_embeddings",
                                               "type_vocab_size",
                                               "layer_norm_eps",
                                               "classifier_dropout",
                                               "position_embedding_type",
                                               "tie_word_embeddings",
                                               "gradient_checkpointing",
                                               "num_labels",
                                               "directionality",
                                               "pooler_fc_size",
                                               "pooler_num_attention_heads",
                                               "pooler_num_fc_layers",
                                               "pooler_size_per_head",
                                               "pooler_type"};
  hf::check_known_fields(j, fields, model_type, source);
  hf::check_dtype_fields(j, source);
  EncoderConfig c;
  c.family = model_type;
  c.vocab_size = hf::get_field<int64_t>(j, "vocab_size", d.vocab_size, source);
  c.n_embd = hf::get_field<int64_t>(j, "hidden_size", 768, source);
  c.n_layer = hf::get_field<int64_t>(j, "num_hidden_layers", 12, source);
  c.n_head = hf::get_field<int64_t>(j, "num_attention_heads", 12, source);
  c.ffn_hidden = hf::get_field<int64_t>(j, "intermediate_size", 3072, source);
  c.max_positions = hf::get_field<int64_t>(j, "max_position_embeddings", 512, source);
  c.type_vocab_size = hf::get_field<int64_t>(j, "type_vocab_size", 2, source);
  c.norm_eps = hf::get_field<float>(j, "layer_norm_eps", 1e-12f, source);
  c.hidden_dropout = hf::get_field<float>(j, "hidden_dropout_prob", 0.1f, source);
  c.attention_dropout = hf::get_field<float>(j, "attention_probs_dropout_prob", 0.1f, source);
  c.classifier_dropout = hf::get_field<float>(j, "classifier_dropout", -1.0f, source);
  c.initializer_range = hf::get_field<float>(j, "initializer_range", 0.02f, source);
  c.pad_token_id = hf::get_field<int64_t>(j, "pad_token_id", d.pad_token_id, source);
  c.hidden_act = hf::get_field<std::string>(j, "hidden_act", "gelu", source);
  DS_CHECK(
      c.hidden_act == "gelu" || c.hidden_act == "gelu_new" || c.hidden_act == "gelu_pytorch_tanh",
      "[hf_io] {}: hidden_act \"{}\" is not supported (gelu, gelu_new, gelu_pytorch_tanh)", source,
      c.hidden_act);
  const auto pos = hf::get_field<std::string>(j, "position_embedding_type", "absolute", source);
  DS_CHECK(pos == "absolute",
           "[hf_io] {}: position_embedding_type \"{}\" is not supported (only \"absolute\"; "
           "transformers 5 removed the relative kinds too)",
           source, pos);
  DS_CHECK(!hf::get_field<bool>(j, "is_decoder", false, source),
           "[hf_io] {}: is_decoder true makes the attention causal; the encoder classifier is "
           "bidirectional only",
           source);
  DS_CHECK(!hf::get_field<bool>(j, "add_cross_attention", false, source),
           "[hf_io] {}: add_cross_attention true is not supported (an encoder-decoder layer)",
           source);
  hf::finish_classifier_config(j, c, source);
  return c;
}

EncoderConfig read_bert(const json& j, const std::string& model_type, const std::string& source) {
  return read_common(j, model_type, source, {30522, 0});
}

EncoderConfig read_roberta(const json& j, const std::string& model_type,
                           const std::string& source) {
  return read_common(j, model_type, source, {50265, 1});
}

json write(const EncoderConfig& c) {
  json j = hf::write_encoder_common(c);
  j["classifier_dropout"] =
      c.classifier_dropout >= 0.0f ? json(hf::shortest(c.classifier_dropout)) : json();
  j["is_decoder"] = false;
  j["add_cross_attention"] = false;
  return j;
}

HFPlace place_with(const std::string& prefix, const std::string& ours) {
  return {ours.rfind("classifier.", 0) == 0 ? ours : prefix + ours};
}

HFPlace place_bert(const EncoderConfig&, const std::string& ours) {
  return place_with("bert.", ours);
}
HFPlace place_roberta(const EncoderConfig&, const std::string& ours) {
  return place_with("roberta.", ours);
}

bool is_buffer(const std::string& name) {
  static const std::regex buffers(
      R"(((bert|roberta)\.)?embeddings\.(position_ids|token_type_ids))");
  return std::regex_match(name, buffers);
}

// RoBERTa pretraining files carry a pooler that RobertaForSequenceClassification drops.
bool is_buffer_roberta(const std::string& name) {
  static const std::regex pooler(R"((roberta\.)?pooler\.dense\.(weight|bias))");
  return is_buffer(name) || std::regex_match(name, pooler);
}

Family make(const char* name, const char* arch, const char* prefix,
                   EncoderConfig (*read)(const json&, const std::string&, const std::string&),
                   HFPlace (*place)(const EncoderConfig&, const std::string&),
                   bool (*buffer)(const std::string&)) {
  Family f;
  f.name = name;
  f.kind = ModelKind::encoder_classifier;
  f.model_types = {name};
  f.architecture = arch;
  f.prefix = prefix;
  f.lora_targets = {"query", "value"};
  f.encoder.read_config = read;
  f.encoder.write_config = write;
  f.encoder.place = place;
  f.is_buffer = buffer;
  f.encoder.build = [](const EncoderConfig& c, bool init) -> std::shared_ptr<SequenceClassifier> {
    return std::make_shared<EncoderClassifier>(c, init);
  };
  return f;
}

}  // namespace

namespace families {
const Family bert =
    make("bert", "BertForSequenceClassification", "bert.", read_bert, place_bert, is_buffer);
const Family roberta = make("roberta", "RobertaForSequenceClassification", "roberta.",
                                   read_roberta, place_roberta, is_buffer_roberta);
}  // namespace families

}  // namespace ds::models
