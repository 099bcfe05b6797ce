#include "ds/nn/layers.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ds/core/error.h"
#include "ds/ops/ops.h"

namespace ds::nn {

const char* layout_name(Layout l) {
  return l == Layout::gpt2 ? "gpt2" : "llama";
}

Layout layout_from_name(std::string_view name) {
  if (name == "gpt2") return Layout::gpt2;
  if (name == "llama") return Layout::llama;
  DS_THROW("[model] unknown layout '{}' (expected \"gpt2\" or \"llama\")", name);
}

// ---- Linear ----

Linear::Linear(int64_t in_features, int64_t out_features, bool bias) : Module("Linear") {
  DS_CHECK(in_features > 0 && out_features > 0, "[linear] sizes must be positive, got in {} out {}",
           in_features, out_features);
  weight_ = register_parameter("weight", Tensor::zeros({out_features, in_features}));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}));
}

Linear::Linear(Tensor weight, Tensor bias) : Module("Linear") {
  DS_CHECK(weight.defined() && weight.dim() == 2, "[linear] a tied weight must be 2-d (out, in)");
  weight_ = register_parameter("weight", std::move(weight));
  if (bias.defined()) bias_ = register_parameter("bias", std::move(bias));
}

Tensor Linear::forward(const Tensor& x) {
  Tensor y = ops::linear(x, weight_, bias_);
  if (!lora_A_) return y;
  // The low-rank path through the children's operator() so that their hooks run (ZeRO-3 gathers
  // lora_A and lora_B there while the frozen base weight stays resident).
  const Tensor h = lora_dropout_ > 0.0f ? ops::dropout(x, lora_dropout_, is_training()) : x;
  return ops::add(y, ops::mul((*lora_B_)((*lora_A_)(h)), lora_scaling_));
}

Tensor Linear::decode(const Tensor& x, bool rows) const {
  const bool each_row = rows || x.numel() == in_features();
  Tensor y = each_row ? ops::linear_rows(x, weight_, bias_) : ops::linear(x, weight_, bias_);
  if (!lora_A_) return y;
  return ops::add(y,
                  ops::mul(lora_B_->decode(lora_A_->decode(x, each_row), each_row), lora_scaling_));
}

bool Linear::fuses_cross_entropy(DType x_dtype) const {
  return !bias_.defined() && !lora_A_ && x_dtype != DType::f16;
}

Tensor Linear::cross_entropy(const Tensor& x, const Tensor& targets, int64_t ignore_index,
                             const Tensor& logit_bias) {
  DS_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features(),
           "[linear] cross_entropy input {} does not match weight {}",
           x.defined() ? shape_str(x.shape()) : "undefined", shape_str(weight_.shape()));
  if (!fuses_cross_entropy(x.dtype())) {
    Tensor y = ops::reshape((*this)(x), {-1, out_features()});
    if (logit_bias.defined())
      y = ops::add(y, logit_bias.dtype() == y.dtype() ? logit_bias : logit_bias.to(y.dtype()));
    return ops::cross_entropy(y, ops::reshape(targets, {-1}), ignore_index);
  }
  // The hooks run around the fused computation as around forward (ZeRO-3 gathers the weight).
  return call(x, [this, targets, ignore_index, logit_bias](const Tensor& in) {
    const Tensor w = weight_.dtype() == in.dtype() ? weight_ : ops::cast(weight_, in.dtype());
    return ops::linear_cross_entropy(ops::reshape(in, {-1, in_features()}), w,
                                     ops::reshape(targets, {-1}), ignore_index, 0, logit_bias);
  });
}

void Linear::add_lora(int64_t r, float scaling, float dropout) {
  DS_CHECK(!lora_A_, "[lora] this Linear already has LoRA");
  DS_CHECK(r > 0, "[lora] rank r must be positive, got {}", r);
  DS_CHECK(dropout >= 0.0f && dropout < 1.0f, "[lora] dropout must be in [0, 1), got {}", dropout);
  lora_A_ = register_module("lora_A", std::make_shared<Linear>(in_features(), r, false));
  lora_B_ = register_module("lora_B", std::make_shared<Linear>(r, out_features(), false));
  lora_scaling_ = scaling;
  lora_dropout_ = dropout;
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim) : Module("Embedding") {
  DS_CHECK(num_embeddings > 0 && embedding_dim > 0,
           "[embedding] sizes must be positive, got {} x {}", num_embeddings, embedding_dim);
  weight_ = register_parameter("weight", Tensor::zeros({num_embeddings, embedding_dim}));
}

Tensor Embedding::forward(const Tensor& ids) {
  return ops::embedding(weight_, ids);
}

// ---- norms ----

LayerNorm::LayerNorm(int64_t dim, float eps, bool bias) : Module("LayerNorm"), eps_(eps) {
  weight_ = register_parameter("weight", Tensor::ones({dim}));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return ops::layer_norm(x, weight_, bias_, eps_);
}

RMSNorm::RMSNorm(int64_t dim, float eps, bool unit_offset)
    : Module("RMSNorm"), eps_(eps), unit_offset_(unit_offset) {
  weight_ = register_parameter("weight", unit_offset ? Tensor::zeros({dim}) : Tensor::ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) {
  if (!unit_offset_) return ops::rms_norm(x, weight_, eps_);
  // (1 + w) in fp32 as transformers' Gemma norms compute it, also for 16-bit weights and inputs
  // (the kernel takes each in its own dtype): 1 + w rounded to bf16 would lose w's low bits.
  const Tensor w32 = weight_.dtype() == DType::f32 ? weight_ : ops::cast(weight_, DType::f32);
  return ops::rms_norm(x, ops::add(w32, 1.0f), eps_);
}

// ---- MLPs ----

namespace {

// A Linear cutting its output features (tensor parallelism) or a whole one.
// `share`: fewer units (K/V heads) than ranks are held by several ranks each.
std::shared_ptr<Linear> column(const BlockConfig& cfg, int64_t in, int64_t out, bool bias,
                               int64_t unit = 1, int64_t blocks = 1, bool share = false) {
  if (cfg.tp)
    return std::make_shared<ColumnParallelLinear>(in, out, bias, cfg.tp, unit, blocks, false,
                                                  share);
  return std::make_shared<Linear>(in, out, bias);
}
// A Linear cutting its input features (its output summed over the group) or a whole one.
std::shared_ptr<Linear> row(const BlockConfig& cfg, int64_t in, int64_t out, bool bias,
                            int64_t unit = 1) {
  if (cfg.tp) return std::make_shared<RowParallelLinear>(in, out, bias, cfg.tp, unit);
  return std::make_shared<Linear>(in, out, bias);
}

}  // namespace

MLP::MLP(const BlockConfig& cfg) : FeedForward("MLP"), dropout_(cfg.dropout) {
  c_fc_ = register_module("c_fc", column(cfg, cfg.n_embd, cfg.ffn_hidden, cfg.bias));
  c_proj_ = register_module("c_proj", row(cfg, cfg.ffn_hidden, cfg.n_embd, cfg.bias));
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = ops::gelu((*c_fc_)(x));  // (B, T, H)
  return ops::dropout((*c_proj_)(h), dropout_, is_training());
}

Tensor MLP::decode(const Tensor& x, bool rows) const {
  return c_proj_->decode(ops::gelu(c_fc_->decode(x, rows)), rows);
}

SwiGLUMLP::SwiGLUMLP(const BlockConfig& cfg)
    : FeedForward("SwiGLUMLP"), dropout_(cfg.dropout), geglu_(cfg.geglu) {
  gate_proj_ = register_module("gate_proj", column(cfg, cfg.n_embd, cfg.ffn_hidden, cfg.bias));
  up_proj_ = register_module("up_proj", column(cfg, cfg.n_embd, cfg.ffn_hidden, cfg.bias));
  down_proj_ = register_module("down_proj", row(cfg, cfg.ffn_hidden, cfg.n_embd, cfg.bias));
}

Tensor SwiGLUMLP::act(const Tensor& gate, const Tensor& up) const {
  return geglu_ ? ops::mul(ops::gelu(gate), up) : ops::swiglu(gate, up);
}

Tensor SwiGLUMLP::forward(const Tensor& x) {
  Tensor h = act((*gate_proj_)(x), (*up_proj_)(x));  // (B, T, H)
  return ops::dropout((*down_proj_)(h), dropout_, is_training());
}

Tensor SwiGLUMLP::decode(const Tensor& x, bool rows) const {
  return down_proj_->decode(act(gate_proj_->decode(x, rows), up_proj_->decode(x, rows)), rows);
}

// ---- attention ----

namespace {

// attention (B, NH, T, hd) -> (B, T, NH*hd), the layout the output projection reads.
Tensor merge_heads(const Tensor& y) {
  const int64_t B = y.size(0), NH = y.size(1), T = y.size(2), hd = y.size(3);
  return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {B, T, NH * hd});
}

void check_input(const Tensor& x, int64_t C) {
  DS_CHECK(x.dim() == 3 && x.size(2) == C, "[attention] expected input (B, T, {}), got {}", C,
           shape_str(x.shape()));
}

}  // namespace

FusedQKVAttention::FusedQKVAttention(const BlockConfig& cfg)
    : SelfAttention("FusedQKVAttention"),
      n_embd_(cfg.n_embd),
      n_head_(cfg.n_head),
      head_dim_(cfg.resolved_head_dim()),
      dropout_(cfg.dropout) {
  DS_CHECK(n_head_ > 0 && head_dim_ > 0, "[attention] n_head {} and head size {} must be positive",
           n_head_, head_dim_);
  const int64_t C = n_embd_;
  DS_CHECK(n_head_ * head_dim_ == C && cfg.resolved_kv_heads() == n_head_,
           "[attention] the gpt2 layout needs n_head * head size == n_embd and no grouped-query "
           "attention");
  c_attn_ = register_module("c_attn", column(cfg, C, 3 * C, cfg.bias, head_dim_, 3));
  c_proj_ = register_module("c_proj", row(cfg, C, C, cfg.bias, head_dim_));
  if (cfg.tp) n_head_ /= cfg.tp->size();  // this rank's heads (c_attn checked they divide)
}

Tensor FusedQKVAttention::forward(const Tensor& x) {
  check_input(x, n_embd_);
  const int64_t B = x.size(0), T = x.size(1), NH = n_head_, hd = head_dim_;
  Tensor qkv = ops::reshape((*c_attn_)(x), {B, T, 3, NH, hd});  // (B, T, 3, NH, hd)
  // One copy to (3, B, NH, T, hd) makes q, k and v contiguous slices that the attention kernel
  // reads in place; backward sums the three slice gradients into one buffer of that shape.
  qkv = ops::contiguous(ops::permute(qkv, {2, 0, 3, 1, 4}));  // (3, B, NH, T, hd)
  const Tensor q = ops::reshape(ops::slice(qkv, 0, 0, 1), {B, NH, T, hd});
  const Tensor k = ops::reshape(ops::slice(qkv, 0, 1, 2), {B, NH, T, hd});
  const Tensor v = ops::reshape(ops::slice(qkv, 0, 2, 3), {B, NH, T, hd});
  const Tensor y = (*c_proj_)(merge_heads(ops::causal_attention(q, k, v)));  // (B, T, C)
  return ops::dropout(y, dropout_, is_training());
}

// The projections once over every row of the step; each sequence's heads and cached attention on
// its own rows (the module's split of c_attn: [q | k | v], each head a contiguous hd slice).
Tensor FusedQKVAttention::decode(const Tensor& x, const DecodeStep& step) const {
  const int64_t NH = n_head_, hd = head_dim_;
  const Tensor qkv_all = c_attn_->decode(x, step.rows);  // (1, N, 3C)
  std::vector<Tensor> ys;
  for (const DecodeSeq& seq : step.seqs) {
    const int64_t n = seq.n;
    Tensor qkv = ops::reshape(decode_rows(qkv_all, step, seq), {1, n, 3, NH, hd});
    qkv = ops::contiguous(ops::permute(qkv, {2, 0, 3, 1, 4}));  // (3, 1, NH, n, hd)
    ys.push_back(attend_cached(ops::reshape(ops::slice(qkv, 0, 0, 1), {1, NH, n, hd}),
                               ops::reshape(ops::slice(qkv, 0, 1, 2), {1, NH, n, hd}),
                               ops::reshape(ops::slice(qkv, 0, 2, 3), {1, NH, n, hd}), seq,
                               x.dtype()));
  }
  return c_proj_->decode(join_decode_rows(ys), step.rows);  // (1, N, C)
}

GroupedQueryAttention::GroupedQueryAttention(const BlockConfig& cfg)
    : SelfAttention("GroupedQueryAttention"),
      n_embd_(cfg.n_embd),
      n_head_(cfg.n_head),
      n_kv_head_(cfg.resolved_kv_heads()),
      head_dim_(cfg.resolved_head_dim()),
      dropout_(cfg.dropout),
      attn_scale_(cfg.attn_scale),
      window_(cfg.sliding_window),
      softcap_(cfg.attn_softcap) {
  DS_CHECK(n_head_ > 0 && head_dim_ > 0, "[attention] n_head {} and head size {} must be positive",
           n_head_, head_dim_);
  DS_CHECK(attn_scale_ >= 0.0f && window_ >= 0,
           "[attention] attn_scale {} and sliding_window {} must be >= 0", attn_scale_, window_);
  DS_CHECK(n_head_ % n_kv_head_ == 0, "[attention] n_head {} not divisible by n_kv_head {}",
           n_head_, n_kv_head_);
  const int64_t C = n_embd_, Q = n_head_ * head_dim_, KV = n_kv_head_ * head_dim_;
  const bool qkv_bias = cfg.bias || cfg.qkv_bias;
  q_proj_ = register_module("q_proj", column(cfg, C, Q, qkv_bias, head_dim_));
  // With fewer K/V heads than tensor-parallel ranks, each rank holds the head its query heads
  // use (ranks sharing it sum its gradient: ColumnParallelLinear's `share`).
  k_proj_ = register_module("k_proj", column(cfg, C, KV, qkv_bias, head_dim_, 1, true));
  v_proj_ = register_module("v_proj", column(cfg, C, KV, qkv_bias, head_dim_, 1, true));
  o_proj_ = register_module("o_proj", row(cfg, Q, C, cfg.bias, head_dim_));
  if (cfg.qk_norm) {
    q_norm_ = register_module(
        "q_norm", std::make_shared<RMSNorm>(head_dim_, cfg.norm_eps, cfg.norm_unit_offset));
    k_norm_ = register_module(
        "k_norm", std::make_shared<RMSNorm>(head_dim_, cfg.norm_eps, cfg.norm_unit_offset));
  }
  const int64_t rd = cfg.resolved_rotary_dim();
  DS_CHECK(rd > 0 && rd <= head_dim_ && rd % 2 == 0,
           "[attention] rotary_dim {} must be even and within the head size {}", rd, head_dim_);
  rope_inv_freq_ = rope_inv_freq(cfg.rope_scaling, cfg.rope_theta, rd);
  if (cfg.rope_scaling.type == "longrope") {  // the table of sequences past the original context
    rope_long_after_ = cfg.rope_scaling.original_max_position;
    rope_inv_freq_long_ = rope_inv_freq(cfg.rope_scaling, cfg.rope_theta, rd, rope_long_after_ + 1);
  }
  rope_interleaved_ = cfg.rope_interleaved;
  rope_scale_ = rope_attention_scale(cfg.rope_scaling);
  if (cfg.tp) {  // this rank's heads (the projections above checked that they divide evenly)
    n_head_ /= cfg.tp->size();
    n_kv_head_ = std::max<int64_t>(1, n_kv_head_ / cfg.tp->size());  // one when shared
  }
}

const std::vector<double>& GroupedQueryAttention::inv_freq_for(int64_t seq_len) const {
  return rope_long_after_ > 0 && seq_len > rope_long_after_ ? rope_inv_freq_long_ : rope_inv_freq_;
}

Tensor GroupedQueryAttention::forward(const Tensor& x) {
  check_input(x, n_embd_);
  const int64_t B = x.size(0), T = x.size(1), NH = n_head_, KV = n_kv_head_, hd = head_dim_;
  // (B, T, heads * hd) -> (B, heads, T, hd), normalised per head first when norm is given.
  auto heads = [&](Linear& proj, int64_t n, RMSNorm* norm) {
    Tensor h = ops::reshape(proj(x), {B, T, n, hd});
    if (norm) h = (*norm)(h);
    return ops::contiguous(ops::transpose(h, 1, 2));
  };
  // Grouped-query attention: (B, KV, T, hd) -> (B, NH, T, hd), each K/V head repeated NH/KV
  // times in a row; the broadcast's backward sums the group's gradients.
  auto repeat_kv = [&](const Tensor& t) {
    if (KV == NH) return t;
    Tensor e = ops::broadcast_to(ops::reshape(t, {B, KV, 1, T, hd}), {B, KV, NH / KV, T, hd});
    return ops::reshape(ops::contiguous(e), {B, NH, T, hd});
  };
  auto rotate = [&](const Tensor& h) {
    return ops::rope(h, inv_freq_for(T), rope_scale_, 0, rope_interleaved_);
  };
  const Tensor q = rotate(heads(*q_proj_, NH, q_norm_.get()));
  const Tensor k = repeat_kv(rotate(heads(*k_proj_, KV, k_norm_.get())));
  const Tensor v = repeat_kv(heads(*v_proj_, KV, nullptr));
  ops::AttentionMask mask;
  mask.window = window_;
  mask.softcap = softcap_;
  const Tensor y =
      (*o_proj_)(merge_heads(ops::attention(q, k, v, mask, attn_scale_)));  // (B, T, C)
  return ops::dropout(y, dropout_, is_training());
}

Tensor GroupedQueryAttention::decode(const Tensor& x, const DecodeStep& step) const {
  const int64_t NH = n_head_, KV = n_kv_head_, hd = head_dim_;
  const Tensor q_all = q_proj_->decode(x, step.rows);  // (1, N, NH*hd)
  const Tensor k_all = k_proj_->decode(x, step.rows);  // (1, N, KV*hd)
  const Tensor v_all = v_proj_->decode(x, step.rows);
  std::vector<Tensor> ys;
  for (const DecodeSeq& seq : step.seqs) {
    // (1, n, h*hd) -> (1, h, n, hd), normalised per head first when norm is given.
    auto heads = [&](const Tensor& t, int64_t h, RMSNorm* norm) {
      Tensor r = ops::reshape(decode_rows(t, step, seq), {1, seq.n, h, hd});
      if (norm) r = norm->forward(r);
      return ops::contiguous(ops::transpose(r, 1, 2));
    };
    // A step's table by its sequence so far (largest position + 1); a step that switches
    // longrope's table is recomputed from position 0 by the decoder (models::GPTDecoder).
    auto rotate = [&](const Tensor& h) {
      return ops::rope(h, inv_freq_for(seq.p0 + seq.n), rope_scale_, seq.p0, rope_interleaved_);
    };
    ys.push_back(attend_cached(rotate(heads(q_all, NH, q_norm_.get())),
                               rotate(heads(k_all, KV, k_norm_.get())), heads(v_all, KV, nullptr),
                               seq, x.dtype(), attn_scale_, window_, softcap_));
  }
  return o_proj_->decode(join_decode_rows(ys), step.rows);  // (1, N, C)
}

// ---- blocks ----

namespace {
void check_ffn(const BlockConfig& cfg) {
  DS_CHECK(cfg.ffn_hidden > 0, "[block] ffn_hidden must be resolved (> 0), got {}", cfg.ffn_hidden);
}
}  // namespace

GPT2Block::GPT2Block(const BlockConfig& cfg) : Block("GPT2Block") {
  check_ffn(cfg);
  DS_CHECK(!cfg.sandwich_norm, "[block] sandwich_norm needs the llama layout");
  norm_1_ =
      register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.norm_eps, cfg.bias));
  attn_ = register_module("attn", std::make_shared<FusedQKVAttention>(cfg));
  norm_2_ =
      register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.norm_eps, cfg.bias));
  mlp_ = register_module("mlp", std::make_shared<MLP>(cfg));
}

LlamaBlock::LlamaBlock(const BlockConfig& cfg) : Block("LlamaBlock") {
  check_ffn(cfg);
  auto norm = [&] {
    return std::make_shared<RMSNorm>(cfg.n_embd, cfg.norm_eps, cfg.norm_unit_offset);
  };
  norm_1_ = register_module("input_layernorm", norm());
  attn_ = register_module("self_attn", std::make_shared<GroupedQueryAttention>(cfg));
  norm_2_ = register_module("post_attention_layernorm", norm());
  if (cfg.num_experts > 0)
    mlp_ = register_module("mlp", std::make_shared<MoEMLP>(cfg));
  else
    mlp_ = register_module("mlp", std::make_shared<SwiGLUMLP>(cfg));
  if (cfg.sandwich_norm) {
    norm_3_ = register_module("post_self_attn_layernorm", norm());
    norm_4_ = register_module("post_mlp_layernorm", norm());
  }
}

std::shared_ptr<Block> make_block(const BlockConfig& cfg) {
  switch (cfg.layout) {
    case Layout::gpt2:
      return std::make_shared<GPT2Block>(cfg);
    case Layout::llama:
      return std::make_shared<LlamaBlock>(cfg);
  }
  DS_THROW("[block] unknown layout {}", static_cast<int>(cfg.layout));
}

Tensor Block::forward(const Tensor& x) {
  Tensor a = (*attn_)((*norm_1_)(x));
  if (norm_3_) a = (*norm_3_)(a);
  Tensor h = ops::add(x, a);  // (B, T, C)
  Tensor m = (*mlp_)((*norm_2_)(h));
  if (norm_4_) m = (*norm_4_)(m);
  return ops::add(h, m);  // (B, T, C)
}

// forward's arithmetic, through the layers' decode steps (no hooks, no dropout).
Tensor Block::decode(const Tensor& x, const DecodeStep& step) const {
  Tensor a = attn_->decode(norm_1_->forward(x), step);
  if (norm_3_) a = norm_3_->forward(a);
  const Tensor h = ops::add(x, a);  // (1, N, C)
  Tensor m = mlp_->decode(norm_2_->forward(h), step.rows);
  if (norm_4_) m = norm_4_->forward(m);
  return ops::add(h, m);  // (1, N, C)
}

}  // namespace ds::nn
