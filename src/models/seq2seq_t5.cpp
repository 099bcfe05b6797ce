// T5 (T5ForConditionalGeneration) as a family of models::Seq2Seq (ds/models/seq2seq.h): the
// module tree under transformers' names, the stacks with the relative position bias, and T5's
// initialisation. The head, the loss and generation (greedy, beam search, logits processors, the
// KV cache's LayerCache) are Seq2Seq's, shared with BART.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/gpt.h"  // ParamInit / GPT::init_values
#include "ds/models/seq2seq.h"
#include "seq2seq_util.h"

namespace ds::models {

using detail::activate;

namespace {

// T5Attention._relative_position_bucket for one relative position (key - query), in float32 as
// torch computes it (the bucket of a large distance is truncated from a float32 log).
int64_t relative_bucket(int64_t rel, bool bidirectional, int64_t num_buckets,
                        int64_t max_distance) {
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (rel > 0) bucket += num_buckets;
    rel = std::abs(rel);
  } else {
    rel = -std::min<int64_t>(rel, 0);
  }
  const int64_t max_exact = num_buckets / 2;
  if (rel < max_exact) return bucket + rel;
  const float ratio = static_cast<float>(rel) / static_cast<float>(max_exact);
  const float denom = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / denom * static_cast<float>(num_buckets - max_exact);
  const int64_t large =
      std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), num_buckets - 1);
  return bucket + large;
}

// What the blocks of one forward read besides their input.
struct T5Context {
  ops::AttentionMask self_mask;   // encoder: padding; decoder: causal
  ops::AttentionMask cross_mask;  // decoder: the source padding
  Tensor memory;                  // decoder: the encoder output (B, S, C)
  Tensor position_bias;           // (1, NH, Tq, Tk): block 0's table, added by every block
  // The bucket ids (Tq, Tk) of position_bias and block 0's table: checkpointed blocks look the
  // bias up themselves (inside their recomputation), so these outlive the forward.
  Tensor bucket_ids;
  nn::Embedding* table = nullptr;
  // The bias of bucket_ids: table[bucket_ids] (Tq, Tk, NH) -> (1, NH, Tq, Tk).
  Tensor lookup_bias() const {
    Tensor b = (*table)(bucket_ids);
    const int64_t Tq = b.size(0), Tk = b.size(1), NH = b.size(2);
    return ops::reshape(ops::contiguous(ops::permute(b, {2, 0, 1})), {1, NH, Tq, Tk});
  }
};

// T5Attention: q/k/v/o without bias, NH heads of d_kv; block 0's self-attention also owns the
// relative_attention_bias table (num_buckets, NH).
class T5Attention : public nn::Module {
 public:
  T5Attention(int64_t C, int64_t NH, int64_t dkv, int64_t buckets)
      : Module("T5Attention"), n_head_(NH), d_kv_(dkv) {
    const int64_t I = NH * dkv;
    q_ = register_module("q", std::make_shared<nn::Linear>(C, I, false));
    k_ = register_module("k", std::make_shared<nn::Linear>(C, I, false));
    v_ = register_module("v", std::make_shared<nn::Linear>(C, I, false));
    o_ = register_module("o", std::make_shared<nn::Linear>(I, C, false));
    if (buckets > 0)
      table_ =
          register_module("relative_attention_bias", std::make_shared<nn::Embedding>(buckets, NH));
  }
  nn::Embedding* table() const { return table_.get(); }

  // The keys and values of kv (B, Tk, C) as (B, NH, Tk, d_kv) each.
  std::pair<Tensor, Tensor> keys_values(const Tensor& kv, bool row_kernel = false) {
    return {heads(*k_, kv, row_kernel), heads(*v_, kv, row_kernel)};
  }

  // x (B, Tq, C) attends to keys and values (B, NH, Tk, d_kv): softmax(q k^T + bias + mask) (no
  // 1/sqrt(d_kv)), dropout p on the probabilities in training, @ v, then o -> (B, Tq, C).
  Tensor attend(const Tensor& x, const Tensor& k, const Tensor& v, const ops::AttentionMask& mask,
                const Tensor& bias, float p, bool training) {
    return output(attend_heads(heads(*q_, x), k, v, mask, bias, p, training), false);
  }

  // A cached decoder step (Seq2Seq::decode_step), as Seq2Seq::Attention::attend_step; bias[i]
  // (1, NH, 1, P) is group i's relative position bias over its whole self-attention cache, -1e30
  // past the group's position (so it is the self-attention's mask too: no key lengths).
  template <class Group>
  Tensor attend_step(const Tensor& h, std::span<const Group> groups, size_t li, bool self,
                     bool row_kernel, const std::vector<Tensor>& bias) {
    const Tensor q = heads(*q_, h, row_kernel);  // (N, NH, 1, d_kv)
    Tensor k, v;
    if (self) std::tie(k, v) = keys_values(h, row_kernel);
    const Tensor a = detail::attend_groups(
        q, k, v, groups, li, [&](const Tensor& memory) { return keys_values(memory, row_kernel); },
        [&](size_t i, const Tensor& qg, const Tensor& keys, const Tensor& values,
            const ops::AttentionMask& mask) {
          if (!self) return attend_heads(qg, keys, values, mask, Tensor(), 0.0f, false);
          return attend_heads(qg, keys, values, ops::AttentionMask{false, {}}, bias[i], 0.0f,
                              false);
        });
    return output(a, row_kernel);
  }

 private:
  // (B, T, C) -> (B, NH, T, d_kv)
  Tensor heads(nn::Linear& proj, const Tensor& in, bool row_kernel = false) {
    const int64_t B = in.size(0), T = in.size(1);
    return ops::contiguous(ops::transpose(
        ops::reshape(detail::project(proj, in, row_kernel), {B, T, n_head_, d_kv_}), 1, 2));
  }
  // q (B, NH, Tq, d_kv) -> the heads' outputs (B, NH, Tq, d_kv).
  static Tensor attend_heads(const Tensor& q, const Tensor& k, const Tensor& v,
                             const ops::AttentionMask& mask, const Tensor& bias, float p,
                             bool training) {
    if (!bias.defined() && !(training && p > 0.0f)) return ops::attention(q, k, v, mask, 1.0f);
    const int64_t B = q.size(0), Tq = q.size(2), Tk = k.size(2);
    Tensor s = ops::matmul(q, ops::transpose(k, 2, 3));  // (B, NH, Tq, Tk)
    if (bias.defined()) s = ops::add(s, bias.dtype() == s.dtype() ? bias : bias.to(s.dtype()));
    const Tensor mb = detail::additive_mask(mask, B, Tq, Tk, s);
    if (mb.defined()) s = ops::add(s, mb);
    return ops::matmul(ops::dropout(ops::softmax(s), p, training), v);
  }
  // (B, NH, T, d_kv) -> o -> (B, T, C)
  Tensor output(const Tensor& a, bool row_kernel) {
    const int64_t B = a.size(0), T = a.size(2);
    return detail::project(
        *o_, ops::reshape(ops::contiguous(ops::transpose(a, 1, 2)), {B, T, n_head_ * d_kv_}),
        row_kernel);
  }

  int64_t n_head_, d_kv_;
  std::shared_ptr<nn::Linear> q_, k_, v_, o_;
  std::shared_ptr<nn::Embedding> table_;
};

// T5DenseActDense (wi, wo) / T5DenseGatedActDense (wi_0, wi_1, wo), dropout after the activation.
class T5Dense : public nn::Module {
 public:
  explicit T5Dense(const Seq2SeqConfig& c) : Module("T5Dense"), act_(c.activation) {
    const int64_t C = c.d_model, F = c.encoder_ffn;
    if (c.gated_ffn) {
      wi_0_ = register_module("wi_0", std::make_shared<nn::Linear>(C, F, false));
      wi_1_ = register_module("wi_1", std::make_shared<nn::Linear>(C, F, false));
    } else {
      wi_ = register_module("wi", std::make_shared<nn::Linear>(C, F, false));
    }
    wo_ = register_module("wo", std::make_shared<nn::Linear>(F, C, false));
    p_ = c.activation_dropout;
  }
  Tensor forward(const Tensor& x) override { return apply(x, false); }
  // (B, T, C) -> (B, T, C); row_kernel: the projections per row (detail::project).
  Tensor apply(const Tensor& x, bool row_kernel) {
    auto lin = [&](nn::Linear& l, const Tensor& in) { return detail::project(l, in, row_kernel); };
    Tensor h = wi_ ? activate(lin(*wi_, x), act_)
                   : ops::mul(activate(lin(*wi_0_, x), act_), lin(*wi_1_, x));  // (B, T, F)
    return lin(*wo_, ops::dropout(h, p_, is_training()));
  }

 private:
  std::string act_;
  float p_ = 0.0f;
  std::shared_ptr<nn::Linear> wi_, wi_0_, wi_1_, wo_;
};

// One residual sublayer (T5LayerSelfAttention / T5LayerCrossAttention / T5LayerFF): the child
// named `child` and its layer_norm (T5LayerNorm: RMS norm, weight only).
template <class M>
class T5Sublayer : public nn::Module {
 public:
  T5Sublayer(const std::string& child, std::shared_ptr<M> m, const Seq2SeqConfig& c)
      : Module("T5Sublayer") {
    m_ = register_module(child, std::move(m));
    norm_ = register_module("layer_norm", std::make_shared<nn::RMSNorm>(c.d_model, c.norm_eps));
  }
  M& inner() { return *m_; }
  nn::RMSNorm& norm() { return *norm_; }

 private:
  std::shared_ptr<M> m_;
  std::shared_ptr<nn::RMSNorm> norm_;
};

}  // namespace

// T5Stack: block.{i} (T5Block: layer.0 self-attention, [layer.1 cross-attention], layer.{1|2}
// FFN), final_layer_norm. Token embeddings come from the shared table (Seq2Seq).
class Seq2Seq::T5Stack : public nn::Module {
 public:
  class Block : public nn::Module {
   public:
    Block(const Seq2SeqConfig& c, bool decoder, bool has_table, std::shared_ptr<T5Context> ctx)
        : Module("T5Block"), c_(c), ctx_(std::move(ctx)) {
      const int64_t C = c.d_model, NH = c.encoder_heads, dkv = c.d_kv;
      auto layer = register_module("layer", std::make_shared<nn::ModuleList>());
      self_ = layer->append(std::make_shared<T5Sublayer<T5Attention>>(
          "SelfAttention",
          std::make_shared<T5Attention>(C, NH, dkv, has_table ? c.relative_buckets : 0), c));
      if (decoder)
        cross_ = layer->append(std::make_shared<T5Sublayer<T5Attention>>(
            "EncDecAttention", std::make_shared<T5Attention>(C, NH, dkv, 0), c));
      ff_ = layer->append(
          std::make_shared<T5Sublayer<T5Dense>>("DenseReluDense", std::make_shared<T5Dense>(c), c));
    }
    nn::Embedding* table() const { return self_->inner().table(); }

    Tensor forward(const Tensor& x) override {  // (B, T, C) -> (B, T, C)
      if (packed_len_ > 0)                      // [x, memory] (B, T + S, C): see set_packed
        return run(ops::slice(x, 1, 0, packed_len_), ops::slice(x, 1, packed_len_, x.size(1)));
      return run(x, ctx_->memory);
    }
    // As Seq2Seq::Layer's: a checkpointed decoder block takes [x, memory] concatenated along time,
    // so that its recomputation sees the encoder output and the gradient reaches it; 0 = not
    // packed.
    void set_packed(int64_t T) { packed_len_ = T; }
    // Generation (Seq2Seq::decode_step): x (N, 1, C), the groups' caches of this block (`li`) as
    // Seq2Seq::Layer::step's; bias[i] is group i's relative position bias.
    Tensor step(const Tensor& x, std::span<const StepGroup> groups, size_t li, bool row_kernel,
                const std::vector<Tensor>& bias) {
      const T5Step s{groups, li, row_kernel, &bias};
      return run(x, Tensor(), &s);
    }

   private:
    struct T5Step {
      std::span<const StepGroup> groups;
      size_t li;
      bool row_kernel;
      const std::vector<Tensor>* bias;
    };
    // step null: the whole sequence x attends to itself and to memory; else a cached step.
    Tensor run(const Tensor& x_in, const Tensor& memory, const T5Step* step = nullptr) {
      const bool tr = is_training();
      const float p = c_.dropout, pa = c_.attention_dropout;
      const T5Context& ctx = *ctx_;
      Tensor h = self_->norm()(x_in);
      T5Attention& sa = self_->inner();
      Tensor a;
      if (!step) {
        // Undefined while checkpointing: each block looks the bias up inside its recomputation.
        const Tensor bias = ctx.position_bias.defined() ? ctx.position_bias : ctx.lookup_bias();
        auto [k, v] = sa.keys_values(h);
        a = sa.attend(h, k, v, ctx.self_mask, bias, pa, tr);
      } else {
        a = sa.attend_step(h, step->groups, step->li, /*self=*/true, step->row_kernel, *step->bias);
      }
      Tensor x = ops::add(x_in, ops::dropout(a, p, tr));
      if (cross_) {
        h = cross_->norm()(x);
        T5Attention& ca = cross_->inner();
        if (!step) {
          auto [k, v] = ca.keys_values(memory);
          a = ca.attend(h, k, v, ctx.cross_mask, Tensor(), pa, tr);
        } else {
          a = ca.attend_step(h, step->groups, step->li, /*self=*/false, step->row_kernel,
                             *step->bias);
        }
        x = ops::add(x, ops::dropout(a, p, tr));
      }
      return ops::add(
          x, ops::dropout(ff_->inner().apply(ff_->norm()(x), step && step->row_kernel), p, tr));
    }

    const Seq2SeqConfig c_;  // a copy: a block may outlive the model that built it
    std::shared_ptr<T5Context> ctx_;
    int64_t packed_len_ = 0;
    std::shared_ptr<T5Sublayer<T5Attention>> self_, cross_;
    std::shared_ptr<T5Sublayer<T5Dense>> ff_;
  };

  T5Stack(const Seq2SeqConfig& c, bool decoder)
      : Module(decoder ? "T5Decoder" : "T5Encoder"),
        c_(c),
        decoder_(decoder),
        ctx_(std::make_shared<T5Context>()) {
    auto list = register_module("block", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0, n = decoder ? c.decoder_layers : c.encoder_layers; i < n; ++i)
      blocks_.push_back(list->append(std::make_shared<Block>(c, decoder, i == 0, ctx_)));
    final_norm_ =
        register_module("final_layer_norm", std::make_shared<nn::RMSNorm>(c.d_model, c.norm_eps));
    ctx_->self_mask.causal = decoder;
    ctx_->cross_mask.causal = false;
    ctx_->table = blocks_.front()->table();
  }

  void checkpoint_blocks(bool on) {
    for (auto& block : blocks_) block->set_gradient_checkpointing(on);
  }

  // tokens (B, T, C): the token embeddings -> the stack's output (B, T, C).
  Tensor run(const Tensor& tokens, std::vector<int64_t> self_lengths, Tensor memory,
             std::vector<int64_t> cross_lengths) {
    const int64_t T = tokens.size(1);
    ctx_->self_mask.key_lengths = std::move(self_lengths);
    ctx_->cross_mask.key_lengths = std::move(cross_lengths);
    ctx_->memory = std::move(memory);
    set_buckets(T, T, 0, tokens.device());
    const bool ck = blocks_.front()->gradient_checkpointing() && autograd::is_grad_enabled();
    ctx_->position_bias = ck ? Tensor() : ctx_->lookup_bias();
    Tensor x = ops::dropout(tokens, c_.dropout, is_training());
    for (auto& block : blocks_) {
      const bool pack = ctx_->memory.defined() && ck;
      block->set_packed(pack ? T : 0);
      x = (*block)(pack ? ops::concat({x, ctx_->memory}, 1) : x);  // (B, T, C)
    }
    ctx_->memory = Tensor();  // not held past the forward (backward keeps what it needs)
    ctx_->position_bias = Tensor();
    return ops::dropout((*final_norm_)(x), c_.dropout, is_training());
  }

  // Generation (decoder): tokens (N, 1, C), each group's rows at its position -> (N, 1, C); a
  // group's bias is its query at pos against keys 0..pos (transformers' past_seen_tokens), over
  // the P positions its caches will hold (detail::self_cache_capacity), -1e30 past pos: the
  // same sizes every step until the caches grow, so the allocator reuses its blocks.
  Tensor step(const Tensor& tokens, std::span<const StepGroup> groups, bool row_kernel) {
    std::vector<Tensor> bias;  // (1, NH, 1, P) per group
    for (const StepGroup& g : groups) {
      g.caches->resize(blocks_.size());
      const int64_t P = detail::self_cache_capacity(g, g.caches->front().self_k);
      set_buckets(1, P, g.pos, tokens.device());
      std::vector<float> future(static_cast<size_t>(P), 0.0f);
      std::fill(future.begin() + g.pos + 1, future.end(), -1e30f);
      Tensor b = ctx_->lookup_bias();
      const Tensor m = Tensor::from_data(future, {1, 1, 1, P}).to(b.device()).to(b.dtype());
      bias.push_back(ops::add(b, m));
    }
    Tensor x = tokens;
    for (size_t i = 0; i < blocks_.size(); ++i)
      x = blocks_[i]->step(x, groups, i, row_kernel, bias);
    return (*final_norm_)(x);
  }

 private:
  // ctx_->bucket_ids = the buckets (Tq, Tk) of (key j - query (past + i)).
  void set_buckets(int64_t Tq, int64_t Tk, int64_t past, Device device) {
    std::vector<int64_t> ids(static_cast<size_t>(Tq * Tk));
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j)
        ids[static_cast<size_t>(i * Tk + j)] = relative_bucket(
            j - (past + i), !decoder_, c_.relative_buckets, c_.relative_max_distance);
    ctx_->bucket_ids = Tensor::from_ints(ids, {Tq, Tk}).to(device);
  }

  const Seq2SeqConfig c_;
  bool decoder_;
  std::shared_ptr<T5Context> ctx_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::RMSNorm> final_norm_;
};

void Seq2Seq::build_t5() {
  const Seq2SeqConfig& c = config_;
  DS_CHECK(c.encoder_layers >= 1 && c.decoder_layers >= 1,
           "[seq2seq] t5 needs at least one encoder and one decoder block (block 0 holds the "
           "relative position bias)");
  shared_ = register_module("shared", std::make_shared<nn::Embedding>(c.vocab_size, c.d_model));
  t5_encoder_ = register_module("encoder", std::make_shared<T5Stack>(c, false));
  t5_decoder_ = register_module("decoder", std::make_shared<T5Stack>(c, true));
  lm_head_ = register_module("lm_head",
                             c.tie_word_embeddings
                                 ? std::make_shared<nn::Linear>(shared_->weight())
                                 : std::make_shared<nn::Linear>(c.d_model, c.vocab_size, false));
}

Tensor Seq2Seq::t5_run(bool decoder, const Tensor& tokens, std::vector<int64_t> self_lengths,
                       Tensor memory, std::vector<int64_t> cross_lengths) {
  return (decoder ? t5_decoder_ : t5_encoder_)
      ->run(tokens, std::move(self_lengths), std::move(memory), std::move(cross_lengths));
}

void Seq2Seq::t5_checkpoint(bool on) {
  t5_encoder_->checkpoint_blocks(on);
  t5_decoder_->checkpoint_blocks(on);
}

Tensor Seq2Seq::t5_step(const Tensor& tokens, std::span<const StepGroup> groups, bool row_kernel) {
  return t5_decoder_->step(tokens, groups, row_kernel);
}

// T5PreTrainedModel._init_weights with factor = init_std (initializer_factor): shared and an
// untied lm_head N(0, factor), q N(0, factor (C d_kv)^-1/2), k and v N(0, factor C^-1/2),
// o N(0, factor (NH d_kv)^-1/2), wi / wi_0 / wi_1 N(0, factor C^-1/2), wo N(0, factor F^-1/2),
// the relative_attention_bias tables N(0, factor C^-1/2), the norms `factor` (ones at 1).
bool Seq2Seq::init_t5_range(const std::string& name, size_t index, int64_t begin, int64_t count,
                            float* out) const {
  const Seq2SeqConfig& c = config_;
  const double f = c.init_std, C = static_cast<double>(c.d_model);
  const double I = static_cast<double>(c.encoder_heads * c.d_kv);
  auto ends = [&](const char* s) { return name.ends_with(s); };
  double std = f;
  if (ends("layer_norm.weight")) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(f);
    return true;
  }
  if (ends(".q.weight"))
    std = f / std::sqrt(C * static_cast<double>(c.d_kv));
  else if (ends(".k.weight") || ends(".v.weight") || ends(".wi.weight") || ends(".wi_0.weight") ||
           ends(".wi_1.weight") || ends("relative_attention_bias.weight"))
    std = f / std::sqrt(C);
  else if (ends(".o.weight"))
    std = f / std::sqrt(I);
  else if (ends(".wo.weight"))
    std = f / std::sqrt(static_cast<double>(c.encoder_ffn));
  GPT::init_values(ParamInit{ParamInit::normal, static_cast<float>(std)}, c.seed, index, begin,
                   count, out);
  return true;
}

}  // namespace ds::models
