#pragma once
// DeBERTa-v2 sequence classifier: transformers' DebertaV2ForSequenceClassification (the Accelerate
// guide's microsoft/deberta-v2-xlarge-mnli), configured by EncoderConfig with family "deberta-v2"
// and EncoderConfig::deberta (DebertaOptions), computing what transformers 5 computes (eval mode
// exactly; in training, dropout at the same places).
//
//   embeddings  e = word[ids] (+ position[0..T-1] if position_biased_input)
//                   (+ token_type[types] if type_vocab_size > 0)                     (B, T, E)
//               x0 = LayerNorm(embed_proj(e) if E != C else e) * mask                (B, T, C)
//   relative    R = LayerNorm(rel_embeddings) (norm_rel_ebd "layer_norm"; else as is) (2S, C)
//               S = position_buckets, or max_relative_positions (max_positions when < 1);
//               rel(q, k) = make_log_bucket_position(q - k) (plain q - k without buckets)
//   L layers    post-LN as BERT, the scores of head h disentangled:
//                 s(q, k) = [Q_q . K_k + c2p + p2c] / sqrt(hd * (1 + #pos_att_type))
//                 c2p = Q_q . Kr[clamp(rel(q, k) + S, 0, 2S-1)]    Kr = key_proj(R) (share_att_key)
//                 p2c = K_k . Qr[clamp(-rel(k, q) + S, 0, 2S-1)]   Qr = query_proj(R)    or pos_*
//               masked keys get probability exactly 0 (transformers' masked_fill before softmax)
//   conv        after layer 0 (conv_kernel_size > 0): x = LayerNorm(x + act(conv1d(x0) * mask))
//               * mask, a grouped Conv1d over T with zero padding (K - 1) / 2
//   head        logits = classifier(dropout(act(pooler.dense(dropout(x[:, 0])))))     (B, NL)
//   loss        classification_loss (ds/models/encoder.h), as BERT's
//
// The relative terms are formed without a gather op: the rows of R a sequence of length T uses,
// one per distance q - k in [-(T-1), T-1], are looked up (ops::embedding), projected and
// multiplied with Q (or K) into (B, NH, T, 2T-1), and a skew (slice + reshape) moves entry
// (q, T-1-(q-k)) to (q, k). Scores are (B, NH, T, T) per layer; the fused attention kernel is not
// used.
//
// Parameter names are transformers' without the base-model prefix "deberta.":
//   embeddings.{word,position,token_type}_embeddings.weight, embeddings.embed_proj.weight,
//   embeddings.LayerNorm.{weight,bias},
//   encoder.layer.{i}.attention.self.{query,key,value}_proj.{weight,bias},
//   encoder.layer.{i}.attention.self.{pos_key,pos_query}_proj.{weight,bias} (not share_att_key),
//   encoder.layer.{i}.attention.output.{dense,LayerNorm}.*, encoder.layer.{i}.intermediate.dense.*,
//   encoder.layer.{i}.output.{dense,LayerNorm}.*, encoder.rel_embeddings.weight,
//   encoder.LayerNorm.*, encoder.conv.conv.{weight,bias} ((C, C / groups, K) as nn.Conv1d),
//   encoder.conv.LayerNorm.*, pooler.dense.*, classifier.* (the last two unprefixed in a file).
//
// Inputs (EncoderInputs): attention_mask may be any 0/1 mask whose first column is 1 (token 0 is
// pooled); token_type_ids are ignored when type_vocab_size is 0 (as transformers). The pad id's
// word_embeddings row gets no gradient (padding_idx).
//
// Gradient checkpointing of one layer is refused ("[deberta] ..."): a layer reads the batch's
// relative embeddings and mask from the model (set by encode()), outside its one input.
// Checkpointing the whole model (its own set_gradient_checkpointing) works.
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ds/models/encoder.h"
#include "ds/nn/layers.h"

namespace ds::models {

// Throws "[model] ..." naming the first bad DeBERTa field (EncoderConfig::validate calls it).
void validate_deberta(const EncoderConfig& c);
int64_t deberta_num_parameters(const EncoderConfig& c);
nlohmann::json deberta_options_to_json(const DebertaOptions& d);
DebertaOptions deberta_options_from_json(const nlohmann::json& j);  // unknown keys are errors

// transformers' make_log_bucket_position for one distance (computed in float32 as torch does);
// bucket_size or max_position <= 0: rel itself.
int64_t deberta_log_bucket(int64_t rel, int64_t bucket_size, int64_t max_position);

class DebertaClassifier : public SequenceClassifier {
 public:
  // Validates, builds and (unless init is false) initialises as transformers' _init_weights:
  // Linear, Conv1d and Embedding weights N(0, initializer_range) from config.seed, biases 0,
  // LayerNorms 1 and 0, the pad row of word_embeddings 0. init = false leaves everything zero
  // (LayerNorm weights one), for weights loaded next.
  explicit DebertaClassifier(EncoderConfig config, bool init = true);
  const EncoderConfig& config() const override { return config_; }

  Tensor logits(const EncoderInputs& in) override;  // (B, NL)
  Tensor encode(const EncoderInputs& in) override;  // (B, T, C), the encoder's last layer
  using SequenceClassifier::loss;
  void init_weights() override;
  bool init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const override;

 private:
  // What the layers of one forward read besides their input: set by encode() before the layers
  // run, released after (the autograd graph keeps what backward needs).
  struct Batch {
    Tensor key_bias;          // (B, 1, 1, T): 0, or -1e30 for masked keys; undefined: none
    Tensor rel;               // (2S, C) the (normalised) relative embeddings
    Tensor c2p_ids, p2c_ids;  // (2T-1) int64 rows of rel for distances T-1 .. -(T-1)
  };
  class Layer;
  class Conv;
  EncoderConfig config_;
  std::shared_ptr<nn::Embedding> word_, position_, token_type_, rel_;
  std::shared_ptr<nn::Linear> embed_proj_;
  std::shared_ptr<nn::LayerNorm> emb_norm_, rel_norm_, conv_norm_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::shared_ptr<Conv> conv_;
  std::shared_ptr<nn::Linear> pooler_, classifier_;
  std::shared_ptr<Batch> batch_;
  mutable std::vector<std::string> param_names_;  // named_parameters() order, for init

  Tensor embed(const EncoderInputs& in, const Tensor& mask);  // (B, T, C), before dropout
};

}  // namespace ds::models
