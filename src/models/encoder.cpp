// BERT / RoBERTa sequence classifiers (ds/models/encoder.h): the config, the module tree under
// transformers' names, and the forward pass.
#include "ds/models/encoder.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/family.h"
#include "ds/models/deberta.h"
#include "ds/models/gpt.h"  // ParamInit / GPT::init_values: the same counter-based draws
#include "module_util.h"

namespace ds::models {

using detail::check_ids;
using detail::Container;
using detail::init_encoder_values;
using detail::zero_span;

using nlohmann::json;

// ---- config ----

bool EncoderConfig::regression() const {
  if (!problem_type.empty()) return problem_type == "regression";
  return num_labels == 1;
}

void EncoderConfig::validate() const {
  family_of(*this);  // throws for an unknown family, naming the known ones
  DS_CHECK(type_vocab_size > 0 || (is_deberta() && type_vocab_size == 0),
           "[model] encoder type_vocab_size must be positive{}, got {}",
           is_deberta() ? " or 0" : "", type_vocab_size);
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                                {"max_positions", max_positions},
                                {"n_layer", n_layer},
                                {"n_head", n_head},
                                {"n_embd", n_embd},
                                {"ffn_hidden", ffn_hidden},
                                {"num_labels", num_labels}})
    DS_CHECK(v > 0, "[model] encoder {} must be positive, got {}", name, v);
  DS_CHECK(n_embd % n_head == 0, "[model] encoder n_embd {} not divisible by n_head {}", n_embd,
           n_head);
  DS_CHECK(is_deberta() || hidden_act == "gelu" || hidden_act == "gelu_new" ||
               hidden_act == "gelu_pytorch_tanh",  // deberta-v2: validate_deberta
           "[model] encoder hidden_act \"{}\" is not supported (gelu, gelu_new, "
           "gelu_pytorch_tanh)",
           hidden_act);
  DS_CHECK(norm_eps > 0.0f, "[model] encoder norm_eps must be positive, got {}", norm_eps);
  for (const auto& [name, p] : {std::pair<const char*, float>{"hidden_dropout", hidden_dropout},
                                {"attention_dropout", attention_dropout}})
    DS_CHECK(p >= 0.0f && p < 1.0f, "[model] encoder {} must be in [0, 1), got {}", name, p);
  DS_CHECK(classifier_dropout < 1.0f, "[model] encoder classifier_dropout must be below 1, got {}",
           classifier_dropout);
  DS_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size,
           "[model] encoder pad_token_id {} outside the vocabulary [0, {})", pad_token_id,
           vocab_size);
  DS_CHECK(!roberta() || max_positions > pad_token_id + 1,
           "[model] roberta positions start after pad_token_id {}: max_positions {} leaves none",
           pad_token_id, max_positions);
  DS_CHECK(problem_type.empty() || problem_type == "regression" ||
               problem_type == "single_label_classification" ||
               problem_type == "multi_label_classification",
           "[model] encoder problem_type \"{}\" is unknown (regression, "
           "single_label_classification, multi_label_classification)",
           problem_type);
  DS_CHECK(!(problem_type == "single_label_classification" && num_labels < 2),
           "[model] single_label_classification needs num_labels >= 2, got {}", num_labels);
  DS_CHECK(initializer_range > 0.0f, "[model] encoder initializer_range must be positive");
  if (is_deberta()) validate_deberta(*this);
}

int64_t EncoderConfig::num_parameters() const {
  if (is_deberta()) return deberta_num_parameters(*this);
  const int64_t C = n_embd, F = ffn_hidden;
  const int64_t emb = (vocab_size + max_positions + type_vocab_size) * C + 2 * C;
  const int64_t layer = 4 * (C * C + C) + 2 * (2 * C) + (C * F + F) + (F * C + C);
  const int64_t head = (C * C + C) + (C * num_labels + num_labels);
  return emb + n_layer * layer + head;
}

json EncoderConfig::to_json() const {
  json j = {{"family", family},
            {"vocab_size", vocab_size},
            {"max_positions", max_positions},
            {"type_vocab_size", type_vocab_size},
            {"n_layer", n_layer},
            {"n_head", n_head},
            {"n_embd", n_embd},
            {"ffn_hidden", ffn_hidden},
            {"hidden_act", hidden_act},
            {"norm_eps", norm_eps},
            {"hidden_dropout", hidden_dropout},
            {"attention_dropout", attention_dropout},
            {"classifier_dropout", classifier_dropout},
            {"pad_token_id", pad_token_id},
            {"num_labels", num_labels},
            {"problem_type", problem_type},
            {"initializer_range", initializer_range},
            {"seed", seed}};
  if (is_deberta()) j["deberta"] = deberta_options_to_json(deberta);
  return j;
}

EncoderConfig EncoderConfig::from_json(const json& j) {
  DS_CHECK(j.is_object(), "[model] an encoder config must be a JSON object");
  EncoderConfig c;
  const json known = c.to_json();
  for (const auto& [k, v] : j.items())
    DS_CHECK(known.contains(k) || k == "deberta", "[model] unknown encoder config field \"{}\"", k);
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j[key].get<std::decay_t<decltype(field)>>();
    } catch (const json::exception&) {
      DS_THROW("[model] encoder config field \"{}\" has a bad value: {}", key, j[key].dump());
    }
  };
  get("family", c.family);
  get("vocab_size", c.vocab_size);
  get("max_positions", c.max_positions);
  get("type_vocab_size", c.type_vocab_size);
  get("n_layer", c.n_layer);
  get("n_head", c.n_head);
  get("n_embd", c.n_embd);
  get("ffn_hidden", c.ffn_hidden);
  get("hidden_act", c.hidden_act);
  get("norm_eps", c.norm_eps);
  get("hidden_dropout", c.hidden_dropout);
  get("attention_dropout", c.attention_dropout);
  get("classifier_dropout", c.classifier_dropout);
  get("pad_token_id", c.pad_token_id);
  get("num_labels", c.num_labels);
  get("problem_type", c.problem_type);
  get("initializer_range", c.initializer_range);
  get("seed", c.seed);
  if (j.contains("deberta")) {
    DS_CHECK(c.is_deberta(),
             "[model] encoder config field \"deberta\" is for family deberta-v2, "
             "not {}",
             c.family);
    c.deberta = deberta_options_from_json(j["deberta"]);
  }
  c.validate();
  return c;
}

// ---- the module tree ----

namespace {

// weight[ids] whose gradient skips the rows of ids equal to pad (torch's Embedding(padding_idx)).
// keep (B, T, 1) is 1 where ids != pad: keep * e + (1 - keep) * e.detach() is e exactly (each
// term is e or +-0), and only the first term carries a gradient. The lookup's output is reused,
// never the weight outside its module's call (ZeRO-3 holds it only inside).
Tensor lookup(nn::Embedding& emb, const Tensor& ids, const Tensor& keep) {
  Tensor e = emb(ids);  // (B, T, C)
  if (!keep.defined() || !e.requires_grad()) return e;
  return ops::add(ops::mul(e, keep), ops::mul(e.detach(), ops::add(ops::neg(keep), 1.0f)));
}

}  // namespace

class EncoderClassifier::Layer : public nn::Module {
 public:
  Layer(const EncoderConfig& c, std::shared_ptr<ops::AttentionMask> mask)
      : Module("EncoderLayer"),
        n_head_(c.n_head),
        dropout_(c.hidden_dropout),
        attn_dropout_(c.attention_dropout),
        exact_gelu_(c.hidden_act == "gelu"),
        mask_(std::move(mask)) {
    const int64_t C = c.n_embd, F = c.ffn_hidden;
    auto attention = register_module("attention", std::make_shared<Container>("BertAttention"));
    auto self = attention->add("self", std::make_shared<Container>("BertSelfAttention"));
    query_ = self->add("query", std::make_shared<nn::Linear>(C, C));
    key_ = self->add("key", std::make_shared<nn::Linear>(C, C));
    value_ = self->add("value", std::make_shared<nn::Linear>(C, C));
    auto attn_out = attention->add("output", std::make_shared<Container>("BertSelfOutput"));
    attn_dense_ = attn_out->add("dense", std::make_shared<nn::Linear>(C, C));
    attn_norm_ = attn_out->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    auto inter = register_module("intermediate", std::make_shared<Container>("BertIntermediate"));
    inter_dense_ = inter->add("dense", std::make_shared<nn::Linear>(C, F));
    auto out = register_module("output", std::make_shared<Container>("BertOutput"));
    out_dense_ = out->add("dense", std::make_shared<nn::Linear>(F, C));
    out_norm_ = out->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  }

  Tensor forward(const Tensor& x) override {  // (B, T, C) -> (B, T, C)
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), NH = n_head_, hd = C / NH;
    auto heads = [&](nn::Linear& proj) {  // (B, T, C) -> (B, NH, T, hd)
      return ops::contiguous(ops::transpose(ops::reshape(proj(x), {B, T, NH, hd}), 1, 2));
    };
    const bool tr = is_training();
    const Tensor q = heads(*query_), k = heads(*key_), v = heads(*value_);
    Tensor a = tr && attn_dropout_ > 0.0f ? probs_dropout_attention(q, k, v)
                                          : ops::attention(q, k, v, *mask_);  // (B, NH, T, hd)
    a = ops::reshape(ops::contiguous(ops::transpose(a, 1, 2)), {B, T, C});    // (B, T, C)
    Tensor h = (*attn_norm_)(ops::add(ops::dropout((*attn_dense_)(a), dropout_, tr), x));
    Tensor f = (*inter_dense_)(h);  // (B, T, F)
    f = exact_gelu_ ? ops::gelu_erf(f) : ops::gelu(f);
    return (*out_norm_)(ops::add(ops::dropout((*out_dense_)(f), dropout_, tr), h));
  }

 private:
  // Dropout on the attention probabilities (attention_probs_dropout_prob, training only) needs
  // them formed: softmax(q k^T / sqrt(hd) + mask) (B, NH, T, T), dropout, @ v, as transformers'
  // eager attention. The fused kernel serves everything else.
  Tensor probs_dropout_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
    const int64_t B = q.size(0), T = q.size(2), hd = q.size(3);
    Tensor s = ops::mul(ops::matmul(q, ops::transpose(k, 2, 3)),
                        1.0f / std::sqrt(static_cast<float>(hd)));  // (B, NH, T, T)
    if (!mask_->key_lengths.empty()) {  // padded keys: a large negative bias, as transformers
      std::vector<float> bias(static_cast<size_t>(B * T), 0.0f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = mask_->key_lengths[static_cast<size_t>(b)]; t < T; ++t)
          bias[static_cast<size_t>(b * T + t)] = -1e30f;
      Tensor mb = Tensor::from_data(bias, {B, 1, 1, T});
      if (!s.device().is_cpu()) {
        Tensor d = Tensor::empty(mb.shape(), DType::f32, s.device());
        d.copy_from(mb);
        mb = d;
      }
      s = ops::add(s, mb.to(s.dtype()));
    }
    Tensor p = ops::dropout(ops::softmax(s), attn_dropout_, true);
    return ops::matmul(p, v);  // (B, NH, T, hd)
  }

  int64_t n_head_;
  float dropout_;
  float attn_dropout_;
  bool exact_gelu_;
  std::shared_ptr<ops::AttentionMask> mask_;
  std::shared_ptr<nn::Linear> query_, key_, value_, attn_dense_, inter_dense_, out_dense_;
  std::shared_ptr<nn::LayerNorm> attn_norm_, out_norm_;
};

EncoderClassifier::EncoderClassifier(EncoderConfig config, bool init)
    : SequenceClassifier("EncoderClassifier"),
      config_(std::move(config)),
      mask_(std::make_shared<ops::AttentionMask>()) {
  config_.validate();
  const EncoderConfig& c = config_;
  const int64_t C = c.n_embd;
  auto emb = register_module("embeddings", std::make_shared<Container>("BertEmbeddings"));
  word_ = emb->add("word_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, C));
  position_ = emb->add("position_embeddings", std::make_shared<nn::Embedding>(c.max_positions, C));
  token_type_ =
      emb->add("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, C));
  emb_norm_ = emb->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  auto encoder = register_module("encoder", std::make_shared<Container>("BertEncoder"));
  auto list = encoder->add("layer", std::make_shared<nn::ModuleList>());
  mask_->causal = false;
  for (int64_t i = 0; i < c.n_layer; ++i)
    layers_.push_back(list->append(std::make_shared<Layer>(c, mask_)));
  if (c.roberta()) {  // RobertaClassificationHead: dense + tanh + out_proj
    auto head = register_module("classifier", std::make_shared<Container>("RobertaHead"));
    pooler_ = head->add("dense", std::make_shared<nn::Linear>(C, C));
    classifier_ = head->add("out_proj", std::make_shared<nn::Linear>(C, c.num_labels));
  } else {  // BertPooler (dense + tanh) and the classifier
    auto pooler = register_module("pooler", std::make_shared<Container>("BertPooler"));
    pooler_ = pooler->add("dense", std::make_shared<nn::Linear>(C, C));
    classifier_ = register_module("classifier", std::make_shared<nn::Linear>(C, c.num_labels));
  }
  if (init) init_weights();
}

bool EncoderClassifier::init_parameter_range(size_t index, int64_t begin, int64_t count,
                                             float* out) const {
  if (param_names_.empty())
    for (const auto& [name, p] : named_parameters()) param_names_.push_back(name);
  DS_CHECK(index < param_names_.size(), "[encoder] parameter index {} of {}", index,
           param_names_.size());
  const std::string& name = param_names_[index];
  init_encoder_values(name, config_.initializer_range, config_.seed, index, begin, count, out);
  // transformers' _init_weights zeroes the padding_idx row of an Embedding.
  if (name == "embeddings.word_embeddings.weight" ||
      (config_.roberta() && name == "embeddings.position_embeddings.weight")) {
    const int64_t C = config_.n_embd;
    zero_span(config_.pad_token_id * C, (config_.pad_token_id + 1) * C, begin, count, out);
  }
  return true;
}

void EncoderClassifier::init_weights() {
  autograd::NoGradGuard no_grad;
  const auto named = named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const Tensor& p = named[k].second;
    std::vector<float> v(static_cast<size_t>(p.numel()));
    init_parameter_range(k, 0, p.numel(), v.data());
    p.detach().copy_from(Tensor::from_data(v, p.shape()).to(p.device()).to(p.dtype()));
  }
}

Tensor EncoderClassifier::embed(const EncoderInputs& in) {
  const EncoderConfig& c = config_;
  check_ids(in.input_ids, "encoder", "input_ids", -1, -1);
  const Tensor& ids = in.input_ids;
  const int64_t B = ids.size(0), T = ids.size(1);
  DS_CHECK(B >= 1 && T >= 1, "[encoder] empty batch {}", shape_str(ids.shape()));
  const Device dev = ids.device();
  const std::vector<int64_t> id = ids.to_int_vector();

  // Position ids (B, T): 0..T-1, or RoBERTa's count of non-pad tokens offset past the pad id.
  std::vector<int64_t> pos(static_cast<size_t>(B * T));
  bool any_pad = false;
  for (int64_t b = 0; b < B; ++b) {
    int64_t seen = 0;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      const bool pad = id[i] == c.pad_token_id;
      any_pad |= pad;
      if (c.roberta())
        pos[i] = pad ? c.pad_token_id : c.pad_token_id + ++seen;
      else
        pos[i] = t;
    }
  }
  int64_t max_pos = 0;
  for (int64_t p : pos) max_pos = std::max(max_pos, p);
  DS_CHECK(max_pos < c.max_positions,
           "[encoder] sequence length {} needs position {} but the model has {} positions "
           "(max_position_embeddings); shorten the inputs",
           T, max_pos, c.max_positions);
  const Tensor positions = Tensor::from_ints(pos, {B, T}).to(dev);

  Tensor types;
  if (in.token_type_ids.defined()) {
    check_ids(in.token_type_ids, "encoder", "token_type_ids", B, T);
    for (int64_t v : in.token_type_ids.to_int_vector())
      DS_CHECK(v >= 0 && v < c.type_vocab_size,
               "[encoder] token_type_ids holds {}, outside [0, type_vocab_size {})", v,
               c.type_vocab_size);
    types = in.token_type_ids;
  } else {
    types = Tensor::zeros({B, T}, DType::i64).to(dev);
  }

  // (B, T, 1) 1 where the token is not the pad id (padding_idx rows get no gradient).
  Tensor keep;
  if (any_pad) {
    std::vector<float> k(id.size());
    for (size_t i = 0; i < id.size(); ++i) k[i] = id[i] == c.pad_token_id ? 0.0f : 1.0f;
    keep = Tensor::from_data(k, {B, T, 1}).to(dev).to(word_->weight().dtype());
  }
  Tensor x = lookup(*word_, ids, keep);    // (B, T, C)
  x = ops::add(x, (*token_type_)(types));  // transformers' order
  x = ops::add(x, lookup(*position_, positions, c.roberta() ? keep : Tensor()));
  return (*emb_norm_)(x);
}

Tensor EncoderClassifier::encode(const EncoderInputs& in) {
  Tensor x = embed(in);  // (B, T, C)
  const int64_t B = x.size(0), T = x.size(1);
  mask_->key_lengths.clear();
  if (in.attention_mask.defined()) {
    check_ids(in.attention_mask, "encoder", "attention_mask", B, T);
    const std::vector<int64_t> m = in.attention_mask.to_int_vector();
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = 0;
      while (len < T && m[static_cast<size_t>(b * T + len)] != 0) ++len;
      for (int64_t t = len; t < T; ++t)
        DS_CHECK(m[static_cast<size_t>(b * T + t)] == 0,
                 "[encoder] attention_mask row {} has a 1 at position {} after a 0 at {}: only "
                 "right padding is supported (pad at the end of each row)",
                 b, t, len);
      DS_CHECK(len >= 1,
               "[encoder] attention_mask row {} is all zeros: every row needs at least one token",
               b);
      mask_->key_lengths.push_back(len);
    }
  }
  x = ops::dropout(x, config_.hidden_dropout, is_training());
  for (auto& layer : layers_) x = (*layer)(x);
  return x;
}

Tensor EncoderClassifier::logits(const EncoderInputs& in) {
  Tensor x = encode(in);  // (B, T, C)
  const int64_t B = x.size(0), C = x.size(2);
  Tensor cls = ops::reshape(ops::slice(x, 1, 0, 1), {B, C});  // [CLS] / <s>, (B, C)
  const float p = config_.resolved_classifier_dropout();
  const bool tr = is_training();
  if (config_.roberta()) {
    Tensor h = ops::tanh((*pooler_)(ops::dropout(cls, p, tr)));
    return (*classifier_)(ops::dropout(h, p, tr));  // (B, NL)
  }
  Tensor pooled = ops::tanh((*pooler_)(cls));
  return (*classifier_)(ops::dropout(pooled, p, tr));  // (B, NL)
}

Tensor classification_loss(const EncoderConfig& c, const Tensor& lg, const Tensor& labels) {
  const int64_t NL = c.num_labels;
  DS_CHECK(labels.defined(), "[encoder] loss needs labels");
  const int64_t B = lg.size(0);
  if (c.problem_type == "multi_label_classification") {
    DS_CHECK(is_floating(labels.dtype()) && labels.numel() == B * NL,
             "[encoder] multi-label targets must be (B, num_labels) = ({}, {}) floats in [0, 1], "
             "got {} {}",
             B, NL, shape_str(labels.shape()), dtype_name(labels.dtype()));
    return ops::bce_with_logits(lg, ops::reshape(labels.to(lg.dtype()), {B, NL}));
  }
  if (!c.regression()) {
    DS_CHECK((labels.dtype() == DType::i32 || labels.dtype() == DType::i64) && labels.numel() == B,
             "[encoder] classification labels must be (B) = ({}) int class ids, got {} {}", B,
             shape_str(labels.shape()), dtype_name(labels.dtype()));
    for (int64_t v : labels.to_int_vector())
      DS_CHECK(v == -100 || (v >= 0 && v < NL),
               "[encoder] label {} outside [0, num_labels {}) (-100 ignores a row)", v, NL);
    return ops::cross_entropy(lg, ops::reshape(labels, {B}), -100);
  }
  DS_CHECK(is_floating(labels.dtype()) && labels.numel() == B * NL,
           "[encoder] regression labels must be {} floats ((B) or (B, num_labels)), got {} {}",
           B * NL, shape_str(labels.shape()), dtype_name(labels.dtype()));
  const Tensor y = ops::reshape(labels.to(lg.dtype()), {B, NL});
  return ops::mean(ops::square(ops::sub(lg, y)));  // MSELoss, mean over every element
}

Tensor SequenceClassifier::loss(const EncoderInputs& in, const Tensor& labels) {
  DS_CHECK(labels.defined(), "[encoder] loss needs labels");
  return classification_loss(config(), logits(in), labels);
}

Tensor SequenceClassifier::forward(const Tensor& ids) {
  return logits({ids, {}, {}});
}

Tensor SequenceClassifier::loss(const Tensor& ids, const Tensor& labels) {
  return loss(EncoderInputs{ids, {}, {}}, labels);
}

Tensor SequenceClassifier::loss(const nn::Batch& b) {
  DS_CHECK(!b.decoder_input_ids.defined(),
           "[encoder] a sequence classifier has no decoder: the batch's decoder_input_ids would be "
           "ignored");
  return loss(EncoderInputs{b.input_ids, b.attention_mask, b.token_type_ids}, b.labels);
}

}  // namespace ds::models
