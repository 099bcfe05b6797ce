#pragma once
// Token-by-token decoding of an encoder-decoder (BART / BlenderBot / T5, models::Seq2Seq) behind
// the decoder seam that serving uses (ds/models/incremental_decoder.h), and the logits processors
// of transformers' generate() for one target sequence.
//
//   auto model = std::make_shared<models::Seq2Seq>(cfg, false);  // + load_hf_seq2seq_weights
//   models::Seq2SeqDecoder dec(model);
//   Tensor first = dec.forward(source_ids);  // encodes the source, runs the decoder start: (1, V)
//   Tensor next = dec.forward({token});      // one target position against the caches
//   auto other = dec.fresh();                // another sequence over the same weights
//
// One decoder is one sequence: its source (the encoder output's keys and values, projected once
// per decoder layer: cross-attention's cache) and its target (self-attention's cache). The
// prompt is the SOURCE, not the start of the cache (encoder_decoder() is true):
//   forward(ids) on an empty decoder encodes ids (at most prompt_limit() tokens), feeds
//     decoder_start_token_id at target position 0 and returns its logits (1, V) (all_logits too:
//     the source positions have no logits); forward(ids) later feeds ids at target positions
//     length() .. one at a time ((n, V) with all_logits).
//   length() counts target positions (the decoder start and the tokens fed after it);
//     capacity_limit() is the longest target: max_position_embeddings for BART / BlenderBot, and
//     kT5MaxPositions for T5, whose relative positions have no bound (a cap on the caches).
//   truncate(0) forgets the source too (the next forward encodes a new one); truncate(n >= 1)
//     keeps the source and target positions 0 .. n-1.
//   cache_bytes(): the self-attention caches are allocated ahead, doubling (64 positions, 128,
//     ...) up to capacity_limit(), and written in place; the cross-attention caches hold the
//     source's positions. At most 4 * decoder_layers * capacity_limit() * NH * head_dim * 4
//     bytes (fp32), what ds_serve announces per sequence.
//   decode_batch: one target position for B decoders of one model (different source and target
//     lengths), through the same step as generate_greedy (Seq2Seq::decode_step): the projections,
//     FFNs and LM head run once over the B rows, per row (ops::linear_rows for fp32 weights),
//     attention per sequence. Row b equals decoders[b]->forward({ids[b]}) bit for bit.
// generate_greedy runs the same step with its batch as one group and GEMMs: its tokens equal this
// decoder's greedy tokens (the logits agree to float rounding; tests/test_serve_seq2seq.cpp).
//
// The model must outlive its decoders and not change while one holds a cache. Threading: the
// decoders of one model share its modules (the encoder's forward state): use them, and the model,
// from one thread at a time (serve::Scheduler's thread).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ds/models/incremental_decoder.h"
#include "ds/models/seq2seq.h"

namespace ds::models {

// The KV-cache decoder of an encoder-decoder (Seq2SeqParts::make_decoder's default).
std::unique_ptr<IncrementalDecoder> make_seq2seq_decoder(std::shared_ptr<Seq2Seq> model);

class Seq2SeqDecoder : public IncrementalDecoder {
 public:
  // T5's longest source and target (its relative position bias has no bound; the caches do).
  static constexpr int64_t kT5MaxPositions = 2048;

  explicit Seq2SeqDecoder(std::shared_ptr<Seq2Seq> model);

  Tensor forward(std::span<const int32_t> ids, bool all_logits = false) override;
  Tensor decode_batch(std::span<IncrementalDecoder* const> decoders,
                      std::span<const int32_t> ids) override;
  int64_t length() const override { return length_; }
  int64_t capacity_limit() const override;
  int64_t vocab_size() const override;
  void truncate(int64_t n) override;
  int64_t cache_bytes() const override;
  std::unique_ptr<IncrementalDecoder> fresh() const override;
  bool encoder_decoder() const override { return true; }
  int64_t prompt_limit() const override;
  int32_t decoder_start_token() const override;

  // The most cache_bytes() can be: self- and cross-attention keys and values of capacity_limit()
  // positions each, fp32 (ds_serve's "KV cache up to ... per sequence").
  int64_t cache_bytes_limit() const;
  int64_t source_length() const { return source_length_; }  // 0 while empty
  const Seq2Seq& model() const { return *model_; }

 private:
  // One target position for each decoder (ids[b] at decoders[b]'s length()): logits (B, V) fp32
  // on the host.
  Tensor step(std::span<Seq2SeqDecoder* const> decoders, std::span<const int32_t> ids,
              const Tensor& memory);

  std::shared_ptr<Seq2Seq> model_;
  std::vector<Seq2Seq::LayerCache> caches_;  // one per decoder layer
  int64_t length_ = 0;                       // target positions cached
  int64_t source_length_ = 0;
};

// transformers' logits processors of greedy decoding and sampling for one target sequence, as
// Seq2Seq::generate_greedy applies them (NoRepeatNGram, EncoderNoRepeatNGram, MinLength,
// ForcedEOSToken; src/models/seq2seq_processors.h): ds_serve applies them to every step's logits
// before sampling.
struct Seq2SeqProcessors {
  int64_t max_new_tokens = 20;  // the target's length is at most 1 + max_new_tokens
  int64_t min_length = 0;       // eos banned while the target (decoder start included) is shorter
  int64_t no_repeat_ngram_size = 0;
  int64_t encoder_no_repeat_ngram_size = 0;
  int64_t eos = -1;         // -1 = none
  int64_t forced_eos = -1;  // the only token allowed at the last step; -1 = none
  int64_t forced_bos = -1;  // the only token allowed at the first step; -1 = none
  int64_t vocab_size = 0;

  // A generation's settings (BeamOptions' processors, -2 ids resolved from config) for at most
  // max_new_tokens tokens.
  static Seq2SeqProcessors of(const BeamOptions& opt, const Seq2SeqConfig& config,
                              int64_t max_new_tokens);
  // target: the decoder start and the tokens generated so far; source: the source ids; logits (V)
  // of the next token, banned ones set to -inf in place.
  void apply(std::span<const int32_t> source, std::span<const int32_t> target,
             std::span<float> logits) const;
};

}  // namespace ds::models
