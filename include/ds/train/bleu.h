#pragma once
// Corpus BLEU as sacreBLEU computes it with its defaults (sacrebleu.corpus_bleu(hyps, [refs])):
// tokenize "13a" (mteval-v13a's tokenizer), smooth "exp", no lowercasing, n-grams up to 4,
// effective_order off. The seq2seq trainer (ds/train/seq2seq_trainer.h) reports it for its
// generations; tests/fixtures/bleu holds sacrebleu's scores for tricky cases
// (tests/fixtures/generators/gen_bleu_fixture.py).
//
//   train::BleuScore s = train::corpus_bleu({"the cat sat"}, {{"the cat sat down"}});
//   s.score;  // 0-100, sacrebleu's BLEUScore.score
//
// Tokenization (tokenize_13a): "<skipped>" and "-\n" removed, "\n" -> " ", the entities &quot;
// &amp; &lt; &gt; unescaped, then sacrebleu's four regular expressions (ASCII punctuation and
// symbols split off; "." and "," split off unless between digits; "-" after a digit split off),
// then split on whitespace (ASCII and the Unicode spaces Python's str.split() knows) and joined
// by single spaces. Each sentence is right-stripped first, as sacrebleu does.
//
// Statistics: per sentence, clipped n-gram matches against the references (a count is clipped
// to its largest count in any one reference), hypothesis n-grams, hypothesis length and the
// closest reference length (ties: the shorter); summed over the corpus. Brevity penalty
// exp(1 - r / c) when c < r (0 when c = 0). With no match at all the score is 0. Precisions:
// matches / total, and for an order with no match (exp smoothing) 1 / (2^k * total) for the k-th
// such order; orders with no hypothesis n-gram end the product (with their precision 0, which
// sacrebleu's log floor turns into a score of 0).
//
// Thread safety: pure functions.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds::train {

// sacrebleu's Tokenizer13a (see the top): the tokens joined by single spaces.
std::string tokenize_13a(std::string_view line);

struct BleuScore {
  double score = 0.0;                  // 0-100
  std::array<double, 4> precisions{};  // percent, after smoothing
  std::array<int64_t, 4> correct{}, total{};
  double brevity_penalty = 0.0;
  int64_t sys_len = 0, ref_len = 0;
};

// hypotheses[i] against references[i] (one or more strings). Throws "[bleu] ..." when the counts
// differ or a hypothesis has no reference.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references);

}  // namespace ds::train
