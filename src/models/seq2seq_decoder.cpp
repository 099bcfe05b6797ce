// An encoder-decoder behind the incremental decoder seam (ds/models/seq2seq_decoder.h): the
// encoder once per sequence, then Seq2Seq::decode_step, one group per sequence.
#include "ds/models/seq2seq_decoder.h"

#include <algorithm>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "seq2seq_processors.h"
#include "seq2seq_util.h"

namespace ds::models {


Seq2SeqDecoder::Seq2SeqDecoder(std::shared_ptr<Seq2Seq> model) : model_(std::move(model)) {
  DS_CHECK(model_ != nullptr, "[generate] Seq2SeqDecoder needs a model");
}

std::unique_ptr<IncrementalDecoder> Seq2SeqDecoder::fresh() const {
  return std::make_unique<Seq2SeqDecoder>(model_);
}

int64_t Seq2SeqDecoder::capacity_limit() const {
  const Seq2SeqConfig& c = model_->config();
  return c.is_t5() ? kT5MaxPositions : c.max_positions;
}

int64_t Seq2SeqDecoder::prompt_limit() const {
  return capacity_limit();  // the encoder's positions: the same table size as the decoder's
}

int64_t Seq2SeqDecoder::vocab_size() const {
  return model_->config().vocab_size;
}

int32_t Seq2SeqDecoder::decoder_start_token() const {
  return static_cast<int32_t>(model_->config().decoder_start_token_id);
}

void Seq2SeqDecoder::truncate(int64_t n) {
  DS_CHECK(n >= 0 && n <= length_, "[generate] cannot truncate the cache of {} positions to {}",
           length_, n);
  if (n == 0) {  // the source goes too: the next forward encodes a new one
    caches_.clear();
    length_ = source_length_ = 0;
    return;
  }
  length_ = n;  // the self-attention caches keep their size: positions >= n are not read
}

int64_t Seq2SeqDecoder::cache_bytes() const {
  int64_t bytes = 0;
  for (const Seq2Seq::LayerCache& c : caches_)
    for (const Tensor* t : {&c.self_k, &c.self_v, &c.cross_k, &c.cross_v})
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

int64_t Seq2SeqDecoder::cache_bytes_limit() const {
  const Seq2SeqConfig& c = model_->config();
  const int64_t width = c.is_t5() ? c.decoder_heads * c.d_kv : c.d_model;  // NH * head_dim
  // The caches take the weights' dtype (a bf16 model's keys and values are bf16).
  const int64_t bytes = static_cast<int64_t>(dtype_size(model_->shared_->weight().dtype()));
  return 4 * c.decoder_layers * capacity_limit() * width * bytes;
}

Tensor Seq2SeqDecoder::step(std::span<Seq2SeqDecoder* const> decoders, std::span<const int32_t> ids,
                            const Tensor& memory) {
  const Seq2SeqConfig& c = model_->config();
  const int64_t B = static_cast<int64_t>(decoders.size());
  std::vector<Seq2Seq::StepGroup> groups;
  std::vector<int64_t> tokens;
  for (int64_t b = 0; b < B; ++b) {
    Seq2SeqDecoder& d = *decoders[static_cast<size_t>(b)];
    const int32_t id = ids[static_cast<size_t>(b)];
    DS_CHECK(id >= 0 && id < c.vocab_size, "[generate] token id {} outside the vocabulary [0, {})",
             id, c.vocab_size);
    DS_CHECK(
        d.length_ + 1 <= d.capacity_limit(),
        "[generate] {} cached + 1 new target positions exceed the model's longest target of {}",
        d.length_, d.capacity_limit());
    groups.push_back({&d.caches_, 1, d.length_, memory, {}, d.capacity_limit()});
    tokens.push_back(id);
  }
  autograd::NoGradGuard no_grad;
  detail::EvalMode eval(*model_);
  const Tensor ids_t =
      Tensor::from_ints(tokens, {B, 1}).to(model_->shared_->weight().device());
  const Tensor lg = model_->decode_step(ids_t, groups, /*row_kernel=*/true);  // (B, 1, V)
  for (Seq2SeqDecoder* d : decoders) ++d->length_;
  Tensor out = ops::reshape(lg, {B, c.vocab_size});
  if (out.dtype() != DType::f32) out = out.to(DType::f32);
  out = ops::contiguous(out);
  if (out.device().is_cpu()) return out;
  Tensor host = Tensor::empty(out.shape(), out.dtype(), kCPU);
  host.copy_from(out);
  return host;
}

Tensor Seq2SeqDecoder::forward(std::span<const int32_t> ids, bool all_logits) {
  DS_CHECK(!ids.empty(), "[generate] forward needs at least one token");
  Seq2SeqDecoder* self = this;
  if (length_ == 0) {  // the source: encoded once, then the decoder start token
    const Seq2SeqConfig& c = model_->config();
    const int64_t S = static_cast<int64_t>(ids.size());
    DS_CHECK(S <= prompt_limit(),
             "[generate] the source ({} tokens) exceeds the model's longest source of {} tokens", S,
             prompt_limit());
    std::vector<int64_t> src;
    for (int32_t id : ids) {
      DS_CHECK(id >= 0 && id < c.vocab_size,
               "[generate] token id {} outside the vocabulary [0, {})", id, c.vocab_size);
      src.push_back(id);
    }
    Tensor memory;  // (1, S, C)
    {
      autograd::NoGradGuard no_grad;
      detail::EvalMode eval(*model_);
      memory = model_->encode(
          Tensor::from_ints(src, {1, S}).to(model_->shared_->weight().device()));
    }
    caches_.clear();
    source_length_ = S;
    const int32_t start = decoder_start_token();
    return step(std::span(&self, 1), std::span(&start, 1), memory);
  }
  std::vector<Tensor> rows;
  for (int32_t id : ids) rows.push_back(step(std::span(&self, 1), std::span(&id, 1), Tensor()));
  if (!all_logits || rows.size() == 1) return rows.back();
  return ops::concat(rows, 0);  // (n, V)
}

Tensor Seq2SeqDecoder::decode_batch(std::span<IncrementalDecoder* const> decoders,
                                    std::span<const int32_t> ids) {
  DS_CHECK(!decoders.empty() && decoders.size() == ids.size(),
           "[generate] decode_batch needs one token per decoder ({} decoders, {} tokens)",
           decoders.size(), ids.size());
  std::vector<Seq2SeqDecoder*> decs;
  for (size_t b = 0; b < decoders.size(); ++b) {
    auto* d = dynamic_cast<Seq2SeqDecoder*>(decoders[b]);
    DS_CHECK(d != nullptr && d->model_ == model_,
             "[generate] decode_batch: every decoder must run the same model (decoder {} does not)",
             b);
    DS_CHECK(std::find(decs.begin(), decs.end(), d) == decs.end(),
             "[generate] decode_batch: decoder {} appears twice", b);
    DS_CHECK(d->length_ > 0,
             "[generate] decode_batch: decoder {} has no source yet (its first forward encodes the "
             "prompt)",
             b);
    decs.push_back(d);
  }
  return step(decs, ids, Tensor());
}

Seq2SeqProcessors Seq2SeqProcessors::of(const BeamOptions& opt, const Seq2SeqConfig& config,
                                        int64_t max_new_tokens) {
  Seq2SeqProcessors p;
  p.max_new_tokens = max_new_tokens;
  p.min_length = opt.min_length;
  p.no_repeat_ngram_size = opt.no_repeat_ngram_size;
  p.encoder_no_repeat_ngram_size = opt.encoder_no_repeat_ngram_size;
  p.eos = opt.eos_token_id == -2 ? config.eos_token_id : opt.eos_token_id;
  p.forced_eos =
      opt.forced_eos_token_id == -2 ? config.forced_eos_token_id : opt.forced_eos_token_id;
  p.forced_bos = opt.forced_bos_token_id;
  p.vocab_size = config.vocab_size;
  return p;
}

void Seq2SeqProcessors::apply(std::span<const int32_t> source, std::span<const int32_t> target,
                              std::span<float> logits) const {
  DS_CHECK(static_cast<int64_t>(logits.size()) == vocab_size,
           "[generate] the logits have {} entries, the vocabulary {}", logits.size(), vocab_size);
  detail::LogitsProcessors p;
  p.vocab_size = vocab_size;
  p.max_length = 1 + max_new_tokens;
  p.min_length = min_length;
  p.eos = eos;
  p.forced_eos = forced_eos;
  p.forced_bos = forced_bos;
  p.no_repeat_ngram_size = no_repeat_ngram_size;
  p.encoder_no_repeat_ngram_size = encoder_no_repeat_ngram_size;
  p.apply(std::vector<int64_t>(target.begin(), target.end()),
          std::vector<int64_t>(source.begin(), source.end()), logits.data());
}

std::unique_ptr<IncrementalDecoder> make_seq2seq_decoder(std::shared_ptr<Seq2Seq> model) {
  return std::make_unique<Seq2SeqDecoder>(std::move(model));
}

}  // namespace ds::models
