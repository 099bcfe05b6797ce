#include "ds/serve/kv_decoder.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/nn/rope.h"
#include "ds/ops/ops.h"

namespace ds::serve {

using nn::Layout;

namespace {

Tensor f32_contiguous(const Tensor& t) {
  Tensor c = t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32);
  return c.is_contiguous() ? c : ops::contiguous(c);
}

// The end of one row's dot product: its two 8-lane accumulators reduced in a fixed order, then the
// tail past the last full 16 floats (from i).
inline float dot_finish(__m256 a0, __m256 a1, const float* w, const float* x, int64_t i,
                        int64_t n) {
  a0 = _mm256_add_ps(a0, a1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  float acc = _mm_cvtss_f32(s4);
  for (; i < n; ++i) acc = std::fma(w[i], x[i], acc);
  return acc;
}

// w . x over n floats: two accumulators over 16-float chunks, then dot_finish. Every decode row
// gets exactly this sequence of operations, alone (here) or four at a time (dot4), so a row's
// result never depends on the other rows of its batch.
float dot_row(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  return dot_finish(a0, a1, w, x, i, n);
}

// w . x_m for four rows x_m = x + m * n: each row's accumulators see dot_row's operations in
// dot_row's order (the same results), the weight chunk is loaded once for the four, and eight
// independent FMA chains hide the FMA latency that bounds one dot product's two chains.
void dot4(const float* w, const float* x, int64_t n, float* out, int64_t out_stride) {
  const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
    a00 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a00);
    a01 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + 8), a01);
    a10 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), a10);
    a11 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + 8), a11);
    a20 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + i), a20);
    a21 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + i + 8), a21);
    a30 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + i), a30);
    a31 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + i + 8), a31);
  }
  out[0] = dot_finish(a00, a01, w, x0, i, n);
  out[out_stride] = dot_finish(a10, a11, w, x1, i, n);
  out[2 * out_stride] = dot_finish(a20, a21, w, x2, i, n);
  out[3 * out_stride] = dot_finish(a30, a31, w, x3, i, n);
}

// Y (rows, out) = X (rows, in) W^T + b, for decode rows (one per sequence). A BLAS sgemm with few
// rows packs W on every call (OpenBLAS 0.3.21 has no GEMV forwarding), reading the weights twice,
// and its sums depend on how many rows it is given. Decode is bound by reading the weights once:
// here each weight row is read from memory once and dotted with every row of X while it sits in
// L1, so a batch of sequences shares the weight reads, and each row's sum is the dot_row() it
// would get alone (batched decoding equals one-at-a-time decoding bit for bit).
void gemm_rows(const float* W, const float* X, const float* b, float* Y, int64_t rows, int64_t out,
               int64_t in) {
  parallel_for(out, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* w = W + r * in;
      int64_t m = 0;
      for (; m + 4 <= rows; m += 4) dot4(w, X + m * in, in, Y + m * out + r, out);
      for (; m < rows; ++m) Y[m * out + r] = dot_row(w, X + m * in, in);
      if (b)
        for (m = 0; m < rows; ++m) Y[m * out + r] += b[r];
    }
  });
}

// ops::linear (the GEMM path, for prefill chunks), or gemm_rows() for decode rows (`rows`: true,
// or a single row) when x and the weights are plain fp32.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {}, bool rows = false) {
  const int64_t out = w.size(0), in = w.size(1);
  if (!(rows || x.numel() == in) || x.numel() % in != 0 || x.dtype() != DType::f32 ||
      w.dtype() != DType::f32 || !w.is_contiguous() ||
      (b.defined() && (b.dtype() != DType::f32 || !b.is_contiguous())))
    return ops::linear(x, w, b);
  const Tensor xc = x.is_contiguous() ? x : ops::contiguous(x);
  Shape shape = x.shape();
  shape.back() = out;
  Tensor y = Tensor::empty(shape);
  gemm_rows(w.data<float>(), xc.data<float>(), b.defined() ? b.data<float>() : nullptr,
            y.data<float>(), x.numel() / in, out, in);
  return y;
}

}  // namespace

KVDecoder::KVDecoder(std::shared_ptr<models::GPT> model)
    : model_(std::move(model)), cfg_(model_->config()) {
  std::map<std::string, Tensor> p;
  for (auto& [name, t] : model_->named_parameters()) p.emplace(name, t);
  auto req = [&](const std::string& name) {
    auto it = p.find(name);
    DS_CHECK(it != p.end(), "[generate] the model has no parameter '{}'", name);
    return it->second;
  };
  auto opt = [&](const std::string& name) {
    auto it = p.find(name);
    return it == p.end() ? Tensor() : it->second;
  };
  const bool gpt2 = cfg_.layout == Layout::gpt2;
  wte_ = req(gpt2 ? "wte.weight" : "embed_tokens.weight");
  if (gpt2) wpe_ = req("wpe.weight");
  const std::string nf = gpt2 ? "ln_f" : "norm";
  normf_w_ = req(nf + ".weight");
  normf_b_ = opt(nf + ".bias");
  head_w_ = cfg_.tie_embeddings ? wte_ : req("lm_head.weight");
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    Layer l;
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
      if (cfg_.qk_norm)
        l.q_norm_w = req(a + "q_norm.weight"), l.k_norm_w = req(a + "k_norm.weight");
      if (cfg_.sandwich_norm)
        l.norm3_w = req(b + "post_self_attn_layernorm.weight"),
        l.norm4_w = req(b + "post_mlp_layernorm.weight");
      const std::string m = b + "mlp.";
      l.gate_w = req(m + "gate_proj.weight"), l.gate_b = opt(m + "gate_proj.bias");
      l.up_w = req(m + "up_proj.weight"), l.up_b = opt(m + "up_proj.bias");
      l.down_w = req(m + "down_proj.weight"), l.down_b = opt(m + "down_proj.bias");
    }
    layers_.push_back(std::move(l));
  }
  if (!gpt2) {
    rope_inv_freq_ = nn::rope_inv_freq(cfg_.rope_scaling, cfg_.rope_theta, cfg_.rotary_dim());
    rope_scale_ = nn::rope_attention_scale(cfg_.rope_scaling);
  }
}

int64_t KVDecoder::capacity_limit() const {
  return cfg_.block_size;
}

void KVDecoder::truncate(int64_t n) {
  DS_CHECK(n >= 0 && n <= len_, "[generate] cannot truncate the cache of {} positions to {}", len_,
           n);
  len_ = n;
}

int64_t KVDecoder::cache_bytes() const {
  return 2 * cfg_.n_layer * capacity_ * cfg_.kv_heads() * cfg_.head_dim() * 4;
}

void KVDecoder::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const int64_t cap = std::min(cfg_.block_size, std::max({positions, capacity_ * 2, int64_t{64}}));
  const size_t n = static_cast<size_t>(cap * cfg_.kv_heads() * cfg_.head_dim());
  for (auto& l : layers_) {  // position-major: growing keeps every cached row in place
    l.k.resize(n);
    l.v.resize(n);
  }
  capacity_ = cap;
}

// One sequence's attention for its n new rows at positions p0.. (q, k, v: (1, NH|KV, n, hd),
// rope and q/k norm applied): appends k and v to the cache and returns (1, n, NH*hd) in dtype.
Tensor KVDecoder::attend(Layer& l, Tensor q, Tensor k, Tensor v, int64_t p0, DType dtype) {
  const int64_t n = q.size(2), NH = cfg_.n_head, KV = cfg_.kv_heads(), hd = cfg_.head_dim();
  q = f32_contiguous(q);
  k = f32_contiguous(k);
  v = f32_contiguous(v);
  {  // append to the cache: (KV, n, hd) -> rows p0 .. p0+n-1 of (capacity, KV, hd)
    const float* ks = k.data<float>();
    const float* vs = v.data<float>();
    for (int64_t h = 0; h < KV; ++h)
      for (int64_t t = 0; t < n; ++t) {
        const size_t src = static_cast<size_t>((h * n + t) * hd);
        const size_t dst = static_cast<size_t>(((p0 + t) * KV + h) * hd);
        std::copy_n(ks + src, hd, l.k.data() + dst);
        std::copy_n(vs + src, hd, l.v.data() + dst);
      }
  }
  Tensor y;  // (1, n, NH*hd)
  if (p0 == 0) {
    // Prefill: the fused kernel of training, with K/V repeated to NH heads as the module does.
    auto repeat_kv = [&](const Tensor& t) {
      if (KV == NH) return t;
      Tensor e = ops::broadcast_to(ops::reshape(t, {1, KV, 1, n, hd}), {1, KV, NH / KV, n, hd});
      return ops::reshape(ops::contiguous(e), {1, NH, n, hd});
    };
    y = ops::causal_attention(q, repeat_kv(k), repeat_kv(v));  // (1, NH, n, hd)
    return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {1, n, NH * hd});
  }
  y = Tensor::empty({1, n, NH * hd});
  const float* qs = q.data<float>();
  float* ys = y.data<float>();
  const float* kc = l.k.data();
  const float* vc = l.v.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = NH / KV;
  parallel_for(NH * n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(p0 + n));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t h = job / n, i = job % n, kvh = h / group, last = p0 + i;  // keys 0..last
      const float* qi = qs + (h * n + i) * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        const float* kj = kc + (j * KV + kvh) * hd;
        float d = 0.0f;
        for (int64_t e = 0; e < hd; ++e) d += qi[e] * kj[e];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      float z = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float w = std::exp(s[static_cast<size_t>(j)] - mx);
        z += w;
        const float* vj = vc + (j * KV + kvh) * hd;
        for (int64_t e = 0; e < hd; ++e) acc[static_cast<size_t>(e)] += w * vj[e];
      }
      float* yi = ys + i * NH * hd + h * hd;
      for (int64_t e = 0; e < hd; ++e) yi[e] = acc[static_cast<size_t>(e)] / z;
    }
  });
  return dtype == DType::f32 ? y : ops::cast(y, dtype);
}

// x (1, N, C): the rows of every sequence of the step, seqs[b] owning rows off .. off+n-1. The
// projections run once over all N rows; each sequence's heads, rope and attention run on its own
// rows against its own cache; the output projection runs over all rows again.
Tensor KVDecoder::attention(int64_t li, const Tensor& x, std::span<const Chunk> seqs, bool rows) {
  const Layer& l = layers_[static_cast<size_t>(li)];
  const int64_t NH = cfg_.n_head, KV = cfg_.kv_heads(), hd = cfg_.head_dim();
  const bool gpt2 = cfg_.layout == Layout::gpt2;
  // Rows off .. off+n-1 of t (1, N, F); the tensor itself when one sequence owns them all.
  auto rows_of = [&](const Tensor& t, const Chunk& c) {
    return seqs.size() == 1 ? t : ops::contiguous(ops::slice(t, 1, c.off, c.off + c.n));
  };
  std::vector<Tensor> ys;
  if (gpt2) {  // the module's split of c_attn: [q | k | v], each head a contiguous hd slice
    const Tensor qkv_all = linear(x, l.c_attn_w, l.c_attn_b, rows);  // (1, N, 3C)
    for (const Chunk& c : seqs) {
      const int64_t n = c.n;
      Tensor qkv = ops::reshape(rows_of(qkv_all, c), {1, n, 3, NH, hd});
      qkv = ops::contiguous(ops::permute(qkv, {2, 0, 3, 1, 4}));  // (3, 1, NH, n, hd)
      ys.push_back(c.dec->attend(c.dec->layers_[static_cast<size_t>(li)],
                                 ops::reshape(ops::slice(qkv, 0, 0, 1), {1, NH, n, hd}),
                                 ops::reshape(ops::slice(qkv, 0, 1, 2), {1, NH, n, hd}),
                                 ops::reshape(ops::slice(qkv, 0, 2, 3), {1, NH, n, hd}), c.p0,
                                 x.dtype()));
    }
  } else {
    const Tensor q_all = linear(x, l.q_w, l.q_b, rows);  // (1, N, NH*hd)
    const Tensor k_all = linear(x, l.k_w, l.k_b, rows);  // (1, N, KV*hd)
    const Tensor v_all = linear(x, l.v_w, l.v_b, rows);
    for (const Chunk& c : seqs) {
      auto heads = [&](const Tensor& t, int64_t h, const Tensor& norm_w) {
        Tensor r = ops::reshape(rows_of(t, c), {1, c.n, h, hd});
        if (norm_w.defined()) r = ops::rms_norm(r, norm_w, cfg_.norm_eps);
        return ops::contiguous(ops::transpose(r, 1, 2));  // (1, h, n, hd)
      };
      ys.push_back(
          c.dec->attend(c.dec->layers_[static_cast<size_t>(li)],
                        ops::rope(heads(q_all, NH, l.q_norm_w), rope_inv_freq_, rope_scale_, c.p0,
                                  cfg_.rope_interleaved),
                        ops::rope(heads(k_all, KV, l.k_norm_w), rope_inv_freq_, rope_scale_, c.p0,
                                  cfg_.rope_interleaved),
                        heads(v_all, KV, Tensor()), c.p0, x.dtype()));
    }
  }
  const Tensor y = ys.size() == 1 ? ys[0] : ops::concat(ys, 1);  // (1, N, NH*hd)
  return gpt2 ? linear(y, l.c_proj_w, l.c_proj_b, rows) : linear(y, l.o_w, l.o_b, rows);
}

Tensor KVDecoder::mlp(const Layer& l, const Tensor& x, bool rows) {
  if (cfg_.layout == Layout::gpt2)
    return linear(ops::gelu(linear(x, l.fc_w, l.fc_b, rows)), l.mlp_proj_w, l.mlp_proj_b, rows);
  return linear(ops::swiglu(linear(x, l.gate_w, l.gate_b, rows), linear(x, l.up_w, l.up_b, rows)),
                l.down_w, l.down_b, rows);
}

Tensor KVDecoder::forward(std::span<const int32_t> ids, bool all_logits) {
  const Chunk c{this, len_, static_cast<int64_t>(ids.size()), 0};
  return run(std::span(&c, 1), ids, all_logits);
}

Tensor KVDecoder::decode_batch(std::span<KVDecoder* const> decoders, std::span<const int32_t> ids) {
  DS_CHECK(!decoders.empty() && decoders.size() == ids.size(),
           "[generate] decode_batch needs one token per decoder ({} decoders, {} tokens)",
           decoders.size(), ids.size());
  std::vector<Chunk> seqs;
  for (size_t b = 0; b < decoders.size(); ++b) {
    KVDecoder* d = decoders[b];
    DS_CHECK(d->model_ == decoders[0]->model_,
             "[generate] decode_batch: every decoder must run the same model");
    for (size_t e = 0; e < b; ++e)
      DS_CHECK(decoders[e] != d, "[generate] decode_batch: decoder {} appears twice", b);
    seqs.push_back({d, d->len_, 1, static_cast<int64_t>(b)});
  }
  return decoders[0]->run(seqs, ids, /*all_logits=*/true);
}

Tensor KVDecoder::run(std::span<const Chunk> seqs, std::span<const int32_t> ids, bool all_logits) {
  const int64_t N = static_cast<int64_t>(ids.size());
  for (const Chunk& c : seqs) {
    DS_CHECK(c.n > 0, "[generate] forward needs at least one token");
    DS_CHECK(c.p0 + c.n <= cfg_.block_size,
             "[generate] {} cached + {} new tokens exceed the model's context of {} (block_size)",
             c.p0, c.n, cfg_.block_size);
  }
  for (int32_t id : ids)
    DS_CHECK(id >= 0 && id < cfg_.vocab_size,
             "[generate] token id {} outside the vocabulary [0, {})", id, cfg_.vocab_size);
  autograd::NoGradGuard no_grad;
  for (const Chunk& c : seqs) c.dec->reserve(c.p0 + c.n);
  // Decode rows (one token per sequence) take the row kernel: each row's result is what it would
  // be alone. A prefill chunk takes the GEMM path.
  const bool rows = seqs.size() > 1;
  const bool gpt2 = cfg_.layout == Layout::gpt2;
  std::vector<int64_t> idv(ids.begin(), ids.end());
  Tensor x = ops::embedding(wte_, Tensor::from_ints(idv, {1, N}));  // (1, N, C)
  if (gpt2) {
    std::vector<int64_t> pos;
    for (const Chunk& c : seqs)
      for (int64_t t = 0; t < c.n; ++t) pos.push_back(c.p0 + t);
    x = ops::add(x, ops::embedding(wpe_, Tensor::from_ints(pos, {N})));  // + (N, C)
  }
  for (int64_t li = 0; li < cfg_.n_layer; ++li) {
    const Layer& l = layers_[static_cast<size_t>(li)];
    Tensor h = gpt2 ? ops::layer_norm(x, l.norm1_w, l.norm1_b, cfg_.norm_eps)
                    : ops::rms_norm(x, l.norm1_w, cfg_.norm_eps);
    Tensor a = attention(li, h, seqs, rows);
    if (l.norm3_w.defined()) a = ops::rms_norm(a, l.norm3_w, cfg_.norm_eps);
    x = ops::add(x, a);
    h = gpt2 ? ops::layer_norm(x, l.norm2_w, l.norm2_b, cfg_.norm_eps)
             : ops::rms_norm(x, l.norm2_w, cfg_.norm_eps);
    Tensor m = mlp(l, h, rows);
    if (l.norm4_w.defined()) m = ops::rms_norm(m, l.norm4_w, cfg_.norm_eps);
    x = ops::add(x, m);
  }
  for (const Chunk& c : seqs) c.dec->len_ = c.p0 + c.n;
  x = gpt2 ? ops::layer_norm(x, normf_w_, normf_b_, cfg_.norm_eps)
           : ops::rms_norm(x, normf_w_, cfg_.norm_eps);
  if (!all_logits && N > 1) x = ops::slice(x, 1, N - 1, N);  // the LM head on the last row only
  const int64_t out_rows = x.size(1);
  return f32_contiguous(ops::reshape(linear(x, head_w_, {}, rows), {out_rows, cfg_.vocab_size}));
}

}  // namespace ds::serve
