#include "ds/models/gpt_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/nn/decode.h"
#include "ds/ops/ops.h"

namespace ds::models {

// What every decoder of one model shares: the model and where it lives.
struct GPTDecoder::Weights {
  std::shared_ptr<const GPT> model;
  GPTConfig cfg;
  Device device;
  // The KV caches': the weights' when bf16 (a bf16 model decodes with bf16 caches, read as they
  // are by decode_attention), else fp32.
  DType cache_dtype = DType::f32;
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

}  // namespace

GPTDecoder::GPTDecoder(std::shared_ptr<const GPT> model) {
  auto w = std::make_shared<Weights>();
  w->model = std::move(model);
  w->cfg = w->model->config();
  const GPT& m = *w->model;
  DS_CHECK(m.is_whole(),
           "[generate] decoding needs the whole model; this pipeline stage holds layers [{}, {})",
           m.pipe_range().begin, m.pipe_range().end);
  DS_CHECK(!m.tensor_parallel() || m.tensor_parallel()->size() == 1,
           "[generate] decoding runs the whole model on one rank; this one is tensor parallel "
           "over {} ranks (gather it with nn::gather_full or export it first)",
           m.tensor_parallel() ? m.tensor_parallel()->size() : 1);
  const auto params = m.named_parameters();
  DS_CHECK(!params.empty(), "[generate] the model has no parameters");
  w->device = params.front().second.device();
  if (params.front().second.dtype() == DType::bf16) w->cache_dtype = DType::bf16;
  weights_ = std::move(w);
  k_.resize(static_cast<size_t>(weights_->cfg.n_layer));
  v_.resize(static_cast<size_t>(weights_->cfg.n_layer));
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
  ids_.resize(static_cast<size_t>(n));
}

int64_t GPTDecoder::cache_bytes() const {
  const GPTConfig& c = weights_->cfg;
  return 2 * c.n_layer * capacity_ * c.kv_heads() * c.head_dim() *
         static_cast<int64_t>(dtype_size(weights_->cache_dtype));
}

void GPTDecoder::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const GPTConfig& c = weights_->cfg;
  const int64_t cap = std::min(c.block_size, std::max({positions, capacity_ * 2, int64_t{64}}));
  for (auto* caches : {&k_, &v_})
    for (Tensor& t : *caches) {  // position-major: the cached rows keep their place
      Tensor grown =
          Tensor::empty({cap, c.kv_heads(), c.head_dim()}, weights_->cache_dtype, weights_->device);
      if (len_ > 0) ops::slice(grown, 0, 0, len_).copy_from(ops::slice(t, 0, 0, len_));
      t = grown;
    }
  capacity_ = cap;
}

bool GPTDecoder::switches_rope_table(int64_t p0, int64_t n) const {
  const nn::RopeScaling& s = weights_->cfg.rope_scaling;
  return p0 > 0 && !nn::rope_uses_long_table(s, p0) && nn::rope_uses_long_table(s, p0 + n);
}

Tensor GPTDecoder::recompute(std::span<const int32_t> ids, bool all_logits) {
  std::vector<int32_t> all(ids_.begin(), ids_.begin() + len_);
  all.insert(all.end(), ids.begin(), ids.end());
  const int64_t total = static_cast<int64_t>(all.size()), n = static_cast<int64_t>(ids.size());
  const Chunk c{this, 0, total, 0};
  const Tensor logits = run(std::span(&c, 1), all, all_logits);  // (total, V) or (1, V)
  return all_logits ? ops::slice(logits, 0, total - n, total).contiguous() : logits;
}

Tensor GPTDecoder::forward(std::span<const int32_t> ids, bool all_logits) {
  if (switches_rope_table(len_, static_cast<int64_t>(ids.size())))
    return recompute(ids, all_logits);
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
  }
  // A sequence whose step switches LongRoPE's table is recomputed alone; the rest step together.
  std::vector<int32_t> step_ids;
  std::vector<Tensor> alone(decoders.size());
  for (size_t b = 0; b < decoders.size(); ++b) {
    auto* d = static_cast<GPTDecoder*>(decoders[b]);
    if (d->switches_rope_table(d->len_, 1)) {
      alone[b] = d->recompute(ids.subspan(b, 1), /*all_logits=*/true);  // (1, V)
      continue;
    }
    seqs.push_back({d, d->len_, 1, static_cast<int64_t>(step_ids.size())});
    step_ids.push_back(ids[b]);
  }
  if (seqs.size() == decoders.size()) return run(seqs, ids, /*all_logits=*/true);
  const Tensor stepped = seqs.empty() ? Tensor() : run(seqs, step_ids, /*all_logits=*/true);
  Tensor out = Tensor::empty({static_cast<int64_t>(decoders.size()), vocab_size()}, DType::f32);
  for (int64_t b = 0, r = 0; b < static_cast<int64_t>(decoders.size()); ++b) {
    const Tensor& row = alone[static_cast<size_t>(b)];
    ops::slice(out, 0, b, b + 1).copy_from(row.defined() ? row : ops::slice(stepped, 0, r, r + 1));
    r += row.defined() ? 0 : 1;
  }
  return out;
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
  const GPT& model = *w.model;
  // Decode rows (one token per sequence) take the row kernel: each row's result is what it would
  // be alone. A prefill chunk takes the GEMM path.
  const bool rows = seqs.size() > 1;
  std::vector<int64_t> idv(ids.begin(), ids.end()), pos;
  for (const Chunk& c : seqs)
    for (int64_t t = 0; t < c.n; ++t) pos.push_back(c.p0 + t);
  Tensor x = model.decode_embed(on(Tensor::from_ints(idv, {1, N}), w.device), pos);  // (1, N, C)
  std::vector<nn::DecodeSeq> layer_seqs(seqs.size());
  for (int64_t li = 0; li < cfg.n_layer; ++li) {
    for (size_t b = 0; b < seqs.size(); ++b) {
      const Chunk& c = seqs[b];
      layer_seqs[b] = {c.p0, c.n, c.off, c.dec->k_[static_cast<size_t>(li)],
                       c.dec->v_[static_cast<size_t>(li)]};
    }
    x = model.blocks()[static_cast<size_t>(li)]->decode(x, nn::DecodeStep{layer_seqs, rows});
  }
  for (const Chunk& c : seqs) {
    c.dec->len_ = c.p0 + c.n;
    c.dec->ids_.resize(static_cast<size_t>(c.p0));
    c.dec->ids_.insert(c.dec->ids_.end(), ids.begin() + c.off, ids.begin() + c.off + c.n);
  }
  x = model.decode_final_norm(x);
  if (!all_logits && N > 1) x = ops::slice(x, 1, N - 1, N);  // the LM head on the last row only
  const int64_t out_rows = x.size(1);
  const Tensor logits =
      f32_contiguous(ops::reshape(model.decode_head(x, rows), {out_rows, cfg.vocab_size}));
  return on(logits, kCPU);
}

std::unique_ptr<IncrementalDecoder> make_gpt_decoder(std::shared_ptr<const GPT> model) {
  return std::make_unique<GPTDecoder>(std::move(model));
}

}  // namespace ds::models
