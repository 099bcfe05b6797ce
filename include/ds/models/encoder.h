#pragma once
// BERT-style encoder sequence classifiers: transformers' BertForSequenceClassification and
// RobertaForSequenceClassification, configured by EncoderConfig and computing what they compute
// (eval mode exactly; in training, dropout at the same places, the attention probabilities too).
// SequenceClassifier is what every encoder classifier offers (this one and DeBERTa-v2's,
// ds/models/deberta.h); make_encoder_classifier (ds/models/family.h) builds the right one
// for a config.
//
//   embeddings   x = LayerNorm(word[ids] + position[pos] + token_type[types])         (B, T, C)
//                pos = 0..T-1 (bert); RoBERTa: pad_token_id + 1 + (index among non-pad tokens)
//                for real tokens and pad_token_id for pad tokens
//                (create_position_ids_from_input_ids)
//   L layers     post-LN: h = LN1(x + dense_o(attn(x)));  x = LN2(h + dense_2(act(dense_1(h))))
//                bidirectional attention over the keys attention_mask marks (right padding)
//   head  bert:  logits = classifier(tanh(pooler.dense(x[:, 0])))                     (B, NL)
//      roberta:  logits = classifier.out_proj(tanh(classifier.dense(x[:, 0])))        (B, NL)
//   loss         cross entropy over NL labels (single_label_classification), the mean squared
//                error (regression: num_labels 1 by default, or problem_type "regression"), or
//                binary cross entropy on each logit (multi_label_classification).
//
// Parameter names are transformers' without the base-model prefix ("bert." / "roberta."):
//   embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias},
//   encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias},
//   encoder.layer.{i}.attention.output.dense.{weight,bias},
//   encoder.layer.{i}.attention.output.LayerNorm.{weight,bias},
//   encoder.layer.{i}.intermediate.dense.{weight,bias},
//   encoder.layer.{i}.output.dense.{weight,bias}, encoder.layer.{i}.output.LayerNorm.{weight,bias},
//   bert:    pooler.dense.{weight,bias}, classifier.{weight,bias}
//   roberta: classifier.dense.{weight,bias}, classifier.out_proj.{weight,bias}
// Linear weights are (out, in) as torch.nn.Linear. Hugging Face import and export:
// ds/models/encoder_io.h; the families: ds/models/family.h.
//
// Like torch's nn.Embedding(padding_idx), the rows of word_embeddings (and, for RoBERTa,
// position_embeddings) at pad_token_id get no gradient: pad tokens read them, never train them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ds/nn/layers.h"
#include "ds/nn/module.h"
#include "ds/ops/ops.h"

namespace ds::models {

// DeBERTa-v2's own switches (EncoderConfig::family "deberta-v2"; ds/models/deberta.h describes
// the math). Names are DebertaV2Config's.
struct DebertaOptions {
  int64_t embedding_size = 0;           // E of the embeddings; 0: n_embd (else embed_proj E -> C)
  bool position_biased_input = true;    // absolute position embeddings added to the words
  bool relative_attention = false;      // disentangled attention over rel_embeddings
  int64_t max_relative_positions = -1;  // < 1: max_positions
  int64_t position_buckets = -1;        // > 0: log-bucketed relative positions, 2 * this rows
  bool share_att_key = false;     // relative keys/queries through key_proj/query_proj (else pos_*)
  bool c2p = false, p2c = false;  // pos_att_type: content->position, position->content
  bool norm_rel_ebd = false;      // norm_rel_ebd "layer_norm": encoder.LayerNorm on rel_embeddings
  int64_t conv_kernel_size = 0;   // > 0 (odd): the ConvLayer after layer 0
  std::string conv_act = "tanh";
  int64_t conv_groups = 1;
  std::string pooler_hidden_act = "gelu";
  float pooler_dropout = 0.0f;  // on token 0 before pooler.dense (training only)

  int64_t embedding_dim(int64_t n_embd) const {
    return embedding_size > 0 ? embedding_size : n_embd;
  }
  // Rows on each side of rel_embeddings (pos_ebd_size): position_buckets, else
  // max_relative_positions (max_positions when < 1).
  int64_t att_span(int64_t max_positions) const;
  // 1 + the number of relative attention kinds: scores are divided by sqrt(hd * this).
  int64_t scale_factor() const { return 1 + (c2p ? 1 : 0) + (p2c ? 1 : 0); }
};

struct EncoderConfig {
  // The encoder family (ds/models/family.h): "bert", "roberta" or "deberta-v2". It picks
  // the model class (deberta-v2: DebertaClassifier), the position ids (roberta: offset past
  // pad_token_id) and the classification head (bert: pooler + classifier; roberta:
  // classifier.dense + classifier.out_proj; deberta-v2: pooler.dense + classifier).
  std::string family = "bert";
  int64_t vocab_size = 30522;   // V
  int64_t max_positions = 512;  // rows of position_embeddings (RoBERTa: T + pad_token_id + 1 fit)
  int64_t type_vocab_size = 2;  // rows of token_type_embeddings (deberta-v2: 0 = none)
  int64_t n_layer = 12;         // L
  int64_t n_head = 12;          // NH
  int64_t n_embd = 768;         // C
  int64_t ffn_hidden = 3072;    // intermediate_size
  // "gelu" (exact, erf) or "gelu_new" / "gelu_pytorch_tanh" (tanh approximation).
  std::string hidden_act = "gelu";
  float norm_eps = 1e-12f;      // every LayerNorm
  float hidden_dropout = 0.1f;  // embeddings, attention output, FFN output (training only)
  // Dropout on the attention probabilities (training only). When > 0, training forms the
  // probabilities, (B, NH, T, T) per layer, instead of running the fused attention kernel.
  float attention_dropout = 0.1f;
  float classifier_dropout = -1.0f;  // before the classifier; < 0: hidden_dropout (cls_dropout)
  int64_t pad_token_id = 0;          // padding_idx of the embeddings (RoBERTa: 1)
  int64_t num_labels = 2;            // NL
  // "regression" (MSE), "single_label_classification" (cross entropy) or
  // "multi_label_classification" (BCE with logits); "" = transformers' rule: regression when
  // num_labels == 1, else single-label classification (transformers would pick multi-label for
  // float labels; here the config says it).
  std::string problem_type;
  float initializer_range = 0.02f;  // std of the normal initialisation
  uint64_t seed = 0;                // parameter initialisation
  DebertaOptions deberta;           // family "deberta-v2" only

  bool roberta() const { return family == "roberta"; }
  bool is_deberta() const { return family == "deberta-v2"; }
  bool regression() const;  // the resolved problem type
  float resolved_classifier_dropout() const {
    return classifier_dropout >= 0.0f ? classifier_dropout : hidden_dropout;
  }
  int64_t head_dim() const { return n_embd / n_head; }
  // Throws "[model] ..." naming the first bad field.
  void validate() const;
  // Parameter count from the shapes alone.
  int64_t num_parameters() const;
  // Our own JSON form (the fields above by name; deberta-v2's options under "deberta"); unknown
  // keys are errors.
  nlohmann::json to_json() const;
  static EncoderConfig from_json(const nlohmann::json& j);
};

// One batch. Every tensor is (B, T) int32/int64. attention_mask: 1 for tokens, 0 for padding,
// which must be right padding (each row 1...1 0...0 with at least one 1; DebertaClassifier: any
// 0/1 mask whose first column is 1); undefined = no padding. token_type_ids: segment ids in
// [0, type_vocab_size); undefined = all 0 (transformers' default).
struct EncoderInputs {
  Tensor input_ids;
  Tensor attention_mask;
  Tensor token_type_ids;
};

// The loss of logits (B, NL) against labels for c's problem type (see SequenceClassifier::loss).
Tensor classification_loss(const EncoderConfig& c, const Tensor& logits, const Tensor& labels);

// What every encoder sequence classifier offers: a trainer or server holds this and never needs
// the model class. Not thread-safe: one forward/backward at a time per instance.
class SequenceClassifier : public nn::Module {
 public:
  using nn::Module::Module;
  virtual const EncoderConfig& config() const = 0;
  // -> logits (B, NL). Eval mode (train(false)) turns dropout off, as model.eval().
  virtual Tensor logits(const EncoderInputs& in) = 0;
  // The last hidden states (B, T, C), before the head.
  virtual Tensor encode(const EncoderInputs& in) = 0;
  // Re-draws every parameter from config().seed (transformers' _init_weights).
  virtual void init_weights() = 0;
  // logits and the loss against labels: (B) int class ids (ignore_index -100) for single-label
  // classification; (B) or (B, NL) floats for regression; (B, NL) floats in [0, 1] for
  // multi-label. Returns the scalar loss (classification_loss).
  Tensor loss(const EncoderInputs& in, const Tensor& labels);
  // nn::Module's one-tensor forms: ids (B, T) without padding or token types (transformers with
  // attention_mask and token_type_ids left out) -> logits (B, NL); loss(ids, labels) likewise.
  Tensor forward(const Tensor& ids) override;
  Tensor loss(const Tensor& ids, const Tensor& labels) override;
  // The engine's form (ds/nn/batch.h): input_ids, attention_mask, token_type_ids, labels (B).
  Tensor loss(const nn::Batch& batch) override;
};

class EncoderClassifier : public SequenceClassifier {
 public:
  // Validates, builds and (unless init is false) initialises: Linear and Embedding weights
  // N(0, initializer_range) from config.seed, biases 0, LayerNorms 1 and 0, the pad rows of the
  // embeddings 0 (transformers' _init_weights). init = false leaves everything zero
  // (LayerNorm weights one), for weights loaded next.
  explicit EncoderClassifier(EncoderConfig config, bool init = true);
  const EncoderConfig& config() const override { return config_; }

  // -> logits (B, NL). Eval mode (train(false)) turns dropout off, as model.eval().
  Tensor logits(const EncoderInputs& in) override;
  // The loss: SequenceClassifier::loss (classification_loss of the logits).
  using SequenceClassifier::loss;
  // The last hidden states (B, T, C), before the head (BertModel's last_hidden_state).
  Tensor encode(const EncoderInputs& in) override;

  // Re-draws every parameter from config().seed (see the constructor).
  void init_weights() override;
  // Elements [begin, begin + count) of parameter `index`'s initial values (nn::Module's hook for
  // ZeRO-3 shards built under nn::PartitionedInit): a pure function of (seed, index, element), as
  // GPT::init_values.
  bool init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const override;

 private:
  class Layer;
  EncoderConfig config_;
  std::shared_ptr<nn::Embedding> word_, position_, token_type_;
  std::shared_ptr<nn::LayerNorm> emb_norm_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::shared_ptr<nn::Linear> pooler_;      // bert: pooler.dense; roberta: classifier.dense
  std::shared_ptr<nn::Linear> classifier_;  // bert: classifier; roberta: classifier.out_proj
  // The batch's attention mask, read by every layer's forward (Module::operator() takes one
  // tensor): set by encode() before the layers run. A layer with gradient checkpointing on
  // recomputes with the mask of the latest encode(): run backward before the next forward.
  std::shared_ptr<ops::AttentionMask> mask_;
  mutable std::vector<std::string> param_names_;  // named_parameters() order, for init

  Tensor embed(const EncoderInputs& in);  // (B, T, C), before dropout
};

}  // namespace ds::models
