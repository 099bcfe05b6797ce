#include "ds/models/gpt_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/nn/rope.h"
#include "ds/ops/ops.h"

namespace ds::models {

using nn::Layout;

struct GPTDecoder::Weights {
  struct Layer {
    Tensor norm1_w, norm1_b, norm2_w, norm2_b;
    Tensor c_attn_w, c_attn_b, c_proj_w, c_proj_b;      // gpt2
    Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;      // llama
    Tensor q_norm_w, k_norm_w;                          // qk_norm
    Tensor norm3_w, norm4_w;                            // sandwich_norm (GLM-4)
    Tensor fc_w, fc_b, mlp_proj_w, mlp_proj_b;          // gpt2 MLP
    Tensor gate_w, gate_b, up_w, up_b, down_w, down_b;  // SwiGLU
  };
  std::shared_ptr<const GPT> model;
  GPTConfig cfg;
  Device device;
  Tensor wte, wpe, normf_w, normf_b, head_w;
  std::vector<Layer> layers;
  std::vector<double> rope_inv_freq;
  float rope_scale = 1.0f;
};

namespace {

Tensor f32_contiguous(const Tensor& t) {
  Tensor c = t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32);
  return c.is_contiguous() ? c : ops::contiguous(c);
}

// t on device d (a copy when it is elsewhere).
Tensor on(const Tensor& t, Device d) {
  if (t.device() == d) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), d);
  out.copy_from(t);
  return out;
}

// ops::linear (the GEMM path, for prefill chunks), or ops::linear_rows for decode rows (`rows`:
// true, or a single row), whose rows do not depend on each other.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {}, bool rows = false) {
  if (rows || x.numel() == w.size(1)) return ops::linear_rows(x, w, b);
  return ops::linear(x, w, b);
}

}  // namespace

GPTDecoder::GPTDecoder(std::shared_ptr<const GPT> model) {
  auto w = std::make_shared<Weights>();
  w->model = std::move(model);
  w->cfg = w->model->config();
  const GPTConfig& cfg = w->cfg;
  std::map<std::string, Tensor> p;
  for (auto& [name, t] : w->model->named_parameters()) p.emplace(name, t);
  auto req = [&](const std::string& name) {
    auto it = p.find(name);
    DS_CHECK(it != p.end(), "[generate] the model has no parameter '{}'", name);
    return it->second;
  };
  auto opt = [&](const std::string& name) {
    auto it = p.find(name);
    return it == p.end() ? Tensor() : it->second;
  };
  const bool gpt2 = cfg.layout == Layout::gpt2;
  w->wte = req(gpt2 ? "wte.weight" : "embed_tokens.weight");
  w->device = w->wte.device();
  if (gpt2) w->wpe = req("wpe.weight");
  const std::string nf = gpt2 ? "ln_f" : "norm";
  w->normf_w = req(nf + ".weight");
  w->normf_b = opt(nf + ".bias");
  w->head_w = cfg.tie_embeddings ? w->wte : req("lm_head.weight");
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    Weights::Layer l;
    if (gpt2) {
      const std::string b = "h." + std::to_string(i) + ".";
      l.norm1_w = req(b + "ln_1.weight"), l.norm1_b = opt(b + "ln_1.bias");
      l.norm2_w = req(b + "ln_2.weight"), l.norm2_b = opt(b + "ln_2.bias");
      l.c_attn_w = req(b + "attn.c_attn.weight"), l.c_attn_b = opt(b + "attn.c_attn.bias");
      l.c_proj_w = req(b + "attn.c_proj.weight"), l.c_proj_b = opt(b + "attn.c_proj.bias");
      l.fc_w = req(b + "mlp.c_fc.weight"), l.fc_b = opt(b + "mlp.c_fc.bias");
      l.mlp_proj_w = req(b + "mlp.c_proj.weight"), l.mlp_proj_b = opt(b + "mlp.c_proj.bias");
    } else {
      const std::string b = "layers." + std::to_string(i) + ".";
      l.norm1_w = req(b + "input_layernorm.weight");
      l.norm2_w = req(b + "post_attention_layernorm.weight");
      const std::string a = b + "self_attn.";
      l.q_w = req(a + "q_proj.weight"), l.q_b = opt(a + "q_proj.bias");
      l.k_w = req(a + "k_proj.weight"), l.k_b = opt(a + "k_proj.bias");
      l.v_w = req(a + "v_proj.weight"), l.v_b = opt(a + "v_proj.bias");
      l.o_w = req(a + "o_proj.weight"), l.o_b = opt(a + "o_proj.bias");
      if (cfg.qk_norm)
        l.q_norm_w = req(a + "q_norm.weight"), l.k_norm_w = req(a + "k_norm.weight");
      if (cfg.sandwich_norm)
        l.norm3_w = req(b + "post_self_attn_layernorm.weight"),
        l.norm4_w = req(b + "post_mlp_layernorm.weight");
      const std::string m = b + "mlp.";
      l.gate_w = req(m + "gate_proj.weight"), l.gate_b = opt(m + "gate_proj.bias");
      l.up_w = req(m + "up_proj.weight"), l.up_b = opt(m + "up_proj.bias");
      l.down_w = req(m + "down_proj.weight"), l.down_b = opt(m + "down_proj.bias");
    }
    w->layers.push_back(std::move(l));
  }
  if (!gpt2) {
    w->rope_inv_freq = nn::rope_inv_freq(cfg.rope_scaling, cfg.rope_theta, cfg.rotary_dim());
    w->rope_scale = nn::rope_attention_scale(cfg.rope_scaling);
  }
  weights_ = std::move(w);
  k_.resize(static_cast<size_t>(cfg.n_layer));
  v_.resize(static_cast<size_t>(cfg.n_layer));
}

GPTDecoder::GPTDecoder(std::shared_ptr<const Weights> weights) : weights_(std::move(weights)) {
  k_.resize(static_cast<size_t>(weights_->cfg.n_layer));
  v_.resize(static_cast<size_t>(weights_->cfg.n_layer));
}

std::unique_ptr<IncrementalDecoder> GPTDecoder::fresh() const {
  return std::unique_ptr<IncrementalDecoder>(new GPTDecoder(weights_));
}

const GPT& GPTDecoder::model() const { return *weights_->model; }

int64_t GPTDecoder::capacity_limit() const { return weights_->cfg.block_size; }

int64_t GPTDecoder::vocab_size() const { return weights_->cfg.vocab_size; }

void GPTDecoder::truncate(int64_t n) {
  DS_CHECK(n >= 0 && n <= len_, "[generate] cannot truncate the cache of {} positions to {}", len_,
           n);
  len_ = n;
}

int64_t GPTDecoder::cache_bytes() const {
  const GPTConfig& c = weights_->cfg;
  return 2 * c.n_layer * capacity_ * c.kv_heads() * c.head_dim() * 4;
}

void GPTDecoder::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const GPTConfig& c = weights_->cfg;
  const int64_t cap = std::min(c.block_size, std::max({positions, capacity_ * 2, int64_t{64}}));
  for (auto* caches : {&k_, &v_})
    for (Tensor& t : *caches) {  // position-major: the cached rows keep their place
      Tensor grown = Tensor::empty({cap, c.kv_heads(), c.head_dim()}, DType::f32, weights_->device);
      if (len_ > 0) ops::slice(grown, 0, 0, len_).copy_from(ops::slice(t, 0, 0, len_));
      t = grown;
    }
  capacity_ = cap;
}

// One sequence's attention for its n new rows at positions p0.. (q (1, NH, n, hd), k and v
// (1, KV, n, hd), rope and q/k norm applied): appends k and v to the cache and returns
// (1, n, NH*hd) in dtype.
Tensor GPTDecoder::attend(int64_t li, const Tensor& q, const Tensor& k, const Tensor& v,
                          int64_t p0, DType dtype) {
  const GPTConfig& c = weights_->cfg;
  const int64_t n = q.size(2), NH = c.n_head, KV = c.kv_heads(), hd = c.head_dim();
  Tensor& kc = k_[static_cast<size_t>(li)];
  Tensor& vc = v_[static_cast<size_t>(li)];
  // (1, KV, n, hd) -> rows p0 .. p0+n-1 of (capacity, KV, hd)
  ops::slice(kc, 0, p0, p0 + n).copy_from(ops::transpose(ops::reshape(k, {KV, n, hd}), 0, 1));
  ops::slice(vc, 0, p0, p0 + n).copy_from(ops::transpose(ops::reshape(v, {KV, n, hd}), 0, 1));
  if (p0 == 0) {
    // Prefill: the fused kernel of training, with K/V repeated to NH heads as the module does.
    auto repeat_kv = [&](const Tensor& t) {
      if (KV == NH) return t;
      Tensor e = ops::broadcast_to(ops::reshape(t, {1, KV, 1, n, hd}), {1, KV, NH / KV, n, hd});
      return ops::reshape(ops::contiguous(e), {1, NH, n, hd});
    };
    const Tensor y = ops::causal_attention(q, repeat_kv(k), repeat_kv(v));  // (1, NH, n, hd)
    return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {1, n, NH * hd});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Tensor y = ops::decode_attention(ops::reshape(f32_contiguous(q), {NH, n, hd}), kc, vc, p0,
                                         scale);  // (n, NH, hd)
  return ops::reshape(dtype == DType::f32 ? y : ops::cast(y, dtype), {1, n, NH * hd});
}

// x (1, N, C): the rows of every sequence of the step, seqs[b] owning rows off .. off+n-1. The
// projections run once over all N rows; each sequence's heads, rope and attention run on its own
// rows against its own cache; the output projection runs over all rows again.
Tensor GPTDecoder::attention(int64_t li, const Tensor& x, std::span<const Chunk> seqs,
                             bool rows) const {
  const Weights& w = *weights_;
  const Weights::Layer& l = w.layers[static_cast<size_t>(li)];
  const GPTConfig& c = w.cfg;
  const int64_t NH = c.n_head, KV = c.kv_heads(), hd = c.head_dim();
  const bool gpt2 = c.layout == Layout::gpt2;
  // Rows off .. off+n-1 of t (1, N, F); the tensor itself when one sequence owns them all.
  auto rows_of = [&](const Tensor& t, const Chunk& ch) {
    return seqs.size() == 1 ? t : ops::contiguous(ops::slice(t, 1, ch.off, ch.off + ch.n));
  };
  std::vector<Tensor> ys;
  if (gpt2) {  // the module's split of c_attn: [q | k | v], each head a contiguous hd slice
    const Tensor qkv_all = linear(x, l.c_attn_w, l.c_attn_b, rows);  // (1, N, 3C)
    for (const Chunk& ch : seqs) {
      const int64_t n = ch.n;
      Tensor qkv = ops::reshape(rows_of(qkv_all, ch), {1, n, 3, NH, hd});
      qkv = ops::contiguous(ops::permute(qkv, {2, 0, 3, 1, 4}));  // (3, 1, NH, n, hd)
      ys.push_back(ch.dec->attend(li, ops::reshape(ops::slice(qkv, 0, 0, 1), {1, NH, n, hd}),
                                  ops::reshape(ops::slice(qkv, 0, 1, 2), {1, NH, n, hd}),
                                  ops::reshape(ops::slice(qkv, 0, 2, 3), {1, NH, n, hd}), ch.p0,
                                  x.dtype()));
    }
  } else {
    const Tensor q_all = linear(x, l.q_w, l.q_b, rows);  // (1, N, NH*hd)
    const Tensor k_all = linear(x, l.k_w, l.k_b, rows);  // (1, N, KV*hd)
    const Tensor v_all = linear(x, l.v_w, l.v_b, rows);
    for (const Chunk& ch : seqs) {
      auto heads = [&](const Tensor& t, int64_t h, const Tensor& norm_w) {
        Tensor r = ops::reshape(rows_of(t, ch), {1, ch.n, h, hd});
        if (norm_w.defined()) r = ops::rms_norm(r, norm_w, c.norm_eps);
        return ops::contiguous(ops::transpose(r, 1, 2));  // (1, h, n, hd)
      };
      ys.push_back(ch.dec->attend(li,
                                  ops::rope(heads(q_all, NH, l.q_norm_w), w.rope_inv_freq,
                                            w.rope_scale, ch.p0, c.rope_interleaved),
                                  ops::rope(heads(k_all, KV, l.k_norm_w), w.rope_inv_freq,
                                            w.rope_scale, ch.p0, c.rope_interleaved),
                                  heads(v_all, KV, Tensor()), ch.p0, x.dtype()));
    }
  }
  const Tensor y = ys.size() == 1 ? ys[0] : ops::concat(ys, 1);  // (1, N, NH*hd)
  return gpt2 ? linear(y, l.c_proj_w, l.c_proj_b, rows) : linear(y, l.o_w, l.o_b, rows);
}

Tensor GPTDecoder::mlp(int64_t li, const Tensor& x, bool rows) const {
  const Weights::Layer& l = weights_->layers[static_cast<size_t>(li)];
  if (weights_->cfg.layout == Layout::gpt2)
    return linear(ops::gelu(linear(x, l.fc_w, l.fc_b, rows)), l.mlp_proj_w, l.mlp_proj_b, rows);
  return linear(ops::swiglu(linear(x, l.gate_w, l.gate_b, rows), linear(x, l.up_w, l.up_b, rows)),
                l.down_w, l.down_b, rows);
}

Tensor GPTDecoder::forward(std::span<const int32_t> ids, bool all_logits) {
  const Chunk c{this, len_, static_cast<int64_t>(ids.size()), 0};
  return run(std::span(&c, 1), ids, all_logits);
}

Tensor GPTDecoder::decode_batch(std::span<IncrementalDecoder* const> decoders,
                                std::span<const int32_t> ids) {
  DS_CHECK(!decoders.empty() && decoders.size() == ids.size(),
           "[generate] decode_batch needs one token per decoder ({} decoders, {} tokens)",
           decoders.size(), ids.size());
  std::vector<Chunk> seqs;
  for (size_t b = 0; b < decoders.size(); ++b) {
    auto* d = dynamic_cast<GPTDecoder*>(decoders[b]);
    DS_CHECK(d != nullptr && d->weights_->model == weights_->model,
             "[generate] decode_batch: every decoder must run the same model (decoder {} does not)",
             b);
    for (size_t e = 0; e < b; ++e)
      DS_CHECK(decoders[e] != d, "[generate] decode_batch: decoder {} appears twice", b);
    seqs.push_back({d, d->len_, 1, static_cast<int64_t>(b)});
  }
  return run(seqs, ids, /*all_logits=*/true);
}

Tensor GPTDecoder::run(std::span<const Chunk> seqs, std::span<const int32_t> ids,
                       bool all_logits) {
  const Weights& w = *weights_;
  const GPTConfig& cfg = w.cfg;
  const int64_t N = static_cast<int64_t>(ids.size());
  for (const Chunk& c : seqs) {
    DS_CHECK(c.n > 0, "[generate] forward needs at least one token");
    DS_CHECK(c.p0 + c.n <= cfg.block_size,
             "[generate] {} cached + {} new tokens exceed the model's context of {} (block_size)",
             c.p0, c.n, cfg.block_size);
  }
  for (int32_t id : ids)
    DS_CHECK(id >= 0 && id < cfg.vocab_size,
             "[generate] token id {} outside the vocabulary [0, {})", id, cfg.vocab_size);
  autograd::NoGradGuard no_grad;
  for (const Chunk& c : seqs) c.dec->reserve(c.p0 + c.n);
  // Decode rows (one token per sequence) take the row kernel: each row's result is what it would
  // be alone. A prefill chunk takes the GEMM path.
  const bool rows = seqs.size() > 1;
  const bool gpt2 = cfg.layout == Layout::gpt2;
  std::vector<int64_t> idv(ids.begin(), ids.end());
  Tensor x = ops::embedding(w.wte, on(Tensor::from_ints(idv, {1, N}), w.device));
  if (gpt2) {
    std::vector<int64_t> pos;
    for (const Chunk& c : seqs)
      for (int64_t t = 0; t < c.n; ++t) pos.push_back(c.p0 + t);
    x = ops::add(x, ops::embedding(w.wpe, on(Tensor::from_ints(pos, {N}), w.device)));
  }
  for (int64_t li = 0; li < cfg.n_layer; ++li) {
    const Weights::Layer& l = w.layers[static_cast<size_t>(li)];
    Tensor h = gpt2 ? ops::layer_norm(x, l.norm1_w, l.norm1_b, cfg.norm_eps)
                    : ops::rms_norm(x, l.norm1_w, cfg.norm_eps);
    Tensor a = attention(li, h, seqs, rows);
    if (l.norm3_w.defined()) a = ops::rms_norm(a, l.norm3_w, cfg.norm_eps);
    x = ops::add(x, a);
    h = gpt2 ? ops::layer_norm(x, l.norm2_w, l.norm2_b, cfg.norm_eps)
             : ops::rms_norm(x, l.norm2_w, cfg.norm_eps);
    Tensor m = mlp(li, h, rows);
    if (l.norm4_w.defined()) m = ops::rms_norm(m, l.norm4_w, cfg.norm_eps);
    x = ops::add(x, m);
  }
  for (const Chunk& c : seqs) c.dec->len_ = c.p0 + c.n;
  x = gpt2 ? ops::layer_norm(x, w.normf_w, w.normf_b, cfg.norm_eps)
           : ops::rms_norm(x, w.normf_w, cfg.norm_eps);
  if (!all_logits && N > 1) x = ops::slice(x, 1, N - 1, N);  // the LM head on the last row only
  const int64_t out_rows = x.size(1);
  const Tensor logits =
      f32_contiguous(ops::reshape(linear(x, w.head_w, {}, rows), {out_rows, cfg.vocab_size}));
  return on(logits, kCPU);
}

std::unique_ptr<IncrementalDecoder> make_gpt_decoder(std::shared_ptr<const GPT> model) {
  return std::make_unique<GPTDecoder>(std::move(model));
}

}  // namespace ds::models
