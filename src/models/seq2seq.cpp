// BART / BlenderBot encoder-decoders (ds/models/seq2seq.h): the config, the module tree under
// transformers' names, the forward pass and greedy generation.
#include "ds/models/seq2seq.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/family.h"
#include "ds/models/gpt.h"  // ParamInit / GPT::init_values: the same counter-based draws
#include "seq2seq_processors.h"
#include "seq2seq_util.h"

namespace ds::models {

using nlohmann::json;

// ---- config ----

void Seq2SeqConfig::set_family_architecture() {
  family_of(*this).seq2seq.set_architecture(*this);
}

void Seq2SeqConfig::validate() const {
  family_of(*this);  // throws for an unknown family, naming the known ones
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                                {"max_positions", max_positions},
                                {"d_model", d_model},
                                {"encoder_layers", encoder_layers},
                                {"decoder_layers", decoder_layers},
                                {"encoder_heads", encoder_heads},
                                {"decoder_heads", decoder_heads},
                                {"encoder_ffn", encoder_ffn},
                                {"decoder_ffn", decoder_ffn}})
    DS_CHECK(v > 0, "[model] seq2seq {} must be positive, got {}", name, v);
  if (is_t5()) {
    // T5Config has one num_heads, d_ff and dropout_rate: what config.json cannot say is refused.
    DS_CHECK(d_kv > 0, "[model] seq2seq t5 needs d_kv (the head size) > 0, got {}", d_kv);
    DS_CHECK(encoder_heads == decoder_heads && encoder_ffn == decoder_ffn,
             "[model] seq2seq t5 has one num_heads and one d_ff: encoder_heads {} / decoder_heads "
             "{}, encoder_ffn {} / decoder_ffn {} must be equal",
             encoder_heads, decoder_heads, encoder_ffn, decoder_ffn);
    DS_CHECK(attention_dropout == dropout && activation_dropout == dropout,
             "[model] seq2seq t5 has one dropout_rate: attention_dropout {} and activation_dropout "
             "{} must equal dropout {}",
             attention_dropout, activation_dropout, dropout);
    DS_CHECK(relative_buckets >= 4 && relative_max_distance > relative_buckets / 2,
             "[model] seq2seq t5 relative_buckets {} must be at least 4 and relative_max_distance "
             "{} above relative_buckets / 2",
             relative_buckets, relative_max_distance);
    DS_CHECK(!scale_embedding, "[model] seq2seq t5 does not scale embeddings (scale_embedding)");
    DS_CHECK(
        !(gated_ffn && activation == "gelu"),
        "[model] seq2seq t5: a gated FFN with exact gelu has no feed_forward_proj (\"gated-gelu\" "
        "means gelu_new); use activation gelu_new");
  } else {
    DS_CHECK(d_model % encoder_heads == 0 && d_model % decoder_heads == 0,
             "[model] seq2seq d_model {} must be divisible by encoder_heads {} and decoder_heads "
             "{}",
             d_model, encoder_heads, decoder_heads);
    const Seq2SeqConfig d;
    DS_CHECK(d_kv == 0 && relative_buckets == d.relative_buckets &&
                 relative_max_distance == d.relative_max_distance && !gated_ffn &&
                 tie_word_embeddings && scale_decoder_outputs,
             "[model] seq2seq {}: d_kv, relative_buckets, relative_max_distance, gated_ffn, "
             "tie_word_embeddings and scale_decoder_outputs are T5's; leave them at their "
             "defaults (0, 32, 128, false, true, true)",
             family);
  }
  DS_CHECK(activation == "gelu" || activation == "gelu_new" || activation == "gelu_pytorch_tanh" ||
               activation == "relu" || activation == "silu" || activation == "swish",
           "[model] seq2seq activation \"{}\" is not supported (gelu, gelu_new, "
           "gelu_pytorch_tanh, relu, silu)",
           activation);
  for (const auto& [name, p] : {std::pair<const char*, float>{"dropout", dropout},
                                {"attention_dropout", attention_dropout},
                                {"activation_dropout", activation_dropout}})
    DS_CHECK(p >= 0.0f && p < 1.0f, "[model] seq2seq {} must be in [0, 1), got {}", name, p);
  Seq2SeqConfig arch = *this;
  arch.set_family_architecture();
  DS_CHECK(pre_norm == arch.pre_norm && embedding_norm == arch.embedding_norm &&
               final_norm == arch.final_norm && position_offset == arch.position_offset,
           "[model] seq2seq family {} means pre_norm {}, embedding_norm {}, final_norm {}, "
           "position_offset {}; the config says {}, {}, {}, {}",
           family, arch.pre_norm, arch.embedding_norm, arch.final_norm, arch.position_offset,
           pre_norm, embedding_norm, final_norm, position_offset);
  DS_CHECK(norm_eps > 0.0f, "[model] seq2seq norm_eps must be positive");
  for (const auto& [name, id] : {std::pair<const char*, int64_t>{"pad_token_id", pad_token_id},
                                 {"eos_token_id", eos_token_id},
                                 {"decoder_start_token_id", decoder_start_token_id}})
    DS_CHECK(id >= 0 && id < vocab_size, "[model] seq2seq {} {} outside the vocabulary [0, {})",
             name, id, vocab_size);
  DS_CHECK(forced_eos_token_id >= -1 && forced_eos_token_id < vocab_size,
           "[model] seq2seq forced_eos_token_id {} outside the vocabulary (-1: none)",
           forced_eos_token_id);
  DS_CHECK(init_std > 0.0f, "[model] seq2seq init_std must be positive");
}

int64_t Seq2SeqConfig::num_parameters() const {
  if (is_t5()) {
    const int64_t C = d_model, V = vocab_size, I = encoder_heads * d_kv, F = encoder_ffn;
    const int64_t attn = 4 * C * I, ffn = (gated_ffn ? 3 : 2) * C * F;
    const int64_t table = relative_buckets * encoder_heads;
    const int64_t enc = encoder_layers * (attn + ffn + 2 * C) + table + C;
    const int64_t dec = decoder_layers * (2 * attn + ffn + 3 * C) + table + C;
    return V * C * (tie_word_embeddings ? 1 : 2) + enc + dec;
  }
  const int64_t C = d_model, V = vocab_size, P = max_positions + position_offset;
  const int64_t attn = 4 * (C * C + C), ln = 2 * C;
  const int64_t enc =
      encoder_layers * (attn + 2 * ln + C * encoder_ffn + encoder_ffn + encoder_ffn * C + C);
  const int64_t dec =
      decoder_layers * (2 * attn + 3 * ln + C * decoder_ffn + decoder_ffn + decoder_ffn * C + C);
  const int64_t norms = 2 * ln * ((embedding_norm ? 1 : 0) + (final_norm ? 1 : 0));
  return V * C + 2 * P * C + enc + dec + norms;
}

json Seq2SeqConfig::to_json() const {
  return {{"family", family},
          {"vocab_size", vocab_size},
          {"max_positions", max_positions},
          {"d_model", d_model},
          {"encoder_layers", encoder_layers},
          {"decoder_layers", decoder_layers},
          {"encoder_heads", encoder_heads},
          {"decoder_heads", decoder_heads},
          {"encoder_ffn", encoder_ffn},
          {"decoder_ffn", decoder_ffn},
          {"activation", activation},
          {"dropout", dropout},
          {"attention_dropout", attention_dropout},
          {"activation_dropout", activation_dropout},
          {"scale_embedding", scale_embedding},
          {"pre_norm", pre_norm},
          {"embedding_norm", embedding_norm},
          {"final_norm", final_norm},
          {"position_offset", position_offset},
          {"norm_eps", norm_eps},
          {"pad_token_id", pad_token_id},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id},
          {"decoder_start_token_id", decoder_start_token_id},
          {"forced_eos_token_id", forced_eos_token_id},
          {"init_std", init_std},
          {"seed", seed},
          {"d_kv", d_kv},
          {"relative_buckets", relative_buckets},
          {"relative_max_distance", relative_max_distance},
          {"gated_ffn", gated_ffn},
          {"tie_word_embeddings", tie_word_embeddings},
          {"scale_decoder_outputs", scale_decoder_outputs}};
}

Seq2SeqConfig Seq2SeqConfig::from_json(const json& j) {
  DS_CHECK(j.is_object(), "[model] a seq2seq config must be a JSON object");
  Seq2SeqConfig c;
  if (j.contains("family") && j["family"].is_string()) {
    c.family = j["family"].get<std::string>();
    c.set_family_architecture();
  }
  const json known = c.to_json();
  for (const auto& [k, v] : j.items())
    DS_CHECK(known.contains(k), "[model] unknown seq2seq config field \"{}\"", k);
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j[key].get<std::decay_t<decltype(field)>>();
    } catch (const json::exception&) {
      DS_THROW("[model] seq2seq config field \"{}\" has a bad value: {}", key, j[key].dump());
    }
  };
  get("vocab_size", c.vocab_size);
  get("max_positions", c.max_positions);
  get("d_model", c.d_model);
  get("encoder_layers", c.encoder_layers);
  get("decoder_layers", c.decoder_layers);
  get("encoder_heads", c.encoder_heads);
  get("decoder_heads", c.decoder_heads);
  get("encoder_ffn", c.encoder_ffn);
  get("decoder_ffn", c.decoder_ffn);
  get("activation", c.activation);
  get("dropout", c.dropout);
  get("attention_dropout", c.attention_dropout);
  get("activation_dropout", c.activation_dropout);
  get("scale_embedding", c.scale_embedding);
  get("pre_norm", c.pre_norm);
  get("embedding_norm", c.embedding_norm);
  get("final_norm", c.final_norm);
  get("position_offset", c.position_offset);
  get("norm_eps", c.norm_eps);
  get("pad_token_id", c.pad_token_id);
  get("bos_token_id", c.bos_token_id);
  get("eos_token_id", c.eos_token_id);
  get("decoder_start_token_id", c.decoder_start_token_id);
  get("forced_eos_token_id", c.forced_eos_token_id);
  get("init_std", c.init_std);
  get("seed", c.seed);
  get("d_kv", c.d_kv);
  get("relative_buckets", c.relative_buckets);
  get("relative_max_distance", c.relative_max_distance);
  get("gated_ffn", c.gated_ffn);
  get("tie_word_embeddings", c.tie_word_embeddings);
  get("scale_decoder_outputs", c.scale_decoder_outputs);
  c.validate();
  return c;
}

// ---- helpers ----

using detail::activate;

namespace {

class Container : public nn::Module {
 public:
  explicit Container(std::string type) : Module(std::move(type)) {}
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

void check_ids(const Tensor& t, const char* what) {
  DS_CHECK(t.defined() && t.dim() == 2 && (t.dtype() == DType::i32 || t.dtype() == DType::i64) &&
               t.size(0) >= 1 && t.size(1) >= 1,
           "[seq2seq] {} must be a non-empty (B, T) int32/int64 tensor, got {} {}", what,
           t.defined() ? shape_str(t.shape()) : "undefined",
           t.defined() ? dtype_name(t.dtype()) : "");
}

// The attention_mask's row lengths (right padding) or {} for none.
std::vector<int64_t> key_lengths(const Tensor& mask, int64_t B, int64_t S) {
  if (!mask.defined()) return {};
  check_ids(mask, "attention_mask");
  DS_CHECK(mask.size(0) == B && mask.size(1) == S,
           "[seq2seq] attention_mask is {}, input_ids ({}, {}): they must have the same shape",
           shape_str(mask.shape()), B, S);
  const std::vector<int64_t> m = mask.to_int_vector();
  std::vector<int64_t> lens;
  for (int64_t b = 0; b < B; ++b) {
    int64_t len = 0;
    while (len < S && m[static_cast<size_t>(b * S + len)] != 0) ++len;
    for (int64_t t = len; t < S; ++t)
      DS_CHECK(m[static_cast<size_t>(b * S + t)] == 0,
               "[seq2seq] attention_mask row {} has a 1 at position {} after a 0 at {}: only "
               "right padding is supported (pad at the end of each row)",
               b, t, len);
    DS_CHECK(len >= 1, "[seq2seq] attention_mask row {} is all zeros", b);
    lens.push_back(len);
  }
  return lens;
}

// softmax(q k^T * scale + mask) with dropout on the probabilities, @ v: transformers' eager
// attention, for attention_dropout in training (the fused kernel has no dropout).
Tensor formed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const ops::AttentionMask& mask, float p) {
  const int64_t B = q.size(0), Tq = q.size(2), Tk = k.size(2), hd = q.size(3);
  Tensor s = ops::mul(ops::matmul(q, ops::transpose(k, 2, 3)),
                      1.0f / std::sqrt(static_cast<float>(hd)));  // (B, NH, Tq, Tk)
  const Tensor mb = detail::additive_mask(mask, B, Tq, Tk, s);
  if (mb.defined()) s = ops::add(s, mb);
  Tensor pr = ops::dropout(ops::softmax(s), p, true);
  return ops::matmul(pr, v);
}

// weight[ids] whose gradient skips the rows of ids equal to pad (torch's Embedding(padding_idx)):
// keep * e + (1 - keep) * e.detach() is e, and only the first term carries a gradient.
Tensor lookup(nn::Embedding& emb, const Tensor& ids, int64_t pad) {
  Tensor e = emb(ids);  // (B, T, C)
  if (!e.requires_grad()) return e;
  const std::vector<int64_t> id = ids.to_int_vector();
  if (std::find(id.begin(), id.end(), pad) == id.end()) return e;
  std::vector<float> k(id.size());
  for (size_t i = 0; i < id.size(); ++i) k[i] = id[i] == pad ? 0.0f : 1.0f;
  const Tensor keep =
      Tensor::from_data(k, {ids.size(0), ids.size(1), 1}).to(e.device()).to(e.dtype());
  return ops::add(ops::mul(e, keep), ops::mul(e.detach(), ops::add(ops::neg(keep), 1.0f)));
}

// What the layers of one forward read besides their input (Module::operator() takes one tensor).
struct Context {
  ops::AttentionMask self_mask;   // encoder: padding; decoder: causal
  ops::AttentionMask cross_mask;  // decoder: the source padding
  Tensor memory;                  // decoder: the encoder output (B, S, C)
};

}  // namespace

// q/k/v/out projections (BartAttention); called by its layer, never through operator() itself.
class Seq2Seq::Attention : public nn::Module {
 public:
  Attention(int64_t C, int64_t n_head) : Module("Attention"), n_head_(n_head) {
    k_proj_ = register_module("k_proj", std::make_shared<nn::Linear>(C, C));
    v_proj_ = register_module("v_proj", std::make_shared<nn::Linear>(C, C));
    q_proj_ = register_module("q_proj", std::make_shared<nn::Linear>(C, C));
    out_proj_ = register_module("out_proj", std::make_shared<nn::Linear>(C, C));
  }
  // x (B, Tq, C) attends to kv (B, Tk, C) -> (B, Tq, C).
  Tensor attend(const Tensor& x, const Tensor& kv, const ops::AttentionMask& mask, float attn_p,
                bool training) {
    return attend_heads(x, heads(*k_proj_, kv), heads(*v_proj_, kv), mask, attn_p, training);
  }
  // The keys and values of kv (B, Tk, C) as (B, NH, Tk, hd) each.
  std::pair<Tensor, Tensor> keys_values(const Tensor& kv, bool row_kernel = false) {
    return {heads(*k_proj_, kv, row_kernel), heads(*v_proj_, kv, row_kernel)};
  }
  // x (B, Tq, C) attends to given keys and values (B, NH, Tk, hd) -> (B, Tq, C).
  Tensor attend_heads(const Tensor& x, const Tensor& k, const Tensor& v,
                      const ops::AttentionMask& mask, float attn_p, bool training) {
    const Tensor q = heads(*q_proj_, x);
    Tensor a = training && attn_p > 0.0f ? formed_attention(q, k, v, mask, attn_p)
                                         : ops::attention(q, k, v, mask);  // (B, NH, Tq, hd)
    return output(a, false);
  }
  // A cached decoder step (Seq2Seq::decode_step): h (N, 1, C), the groups' rows in order.
  // Self-attention writes each group's new keys and values into its layer-`li` cache and attends
  // to the positions so far; cross-attention attends to the group's source (its memory projected
  // into the cache on the first step). -> (N, 1, C)
  template <class Group>
  Tensor attend_step(const Tensor& h, std::span<const Group> groups, size_t li, bool self,
                     bool row_kernel) {
    const Tensor q = heads(*q_proj_, h, row_kernel);  // (N, NH, 1, hd)
    Tensor k, v;
    if (self) std::tie(k, v) = keys_values(h, row_kernel);
    const Tensor a = detail::attend_groups(
        q, k, v, groups, li, [&](const Tensor& memory) { return keys_values(memory, row_kernel); },
        [](size_t, const Tensor& qg, const Tensor& keys, const Tensor& values,
           const ops::AttentionMask& mask) { return ops::attention(qg, keys, values, mask); });
    return output(a, row_kernel);
  }

 private:
  // (B, T, C) -> (B, NH, T, hd)
  Tensor heads(nn::Linear& proj, const Tensor& in, bool row_kernel = false) {
    const int64_t B = in.size(0), T = in.size(1), C = in.size(2), NH = n_head_;
    return ops::contiguous(ops::transpose(
        ops::reshape(detail::project(proj, in, row_kernel), {B, T, NH, C / NH}), 1, 2));
  }
  // The heads' outputs (B, NH, T, hd) -> out_proj -> (B, T, C).
  Tensor output(const Tensor& a, bool row_kernel) {
    const int64_t B = a.size(0), T = a.size(2), C = a.size(1) * a.size(3);
    return detail::project(
        *out_proj_, ops::reshape(ops::contiguous(ops::transpose(a, 1, 2)), {B, T, C}), row_kernel);
  }

  int64_t n_head_;
  std::shared_ptr<nn::Linear> q_proj_, k_proj_, v_proj_, out_proj_;
};

// One encoder or decoder layer (BartEncoderLayer / BartDecoderLayer, pre- or post-LN).
class Seq2Seq::Layer : public nn::Module {
 public:
  Layer(const Seq2SeqConfig& c, bool decoder, std::shared_ptr<Context> ctx)
      : Module(decoder ? "DecoderLayer" : "EncoderLayer"), c_(c), ctx_(std::move(ctx)) {
    const int64_t C = c.d_model, F = decoder ? c.decoder_ffn : c.encoder_ffn;
    const int64_t NH = decoder ? c.decoder_heads : c.encoder_heads;
    self_attn_ = register_module("self_attn", std::make_shared<Attention>(C, NH));
    self_norm_ =
        register_module("self_attn_layer_norm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    if (decoder) {
      cross_attn_ = register_module("encoder_attn", std::make_shared<Attention>(C, NH));
      cross_norm_ = register_module("encoder_attn_layer_norm",
                                    std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    }
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(C, F));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(F, C));
    final_norm_ =
        register_module("final_layer_norm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  }

  Tensor forward(const Tensor& x) override {  // (B, T, C) -> (B, T, C)
    if (packed_len_ > 0)                      // [x, memory] (B, T + S, C): see set_packed
      return run(ops::slice(x, 1, 0, packed_len_), ops::slice(x, 1, packed_len_, x.size(1)));
    return run(x, ctx_->memory);
  }

  // A checkpointed decoder layer takes [x, memory] concatenated along time, (B, T + S, C), so that
  // its recomputation in backward sees the encoder output and the output's gradient reaches it:
  // the first T positions are x. Kept until the next forward sets it (the recomputation reads it);
  // 0 = not packed.
  void set_packed(int64_t T) { packed_len_ = T; }

  // Generation (Seq2Seq::decode_step): x (N, 1, C), the next position of each group's rows; the
  // groups' caches of this layer (`li`) hold the earlier positions' keys and values (written to
  // here) and the encoder output's (projected on the first step).
  Tensor step(const Tensor& x, std::span<const StepGroup> groups, size_t li, bool row_kernel) {
    return run(x, Tensor(), groups, li, row_kernel);
  }

 private:
  // groups empty: the whole sequence x attends to itself (causal in the decoder) and to memory;
  // else a cached step.
  Tensor run(const Tensor& x_in, const Tensor& memory, std::span<const StepGroup> groups = {},
             size_t li = 0, bool row_kernel = false) {
    const bool tr = is_training();
    const float p = c_.dropout;
    // A residual sublayer: pre-LN x + f(LN(x)), post-LN LN(x + f(x)).
    auto residual = [&](const Tensor& x, nn::LayerNorm& norm, auto&& f) {
      if (c_.pre_norm) return ops::add(x, ops::dropout(f(norm(x)), p, tr));
      return norm(ops::add(x, ops::dropout(f(x), p, tr)));
    };
    const bool cached = !groups.empty();
    Tensor x = residual(x_in, *self_norm_, [&](const Tensor& h) {
      if (cached) return self_attn_->attend_step(h, groups, li, /*self=*/true, row_kernel);
      return self_attn_->attend(h, h, ctx_->self_mask, c_.attention_dropout, tr);
    });
    if (cross_attn_)
      x = residual(x, *cross_norm_, [&](const Tensor& h) {
        if (cached) return cross_attn_->attend_step(h, groups, li, /*self=*/false, row_kernel);
        return cross_attn_->attend(h, memory, ctx_->cross_mask, c_.attention_dropout, tr);
      });
    return residual(x, *final_norm_, [&](const Tensor& h) {
      Tensor f = ops::dropout(activate(detail::project(*fc1_, h, row_kernel), c_.activation),
                              c_.activation_dropout, tr);
      return detail::project(*fc2_, f, row_kernel);
    });
  }

  const Seq2SeqConfig c_;  // a copy: a layer may outlive the model that built it
  std::shared_ptr<Context> ctx_;
  int64_t packed_len_ = 0;
  std::shared_ptr<Attention> self_attn_, cross_attn_;
  std::shared_ptr<nn::LayerNorm> self_norm_, cross_norm_, final_norm_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// BartEncoder / BartDecoder: positions, the embedding norm (BART), the layers, the final norm
// (BlenderBot). Token embeddings come from the shared table (Seq2Seq).
class Seq2Seq::Stack : public nn::Module {
 public:
  Stack(const Seq2SeqConfig& c, bool decoder)
      : Module(decoder ? "Decoder" : "Encoder"), c_(c), ctx_(std::make_shared<Context>()) {
    const int64_t C = c.d_model;
    positions_ = register_module(
        "embed_positions", std::make_shared<nn::Embedding>(c.max_positions + c.position_offset, C));
    auto list = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0, n = decoder ? c.decoder_layers : c.encoder_layers; i < n; ++i)
      layers_.push_back(list->append(std::make_shared<Layer>(c, decoder, ctx_)));
    if (c.embedding_norm)
      emb_norm_ =
          register_module("layernorm_embedding", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    if (c.final_norm)
      final_norm_ = register_module("layer_norm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    ctx_->self_mask.causal = decoder;
    ctx_->cross_mask.causal = false;
  }

  void checkpoint_layers(bool on) {
    for (auto& layer : layers_) layer->set_gradient_checkpointing(on);
  }

  // tokens (B, T, C): the scaled token embeddings -> the stack's output (B, T, C).
  Tensor run(const Tensor& tokens, std::vector<int64_t> self_lengths, Tensor memory,
             std::vector<int64_t> cross_lengths) {
    Tensor x = embed(tokens, 0);
    ctx_->self_mask.key_lengths = std::move(self_lengths);
    ctx_->cross_mask.key_lengths = std::move(cross_lengths);
    ctx_->memory = std::move(memory);
    for (auto& layer : layers_) {
      const bool pack =
          ctx_->memory.defined() && layer->gradient_checkpointing() && autograd::is_grad_enabled();
      layer->set_packed(pack ? x.size(1) : 0);
      x = (*layer)(pack ? ops::concat({x, ctx_->memory}, 1) : x);  // (B, T, C)
    }
    ctx_->memory = Tensor();  // not held past the forward (backward keeps what it needs)
    if (final_norm_) x = (*final_norm_)(x);
    return x;
  }

  // Generation (decoder): tokens (N, 1, C), each group's rows at its position -> (N, 1, C), with
  // the groups' caches (one per layer, created on the first step).
  Tensor step(const Tensor& tokens, std::span<const StepGroup> groups, bool row_kernel) {
    std::vector<int64_t> pos;
    for (const StepGroup& g : groups) {
      DS_CHECK(g.pos + 1 <= c_.max_positions,
               "[seq2seq] target length {} exceeds max_position_embeddings {}", g.pos + 1,
               c_.max_positions);
      pos.insert(pos.end(), static_cast<size_t>(g.rows), g.pos + c_.position_offset);
      g.caches->resize(layers_.size());
    }
    const int64_t N = tokens.size(0);
    Tensor x = ops::add(tokens, (*positions_)(Tensor::from_ints(pos, {N, 1}).to(tokens.device())));  // (N, 1, C)
    if (emb_norm_) x = (*emb_norm_)(x);
    x = ops::dropout(x, c_.dropout, is_training());
    for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->step(x, groups, i, row_kernel);
    if (final_norm_) x = (*final_norm_)(x);
    return x;
  }

 private:
  // tokens (B, T, C) at positions pos0.. -> + positions, embedding norm, dropout.
  Tensor embed(const Tensor& tokens, int64_t pos0) {
    const int64_t T = tokens.size(1);
    DS_CHECK(pos0 + T <= c_.max_positions,
             "[seq2seq] sequence length {} exceeds max_position_embeddings {}", pos0 + T,
             c_.max_positions);
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = pos0 + t + c_.position_offset;
    Tensor x = ops::add(tokens, (*positions_)(Tensor::from_ints(pos, {T}).to(tokens.device())));  // (B, T, C)
    if (emb_norm_) x = (*emb_norm_)(x);
    return ops::dropout(x, c_.dropout, is_training());
  }

  const Seq2SeqConfig c_;  // a copy: a layer may outlive the model that built it
  std::shared_ptr<Context> ctx_;
  std::shared_ptr<nn::Embedding> positions_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::shared_ptr<nn::LayerNorm> emb_norm_, final_norm_;
};

Tensor shift_tokens_right(const Tensor& labels, int64_t pad_token_id,
                          int64_t decoder_start_token_id) {
  check_ids(labels, "labels");
  const int64_t B = labels.size(0), T = labels.size(1);
  const std::vector<int64_t> l = labels.to_int_vector();
  std::vector<int64_t> out(l.size());
  for (int64_t b = 0; b < B; ++b) {
    out[static_cast<size_t>(b * T)] = decoder_start_token_id;
    for (int64_t t = 1; t < T; ++t) {
      const int64_t v = l[static_cast<size_t>(b * T + t - 1)];
      out[static_cast<size_t>(b * T + t)] = v == -100 ? pad_token_id : v;
    }
  }
  return Tensor::from_ints(out, {B, T});
}

// ---- the model ----

Seq2Seq::Seq2Seq(Seq2SeqConfig config, bool init)
    : Module(family_of(config).architecture), config_(std::move(config)) {
  config_.validate();
  const Seq2SeqConfig& c = config_;
  if (c.is_t5()) {
    build_t5();
    if (init && !nn::PartitionedInit::active()) init_weights();
    return;
  }
  auto model = register_module("model", std::make_shared<Container>("Seq2SeqModel"));
  shared_ = model->add("shared", std::make_shared<nn::Embedding>(c.vocab_size, c.d_model));
  encoder_ = model->add("encoder", std::make_shared<Stack>(c, false));
  decoder_ = model->add("decoder", std::make_shared<Stack>(c, true));
  lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(shared_->weight()));
  final_logits_bias_ = register_buffer("final_logits_bias", Tensor::zeros({1, c.vocab_size}));
  // Built piecewise (nn::PartitionedInit), ZeRO-3 draws each shard from init_parameter_range.
  if (init && !nn::PartitionedInit::active()) init_weights();
}

void Seq2Seq::set_gradient_checkpointing(bool on) {
  if (config_.is_t5()) return t5_checkpoint(on);
  encoder_->checkpoint_layers(on);
  decoder_->checkpoint_layers(on);
}

bool Seq2Seq::init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const {
  if (param_names_.empty())
    for (const auto& [name, p] : named_parameters()) param_names_.push_back(name);
  DS_CHECK(index < param_names_.size(), "[seq2seq] parameter index {} of {}", index,
           param_names_.size());
  const std::string& name = param_names_[index];
  if (config_.is_t5()) return init_t5_range(name, index, begin, count, out);
  ParamInit init{ParamInit::normal, config_.init_std};
  const bool norm = name.find("layer_norm.") != std::string::npos ||
                    name.find("layernorm_embedding.") != std::string::npos;
  if (norm && name.ends_with(".weight"))
    init.kind = ParamInit::ones;
  else if (name.ends_with(".bias"))
    init.kind = ParamInit::zeros;
  GPT::init_values(init, config_.seed, index, begin, count, out);
  if (name == "model.shared.weight") {  // _init_weights zeroes the padding_idx row
    const int64_t row0 = config_.pad_token_id * config_.d_model, row1 = row0 + config_.d_model;
    for (int64_t i = std::max(begin, row0); i < std::min(begin + count, row1); ++i)
      out[i - begin] = 0.0f;
  }
  return true;
}

void Seq2Seq::init_weights() {
  autograd::NoGradGuard no_grad;
  const auto named = named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const Tensor& p = named[k].second;
    std::vector<float> v(static_cast<size_t>(p.numel()));
    init_parameter_range(k, 0, p.numel(), v.data());
    p.detach().copy_from(Tensor::from_data(v, p.shape()).to(p.device()).to(p.dtype()));
  }
  if (final_logits_bias_.defined()) ops::fill_(final_logits_bias_, 0.0);
}

namespace {
Tensor scaled_tokens(nn::Embedding& shared, const Tensor& ids, const Seq2SeqConfig& c) {
  for (int64_t v : ids.to_int_vector())
    DS_CHECK(v >= 0 && v < c.vocab_size, "[seq2seq] token id {} outside the vocabulary [0, {})", v,
             c.vocab_size);
  // T5's shared embedding has no padding_idx: its pad row trains like the others.
  Tensor e = c.is_t5() ? shared(ids) : lookup(shared, ids, c.pad_token_id);
  return c.scale_embedding ? ops::mul(e, std::sqrt(static_cast<float>(c.d_model))) : e;
}
}  // namespace

Tensor Seq2Seq::encode(const Tensor& input_ids, const Tensor& attention_mask) {
  check_ids(input_ids, "input_ids");
  auto lens = key_lengths(attention_mask, input_ids.size(0), input_ids.size(1));
  if (config_.is_t5())
    return t5_run(false, scaled_tokens(*shared_, input_ids, config_), std::move(lens), {}, {});
  return encoder_->run(scaled_tokens(*shared_, input_ids, config_), std::move(lens), {}, {});
}

Tensor Seq2Seq::decode(const Tensor& decoder_input_ids, const Tensor& memory,
                       const Tensor& attention_mask) {
  check_ids(decoder_input_ids, "decoder_input_ids");
  DS_CHECK(memory.defined() && memory.dim() == 3 && memory.size(0) == decoder_input_ids.size(0) &&
               memory.size(2) == config_.d_model,
           "[seq2seq] decode needs the encoder output (B, S, C) = ({}, S, {}), got {}",
           decoder_input_ids.size(0), config_.d_model,
           memory.defined() ? shape_str(memory.shape()) : "undefined");
  return head(decoder_hidden(decoder_input_ids, memory, attention_mask));
}

Tensor Seq2Seq::decoder_hidden(const Tensor& decoder_input_ids, const Tensor& memory,
                               const Tensor& attention_mask) {
  auto lens = key_lengths(attention_mask, memory.size(0), memory.size(1));
  Tensor tokens = scaled_tokens(*shared_, decoder_input_ids, config_);
  return config_.is_t5() ? t5_run(true, tokens, {}, memory, std::move(lens))
                         : decoder_->run(tokens, {}, memory, std::move(lens));
}

Tensor Seq2Seq::head_input(const Tensor& h) const {
  return config_.is_t5() && config_.scale_decoder_outputs
             ? ops::mul(h, 1.0f / std::sqrt(static_cast<float>(config_.d_model)))
             : h;
}

Tensor Seq2Seq::head(const Tensor& h, bool row_kernel) {
  Tensor lg = detail::project(*lm_head_, head_input(h), row_kernel);  // (B, T, V)
  if (config_.is_t5()) return lg;
  return ops::add(lg, final_logits_bias_.dtype() == lg.dtype() ? final_logits_bias_
                                                               : final_logits_bias_.to(lg.dtype()));
}

Tensor Seq2Seq::logits(const Seq2SeqInputs& in) {
  Tensor dec = in.decoder_input_ids;
  if (!dec.defined()) {
    DS_CHECK(in.labels.defined(), "[seq2seq] logits need decoder_input_ids or labels");
    dec = shift_tokens_right(in.labels, config_.pad_token_id, config_.decoder_start_token_id).to(in.input_ids.defined() ? in.input_ids.device() : kCPU);
  }
  Tensor memory = encode(in.input_ids, in.attention_mask);
  return decode(dec, memory, in.attention_mask);
}

Tensor Seq2Seq::loss(const Seq2SeqInputs& in) {
  DS_CHECK(in.labels.defined(), "[seq2seq] loss needs labels");
  check_ids(in.labels, "labels");
  Tensor dec = in.decoder_input_ids;
  if (!dec.defined())
    dec = shift_tokens_right(in.labels, config_.pad_token_id, config_.decoder_start_token_id).to(in.input_ids.defined() ? in.input_ids.device() : kCPU);
  const Tensor h = decoder_hidden(dec, encode(in.input_ids, in.attention_mask),
                                  in.attention_mask);  // (B, T, C)
  const int64_t B = h.size(0), T = h.size(1), V = lm_head_->out_features();
  DS_CHECK(in.labels.size(0) == B && in.labels.size(1) == T,
           "[seq2seq] labels {} do not match the decoder input ({}, {})",
           shape_str(in.labels.shape()), B, T);
  for (int64_t v : in.labels.to_int_vector())
    DS_CHECK(v == -100 || (v >= 0 && v < V), "[seq2seq] label {} outside [0, {}) (-100 ignores)", v,
             V);
  // The LM head and the loss fused (ops::linear_cross_entropy): the (B, T, V) logits and their
  // gradient are never formed whole; final_logits_bias is a constant added to each row.
  return lm_head_->cross_entropy(head_input(h), in.labels.to(h.device()), -100,
                                 config_.is_t5() ? Tensor() : final_logits_bias_);
}

Tensor Seq2Seq::forward(const Tensor& ids) {
  return logits({ids, {}, {}, ids});
}

Tensor Seq2Seq::loss(const Tensor& ids, const Tensor& labels) {
  return loss(Seq2SeqInputs{ids, {}, {}, labels});
}

Tensor Seq2Seq::loss(const nn::Batch& b) {
  DS_CHECK(!b.token_type_ids.defined(),
           "[seq2seq] an encoder-decoder has no token types: the batch's token_type_ids would be "
           "ignored");
  return loss(Seq2SeqInputs{b.input_ids, b.attention_mask, b.decoder_input_ids, b.labels});
}

Tensor Seq2Seq::decode_step(const Tensor& ids, int64_t pos, const Tensor& memory,
                            const Tensor& attention_mask, std::vector<LayerCache>& caches,
                            int64_t max_positions) {
  StepGroup all{&caches,
                ids.size(0),
                pos,
                memory,
                key_lengths(attention_mask, memory.size(0), memory.size(1)),
                max_positions};
  return decode_step(ids, std::span<const StepGroup>(&all, 1), /*row_kernel=*/false);
}

Tensor Seq2Seq::decode_step(const Tensor& ids, std::span<const StepGroup> groups, bool row_kernel) {
  Tensor tokens = scaled_tokens(*shared_, ids, config_);  // (N, 1, C)
  return head(config_.is_t5() ? t5_step(tokens, groups, row_kernel)
                              : decoder_->step(tokens, groups, row_kernel),
              row_kernel);
}

Tensor Seq2Seq::generate(const Tensor& input_ids, const Tensor& attention_mask,
                         const BeamOptions& opt) {
  if (opt.num_beams > 1) return generate_beam(input_ids, attention_mask, opt);
  GreedyOptions g;
  g.max_new_tokens = opt.max_new_tokens;
  g.eos_token_id = opt.eos_token_id;
  opt.validate();
  g.forced_eos_token_id = opt.forced_eos_token_id;
  g.forced_bos_token_id = opt.forced_bos_token_id;
  g.min_length = opt.min_length;
  g.no_repeat_ngram_size = opt.no_repeat_ngram_size;
  g.encoder_no_repeat_ngram_size = opt.encoder_no_repeat_ngram_size;
  g.use_cache = opt.use_cache;
  return generate_greedy(input_ids, attention_mask, g);
}

Tensor Seq2Seq::generate_greedy(const Tensor& input_ids, const Tensor& attention_mask,
                                const GreedyOptions& opt) {
  // The source in host memory (ds_generate's) goes to the model's device first.
  if (const Device d = shared_->weight().device(); input_ids.defined() && input_ids.device() != d)
    return generate_greedy(input_ids.to(d), attention_mask, opt);
  DS_CHECK(opt.max_new_tokens >= 1, "[seq2seq] max_new_tokens must be at least 1, got {}",
           opt.max_new_tokens);
  const int64_t eos = opt.eos_token_id == -2 ? config_.eos_token_id : opt.eos_token_id;
  const int64_t forced =
      opt.forced_eos_token_id == -2 ? config_.forced_eos_token_id : opt.forced_eos_token_id;
  DS_CHECK(config_.is_t5() || opt.max_new_tokens + 1 <= config_.max_positions,
           "[seq2seq] 1 + max_new_tokens {} exceeds max_position_embeddings {}", opt.max_new_tokens,
           config_.max_positions);
  autograd::NoGradGuard no_grad;
  detail::EvalMode eval(*this);
  check_ids(input_ids, "input_ids");
  const int64_t B = input_ids.size(0), V = config_.vocab_size;
  detail::LogitsProcessors processors;
  processors.vocab_size = V;
  processors.max_length = 1 + opt.max_new_tokens;
  processors.min_length = opt.min_length;
  processors.eos = eos;
  processors.forced_eos = forced;
  processors.forced_bos = opt.forced_bos_token_id;
  processors.no_repeat_ngram_size = opt.no_repeat_ngram_size;
  processors.encoder_no_repeat_ngram_size = opt.encoder_no_repeat_ngram_size;
  const std::vector<int64_t> src = input_ids.to_int_vector();
  const int64_t S = input_ids.size(1);
  const Tensor memory = encode(input_ids, attention_mask);
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B), {config_.decoder_start_token_id});
  std::vector<bool> done(static_cast<size_t>(B), false);
  std::vector<LayerCache> caches;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const int64_t cur = step + 1;
    Tensor last;  // (B, 1, V): the logits of the newest position
    if (opt.use_cache) {
      std::vector<int64_t> newest;
      for (const auto& s : seqs) newest.push_back(s.back());
      last = decode_step(Tensor::from_ints(newest, {B, 1}).to(input_ids.device()), cur - 1, memory,
                         attention_mask, caches, processors.max_length);
    } else {
      std::vector<int64_t> flat;
      for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
      const Tensor dec = Tensor::from_ints(flat, {B, cur}).to(input_ids.device());
      last = ops::slice(decode(dec, memory, attention_mask), 1, cur - 1, cur);
    }
    std::vector<float> lg = ops::contiguous(last).to(DType::f32).to_vector();  // (B, V)
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      float* row = lg.data() + b * V;
      processors.apply(seqs[static_cast<size_t>(b)],
                       std::vector<int64_t>(src.begin() + b * S, src.begin() + (b + 1) * S), row);
      int64_t best = 0;
      for (int64_t v = 1; v < V; ++v)
        if (row[v] > row[best]) best = v;
      if (done[static_cast<size_t>(b)]) best = config_.pad_token_id;
      seqs[static_cast<size_t>(b)].push_back(best);
      if (eos >= 0 && best == eos) done[static_cast<size_t>(b)] = true;
      all_done = all_done && done[static_cast<size_t>(b)];
    }
    if (all_done) break;
  }
  std::vector<int64_t> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  return Tensor::from_ints(flat, {B, static_cast<int64_t>(seqs[0].size())});
}

}  // namespace ds::models
