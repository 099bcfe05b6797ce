// DeBERTa-v2: DebertaV2ForSequenceClassification (ds/models/family.h, the model in
// ds/models/deberta.h). Reads DebertaV2Config's fields, including those transformers reads by
// getattr with a default (position_buckets, share_att_key, norm_rel_ebd, conv_*, embedding_size,
// cls_dropout, attention_head_size, pooler_hidden_size).
//
//   deberta.embeddings.*, deberta.encoder.layer.{i}.*, deberta.encoder.rel_embeddings.weight,
//   deberta.encoder.LayerNorm.*, deberta.encoder.conv.*, pooler.dense.*, classifier.*
//   (the last two unprefixed). embeddings.position_ids (old files) and, with
//   position_biased_input false, embeddings.position_embeddings.weight are skipped.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/deberta.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

std::vector<std::string> split_bar(const std::string& s) {  // "p2c|c2p" -> lower-cased parts
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    const auto b = cur.find_first_not_of(" \t"), e = cur.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
    cur.clear();
  };
  for (char ch : s) {
    if (ch == '|')
      flush();
    else
      cur.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  }
  flush();
  return out;
}

EncoderConfig read(const json& j, const std::string& model_type, const std::string& source) {
  // DebertaV2Config's fields (5.x), those its modules read by getattr, and harmless ones: legacy
  // and tie_word_embeddings pick and tie the MLM head this class does not have.
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
                                               "relative_attention",
                                               "max_relative_positions",
                                               "position_biased_input",
                                               "pos_att_type",
                                               "pooler_dropout",
                                               "pooler_hidden_act",
                                               "pooler_hidden_size",
                                               "legacy",
                                               "tie_word_embeddings",
                                               "gradient_checkpointing",
                                               "embedding_size",
                                               "position_buckets",
                                               "share_att_key",
                                               "norm_rel_ebd",
                                               "conv_kernel_size",
                                               "conv_act",
                                               "conv_groups",
                                               "cls_dropout",
                                               "attention_head_size",
                                               "num_labels"};
  hf::check_known_fields(j, fields, model_type, source);
  hf::check_dtype_fields(j, source);
  EncoderConfig c;
  c.family = "deberta-v2";
  c.vocab_size = hf::get_field<int64_t>(j, "vocab_size", 128100, source);
  c.n_embd = hf::get_field<int64_t>(j, "hidden_size", 1536, source);
  c.n_layer = hf::get_field<int64_t>(j, "num_hidden_layers", 24, source);
  c.n_head = hf::get_field<int64_t>(j, "num_attention_heads", 24, source);
  c.ffn_hidden = hf::get_field<int64_t>(j, "intermediate_size", 6144, source);
  c.max_positions = hf::get_field<int64_t>(j, "max_position_embeddings", 512, source);
  c.type_vocab_size = hf::get_field<int64_t>(j, "type_vocab_size", 0, source);
  c.norm_eps = hf::get_field<float>(j, "layer_norm_eps", 1e-7f, source);
  c.hidden_dropout = hf::get_field<float>(j, "hidden_dropout_prob", 0.1f, source);
  c.attention_dropout = hf::get_field<float>(j, "attention_probs_dropout_prob", 0.1f, source);
  c.classifier_dropout = hf::get_field<float>(j, "cls_dropout", -1.0f, source);
  c.initializer_range = hf::get_field<float>(j, "initializer_range", 0.02f, source);
  c.pad_token_id = hf::get_field<int64_t>(j, "pad_token_id", 0, source);
  c.hidden_act = hf::get_field<std::string>(j, "hidden_act", "gelu", source);
  DebertaOptions& d = c.deberta;
  d.embedding_size = hf::get_field<int64_t>(j, "embedding_size", 0, source);
  if (d.embedding_size == c.n_embd) d.embedding_size = 0;
  d.position_biased_input = hf::get_field<bool>(j, "position_biased_input", true, source);
  d.relative_attention = hf::get_field<bool>(j, "relative_attention", false, source);
  d.max_relative_positions = hf::get_field<int64_t>(j, "max_relative_positions", -1, source);
  d.position_buckets = hf::get_field<int64_t>(j, "position_buckets", -1, source);
  d.share_att_key = hf::get_field<bool>(j, "share_att_key", false, source);
  d.conv_kernel_size = hf::get_field<int64_t>(j, "conv_kernel_size", 0, source);
  d.conv_act = hf::get_field<std::string>(j, "conv_act", "tanh", source);
  d.conv_groups = hf::get_field<int64_t>(j, "conv_groups", 1, source);
  d.pooler_hidden_act = hf::get_field<std::string>(j, "pooler_hidden_act", "gelu", source);
  d.pooler_dropout = hf::get_field<float>(j, "pooler_dropout", 0.0f, source);

  // pos_att_type: a list, or transformers' "p2c|c2p" string form (lower-cased, split on '|').
  std::vector<std::string> kinds;
  if (j.contains("pos_att_type") && !j["pos_att_type"].is_null()) {
    if (j["pos_att_type"].is_string())
      kinds = split_bar(j["pos_att_type"].get<std::string>());
    else
      kinds = hf::get_field<std::vector<std::string>>(j, "pos_att_type", {}, source);
  }
  for (const auto& k : kinds) {
    DS_CHECK(k == "c2p" || k == "p2c",
             "[hf_io] {}: pos_att_type \"{}\" is not a relative attention kind DeBERTa-v2 "
             "computes (c2p, p2c)",
             source, k);
    (k == "c2p" ? d.c2p : d.p2c) = true;
  }
  for (const auto& n : split_bar(hf::get_field<std::string>(j, "norm_rel_ebd", "none", source))) {
    DS_CHECK(n == "none" || n == "layer_norm",
             "[hf_io] {}: norm_rel_ebd \"{}\" is not supported (none, layer_norm)", source, n);
    if (n == "layer_norm") d.norm_rel_ebd = true;
  }
  DS_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0,
           "[hf_io] {}: hidden_size {} is not divisible by num_attention_heads {}", source,
           c.n_embd, c.n_head);
  const int64_t head =
      hf::get_field<int64_t>(j, "attention_head_size", c.n_embd / c.n_head, source);
  DS_CHECK(head == c.n_embd / c.n_head,
           "[hf_io] {}: attention_head_size {} differs from hidden_size / num_attention_heads "
           "{}; only that head size is supported",
           source, head, c.n_embd / c.n_head);
  const int64_t pooler = hf::get_field<int64_t>(j, "pooler_hidden_size", c.n_embd, source);
  DS_CHECK(pooler == c.n_embd,
           "[hf_io] {}: pooler_hidden_size {} differs from hidden_size {} (the pooler reads the "
           "hidden states: transformers could not run it either)",
           source, pooler, c.n_embd);

  hf::finish_classifier_config(j, c, source);
  return c;
}

json write(const EncoderConfig& c) {
  const DebertaOptions& d = c.deberta;
  json pos = json::array();
  if (d.p2c) pos.push_back("p2c");
  if (d.c2p) pos.push_back("c2p");
  json j = hf::write_encoder_common(c);
  j["relative_attention"] = d.relative_attention;
  j["max_relative_positions"] = d.max_relative_positions;
  j["position_buckets"] = d.position_buckets;
  j["position_biased_input"] = d.position_biased_input;
  j["pos_att_type"] = pos;
  j["share_att_key"] = d.share_att_key;
  j["norm_rel_ebd"] = d.norm_rel_ebd ? "layer_norm" : "none";
  j["conv_kernel_size"] = d.conv_kernel_size;
  j["conv_act"] = d.conv_act;
  j["conv_groups"] = d.conv_groups;
  j["pooler_hidden_size"] = c.n_embd;
  j["pooler_hidden_act"] = d.pooler_hidden_act;
  j["pooler_dropout"] = hf::shortest(d.pooler_dropout);
  if (d.embedding_size > 0) j["embedding_size"] = d.embedding_size;
  if (c.classifier_dropout >= 0.0f) j["cls_dropout"] = hf::shortest(c.classifier_dropout);
  return j;
}

HFPlace place(const EncoderConfig&, const std::string& ours) {
  const bool head = ours.rfind("classifier.", 0) == 0 || ours.rfind("pooler.", 0) == 0;
  return {head ? ours : "deberta." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex buffers(
      R"((deberta\.)?embeddings\.(position_ids|position_embeddings\.weight))");
  return std::regex_match(name, buffers);
}

Family make() {
  Family f;
  f.name = "deberta-v2";
  f.kind = ModelKind::encoder_classifier;
  f.model_types = {"deberta-v2"};
  f.architecture = "DebertaV2ForSequenceClassification";
  f.prefix = "deberta.";
  f.encoder.head_prefixes = {"pooler.", "classifier."};
  f.lora_targets = {"query_proj", "value_proj"};
  f.encoder.pretraining_heads = {"cls.", "lm_predictions.", "mask_predictions.", "lm_head."};
  f.encoder.read_config = read;
  f.encoder.write_config = write;
  f.encoder.place = place;
  f.is_buffer = is_buffer;
  f.encoder.build = [](const EncoderConfig& c, bool init) -> std::shared_ptr<SequenceClassifier> {
    return std::make_shared<DebertaClassifier>(c, init);
  };
  return f;
}

}  // namespace

namespace families {
const Family deberta_v2 = make();
}  // namespace families

}  // namespace ds::models
