#pragma once
// transformers' logits processors for encoder-decoder generation, shared by greedy decoding
// (seq2seq.cpp) and beam search (seq2seq_beam.cpp), and the eval-mode scope both run in.
// Internal to src/models: not a public header.
//
// apply() works on one hypothesis's scores (V values: logits for greedy, log-probabilities for
// beam search), setting banned tokens to -inf in place:
//   no_repeat_ngram_size n: a token completing an n-gram the hypothesis already holds
//     (NoRepeatNGramLogitsProcessor);
//   encoder_no_repeat_ngram_size n: a token completing an n-gram of the source row, padding
//     included (EncoderNoRepeatNGramLogitsProcessor);
//   min_length: eos while the hypothesis (decoder start included) is shorter
//     (MinLengthLogitsProcessor);
//   forced_bos: everything but forced_bos at length 1, the first generated token
//     (ForcedBOSTokenLogitsProcessor);
//   forced_eos: everything but forced_eos at length max_length - 1 (ForcedEOSTokenLogitsProcessor,
//     last, so it wins).
#include <cstdint>
#include <limits>
#include <vector>

#include "ds/nn/module.h"

namespace ds::models::detail {

// Eval mode (no dropout) for the scope of a generation, the previous mode restored on the way out
// (also when it throws).
class EvalMode {
 public:
  explicit EvalMode(nn::Module& m) : m_(m), was_(m.is_training()) { m_.train(false); }
  ~EvalMode() { m_.train(was_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  nn::Module& m_;
  bool was_;
};

struct LogitsProcessors {
  int64_t vocab_size = 0;
  int64_t max_length = 0;  // decoder start + max_new_tokens
  int64_t min_length = 0;
  int64_t eos = -1;
  int64_t forced_eos = -1;
  int64_t forced_bos = -1;
  int64_t no_repeat_ngram_size = 0;
  int64_t encoder_no_repeat_ngram_size = 0;

  template <class T>
  void apply(const std::vector<int64_t>& seq, const std::vector<int64_t>& source, T* scores) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    ban_ngrams(seq, seq, no_repeat_ngram_size, scores);
    ban_ngrams(seq, source, encoder_no_repeat_ngram_size, scores);
    const int64_t cur_len = static_cast<int64_t>(seq.size());
    if (eos >= 0 && cur_len < min_length) scores[eos] = kNegInf;
    if (forced_bos >= 0 && cur_len == 1)
      for (int64_t v = 0; v < vocab_size; ++v) scores[v] = v == forced_bos ? T(0) : kNegInf;
    if (forced_eos >= 0 && cur_len == max_length - 1)
      for (int64_t v = 0; v < vocab_size; ++v) scores[v] = v == forced_eos ? T(0) : kNegInf;
  }

 private:
  // Tokens that would complete an n-gram of `from` starting with the last n - 1 tokens of seq.
  template <class T>
  static void ban_ngrams(const std::vector<int64_t>& seq, const std::vector<int64_t>& from,
                         int64_t n, T* scores) {
    const int64_t len = static_cast<int64_t>(seq.size());
    if (n <= 0 || len + 1 < n) return;
    const int64_t start = len + 1 - n;  // the prefix is seq[start, len): n - 1 tokens
    for (int64_t w = 0; w + n <= static_cast<int64_t>(from.size()); ++w) {
      bool match = true;
      for (int64_t i = 0; i < n - 1 && match; ++i)
        match = from[static_cast<size_t>(w + i)] == seq[static_cast<size_t>(start + i)];
      if (match) scores[from[static_cast<size_t>(w + n - 1)]] = -std::numeric_limits<T>::infinity();
    }
  }
};

}  // namespace ds::models::detail
