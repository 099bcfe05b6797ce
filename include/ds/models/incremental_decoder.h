#pragma once
// Token-by-token inference of a language model with a key/value cache: what serving and
// generation need from a model family, whatever its blocks are.
//
//   std::unique_ptr<models::IncrementalDecoder> dec = models::make_decoder(model);  // registry
//   Tensor last = dec->forward(prompt_ids);         // prefill: fills the cache -> (1, V) logits
//   Tensor next = dec->forward({token});            // one position against the cache
//   auto other = dec->fresh();                      // another sequence over the same weights
//   Tensor rows = dec->decode_batch({dec.get(), other.get()}, {ta, tb});  // (2, V): one step
//
// One decoder is one sequence: its cache and position. decode_batch is continuous batching's step:
// sequences of different lengths, each with its own cache, advance one token together, the
// weights read once for all of them; row b equals decoders[b]->forward({ids[b]}) bit for bit
// where the family says so (the GPT decoder does for fp32 weights).
//
// Encoder-decoders (BART, BlenderBot, T5) have models::Seq2SeqDecoder
// (ds/models/seq2seq_decoder.h): there the prompt is the source, not the start of the cache
// (encoder_decoder() below).
//
// Families make their decoder through the registry (models::Family::make_decoder, family.h); the
// decoders of one family share its weights with the model (no copy), which must outlive them and
// not change while a decoder holds a cache (reset() after loading weights).
//
// Threading: a decoder is used by one thread at a time; decode_batch uses every decoder it is
// given.
#include <cstdint>
#include <memory>
#include <span>

#include "ds/core/tensor.h"

namespace ds::models {

class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;

  // Runs ids at positions length() .. length() + n - 1, appends their keys and values to the cache
  // and returns fp32 logits (n, V) when all_logits, else (1, V) of the last position, on the host.
  // Throws "[generate] ..." when ids is empty, holds an id outside the vocabulary, or the cache
  // would exceed capacity_limit().
  virtual Tensor forward(std::span<const int32_t> ids, bool all_logits = false) = 0;
  // One step of B sequences: ids[b] at position decoders[b]->length(); -> fp32 logits (B, V) on the
  // host. decoders are distinct decoders of this one's kind over this one's model (this one among
  // them or not). Throws "[generate] ..." naming the bad entry.
  virtual Tensor decode_batch(std::span<IncrementalDecoder* const> decoders,
                              std::span<const int32_t> ids) = 0;

  virtual int64_t length() const = 0;          // cached positions
  virtual int64_t capacity_limit() const = 0;  // the longest sequence (the model's context)
  virtual int64_t vocab_size() const = 0;      // V, the logits' width
  // Forget positions >= n (n <= length()): reuse a common prompt prefix, or start over with 0.
  virtual void truncate(int64_t n) = 0;
  void reset() { truncate(0); }
  virtual int64_t cache_bytes() const = 0;  // what the cache holds now
  // An empty decoder over the same model and weights (another sequence).
  virtual std::unique_ptr<IncrementalDecoder> fresh() const = 0;

  // What the prompt is. Decoder-only (false): the prompt is the sequence's first positions, the
  // generated tokens follow it in the cache, both within capacity_limit(). Encoder-decoders
  // (models::Seq2SeqDecoder, true): the first forward() on an empty decoder encodes the prompt as
  // the SOURCE (at most prompt_limit() tokens, not cache positions) and feeds
  // decoder_start_token(); the cache then holds the target only (the decoder start and the tokens
  // fed after it), which length(), capacity_limit() and truncate() count.
  virtual bool encoder_decoder() const { return false; }
  virtual int64_t prompt_limit() const { return capacity_limit(); }  // the longest prompt
  virtual int32_t decoder_start_token() const { return -1; }         // encoder-decoders only
};

}  // namespace ds::models
