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

// y (out) = W (out, in) x (in) + b: one row of x. A BLAS sgemm with M = 1 packs W on every call
// (OpenBLAS 0.3.21 has no GEMV forwarding), reading the weights twice; decode is bound by reading
// them once, so one position runs this row-parallel AVX2 dot product instead.
void gemv(const float* W, const float* x, const float* b, float* y, int64_t out, int64_t in) {
  parallel_for(out, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* w = W + r * in;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= in; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
      }
      a0 = _mm256_add_ps(a0, a1);
      __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
      s4 = _mm_hadd_ps(s4, s4);
      s4 = _mm_hadd_ps(s4, s4);
      float acc = _mm_cvtss_f32(s4);
      for (; i < in; ++i) acc += w[i] * x[i];
      y[r] = b ? acc + b[r] : acc;
    }
  });
}

// ops::linear, or gemv() when x is a single fp32 row and the weights are plain fp32.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {}) {
  const int64_t out = w.size(0), in = w.size(1);
  if (x.numel() != in || x.dtype() != DType::f32 || w.dtype() != DType::f32 || !w.is_contiguous() ||
      (b.defined() && (b.dtype() != DType::f32 || !b.is_contiguous())))
    return ops::linear(x, w, b);
  const Tensor xc = x.is_contiguous() ? x : ops::contiguous(x);
  Shape shape = x.shape();
  shape.back() = out;
  Tensor y = Tensor::empty(shape);
  gemv(w.data<float>(), xc.data<float>(), b.defined() ? b.data<float>() : nullptr, y.data<float>(),
       out, in);
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
      const std::string m = b + "mlp.";
      l.gate_w = req(m + "gate_proj.weight"), l.gate_b = opt(m + "gate_proj.bias");
      l.up_w = req(m + "up_proj.weight"), l.up_b = opt(m + "up_proj.bias");
      l.down_w = req(m + "down_proj.weight"), l.down_b = opt(m + "down_proj.bias");
    }
    layers_.push_back(std::move(l));
  }
  if (!gpt2) {
    rope_inv_freq_ = nn::rope_inv_freq(cfg_.rope_scaling, cfg_.rope_theta, cfg_.head_dim());
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

Tensor KVDecoder::attention(Layer& l, const Tensor& x, int64_t p0) {
  const int64_t n = x.size(1), NH = cfg_.n_head, KV = cfg_.kv_heads(), hd = cfg_.head_dim();
  const bool gpt2 = cfg_.layout == Layout::gpt2;
  Tensor q, k, v;  // q (1, NH, n, hd); k, v (1, KV, n, hd)
  if (gpt2) {      // the module's split of c_attn: [q | k | v], each head a contiguous hd slice
    Tensor qkv = ops::reshape(linear(x, l.c_attn_w, l.c_attn_b), {1, n, 3, NH, hd});
    qkv = ops::contiguous(ops::permute(qkv, {2, 0, 3, 1, 4}));  // (3, 1, NH, n, hd)
    q = ops::reshape(ops::slice(qkv, 0, 0, 1), {1, NH, n, hd});
    k = ops::reshape(ops::slice(qkv, 0, 1, 2), {1, NH, n, hd});
    v = ops::reshape(ops::slice(qkv, 0, 2, 3), {1, NH, n, hd});
  } else {
    auto heads = [&](const Tensor& w, const Tensor& b, int64_t h, const Tensor& norm_w) {
      Tensor t = ops::reshape(linear(x, w, b), {1, n, h, hd});
      if (norm_w.defined()) t = ops::rms_norm(t, norm_w, cfg_.norm_eps);
      return ops::contiguous(ops::transpose(t, 1, 2));  // (1, h, n, hd)
    };
    q = ops::rope(heads(l.q_w, l.q_b, NH, l.q_norm_w), rope_inv_freq_, rope_scale_, p0);
    k = ops::rope(heads(l.k_w, l.k_b, KV, l.k_norm_w), rope_inv_freq_, rope_scale_, p0);
    v = heads(l.v_w, l.v_b, KV, Tensor());
  }
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
    y = ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {1, n, NH * hd});
  } else {
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
    if (x.dtype() != DType::f32) y = ops::cast(y, x.dtype());
  }
  return gpt2 ? linear(y, l.c_proj_w, l.c_proj_b) : linear(y, l.o_w, l.o_b);
}

Tensor KVDecoder::mlp(const Layer& l, const Tensor& x) {
  if (cfg_.layout == Layout::gpt2)
    return linear(ops::gelu(linear(x, l.fc_w, l.fc_b)), l.mlp_proj_w, l.mlp_proj_b);
  return linear(ops::swiglu(linear(x, l.gate_w, l.gate_b), linear(x, l.up_w, l.up_b)), l.down_w,
                l.down_b);
}

Tensor KVDecoder::forward(std::span<const int32_t> ids, bool all_logits) {
  const int64_t n = static_cast<int64_t>(ids.size()), p0 = len_;
  DS_CHECK(n > 0, "[generate] forward needs at least one token");
  DS_CHECK(p0 + n <= cfg_.block_size,
           "[generate] {} cached + {} new tokens exceed the model's context of {} (block_size)", p0,
           n, cfg_.block_size);
  for (int32_t id : ids)
    DS_CHECK(id >= 0 && id < cfg_.vocab_size,
             "[generate] token id {} outside the vocabulary [0, {})", id, cfg_.vocab_size);
  autograd::NoGradGuard no_grad;
  reserve(p0 + n);
  const bool gpt2 = cfg_.layout == Layout::gpt2;
  std::vector<int64_t> idv(ids.begin(), ids.end());
  Tensor x = ops::embedding(wte_, Tensor::from_ints(idv, {1, n}));  // (1, n, C)
  if (gpt2) {
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = p0 + t;
    x = ops::add(x, ops::embedding(wpe_, Tensor::from_ints(pos, {n})));  // + (n, C)
  }
  for (auto& l : layers_) {
    Tensor h = gpt2 ? ops::layer_norm(x, l.norm1_w, l.norm1_b, cfg_.norm_eps)
                    : ops::rms_norm(x, l.norm1_w, cfg_.norm_eps);
    x = ops::add(x, attention(l, h, p0));
    h = gpt2 ? ops::layer_norm(x, l.norm2_w, l.norm2_b, cfg_.norm_eps)
             : ops::rms_norm(x, l.norm2_w, cfg_.norm_eps);
    x = ops::add(x, mlp(l, h));
  }
  len_ = p0 + n;
  x = gpt2 ? ops::layer_norm(x, normf_w_, normf_b_, cfg_.norm_eps)
           : ops::rms_norm(x, normf_w_, cfg_.norm_eps);
  if (!all_logits && n > 1) x = ops::slice(x, 1, n - 1, n);  // the LM head on the last row only
  const int64_t rows = x.size(1);
  return f32_contiguous(ops::reshape(linear(x, head_w_), {rows, cfg_.vocab_size}));
}

}  // namespace ds::serve
