// Beam search for models::Seq2Seq (ds/models/seq2seq.h): transformers' _beam_search (5.x) with
// the logits processors BART / BlenderBot generation configs use (min_length,
// no_repeat_ngram_size, encoder_no_repeat_ngram_size, forced_eos_token_id), on the host over the
// model's logits. Scores are kept in double; transformers keeps float32, so hypotheses whose
// scores tie within float32 rounding may be ordered differently.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/seq2seq.h"
#include "seq2seq_processors.h"
#include "seq2seq_util.h"

namespace ds::models {


namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kBig = 1.0e9;  // transformers' -1e9 masks

// Rows `rows` of t along dim 0, in that order (a gather built from slices; no gradient here).
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<Tensor> parts;
  parts.reserve(rows.size());
  for (int64_t r : rows) parts.push_back(ops::slice(t, 0, r, r + 1));
  return ops::contiguous(ops::concat(parts, 0));
}

// cache (N, ...) with row r replaced by row idx[r] (idx (N) i64 on cache's device): one gather
// into a tensor of the same size, whose block the next layer's gather reuses, so reordering the
// beams costs no memory beyond one layer's cache however long the search runs.
Tensor gather_rows(const Tensor& cache, const Tensor& idx) {
  const Shape shape = cache.shape();
  return ops::reshape(ops::embedding(ops::reshape(cache, {shape[0], -1}), idx), shape);
}

bool is_identity(const std::vector<int64_t>& rows) {
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r] != static_cast<int64_t>(r)) return false;
  return true;
}

// Indices of the k largest values, largest first; ties keep the lower index first.
std::vector<int64_t> top_k(const std::vector<double>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int64_t>(k, static_cast<int64_t>(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)] ||
           (v[static_cast<size_t>(a)] == v[static_cast<size_t>(b)] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

struct Hyp {
  std::vector<int64_t> tokens;  // decoder start, then the generated ids
  double score = 0.0;
};

// The search's settings, resolved from BeamOptions and the model's config.
struct BeamSettings {
  int64_t NB = 1, V = 0, K = 2, max_length = 0, eos = -1;
  bool stop_early = false, never = false;
  double lpen = 1.0;
};

// One batch row's beams: the running hypotheses (best first), the finished list (best first),
// which finished entries are real, and whether the row can still improve.
struct BeamRow {
  std::vector<Hyp> running, finished;
  std::vector<bool> done;
  bool improvable = true;
};

// A new hypothesis proposed at this step: its source beam, and whether it ends here (eos or the
// length limit).
struct Candidate {
  Hyp hyp;
  int64_t source = 0;
  bool hit = false;
};

// Accumulated log-probabilities of all NB * V continuations of `row`'s beams (the log-softmax of
// their logits, processors applied, plus each beam's score). logits: (NB, V) of this row.
std::vector<double> continuation_scores(const BeamRow& row, const float* logits,
                                        const std::vector<int64_t>& source,
                                        const detail::LogitsProcessors& processors,
                                        const BeamSettings& st) {
  std::vector<double> acc(static_cast<size_t>(st.NB * st.V));
  for (int64_t j = 0; j < st.NB; ++j) {
    const float* lg = logits + j * st.V;
    double* lp = acc.data() + j * st.V;
    double m = kNegInf;
    for (int64_t v = 0; v < st.V; ++v) m = std::max(m, static_cast<double>(lg[v]));
    double sum = 0.0;
    for (int64_t v = 0; v < st.V; ++v) sum += std::exp(lg[v] - m);
    const double lse = m + std::log(sum);
    for (int64_t v = 0; v < st.V; ++v) lp[v] = lg[v] - lse;
    processors.apply(row.running[static_cast<size_t>(j)].tokens, source, lp);
    for (int64_t v = 0; v < st.V; ++v) lp[v] += row.running[static_cast<size_t>(j)].score;
  }
  return acc;
}

// The finished list merged with the first NB candidates that just finished (transformers'
// _update_finished_beams), scores length-normalised by the generated length.
void merge_finished(BeamRow& row, const std::vector<Candidate>& cand, int64_t cur_len,
                    const BeamSettings& st) {
  const bool full =
      st.stop_early && std::all_of(row.done.begin(), row.done.end(), [](bool d) { return d; });
  std::vector<Hyp> merged = row.finished;
  std::vector<bool> merged_done = row.done;
  const double len_pen = std::pow(static_cast<double>(cur_len), st.lpen);
  for (size_t i = 0; i < cand.size(); ++i) {
    const bool just = cand[i].hit && static_cast<int64_t>(i) < st.NB;
    double s = cand[i].hyp.score / len_pen;
    if (full) s -= kBig;
    if (!row.improvable) s -= kBig;
    if (!just) s -= kBig;
    merged.push_back(cand[i].hyp);
    merged.back().score = s;
    merged_done.push_back(just);
  }
  std::vector<double> scores;
  for (const Hyp& h : merged) scores.push_back(h.score);
  row.finished.clear();
  row.done.clear();
  for (int64_t i : top_k(scores, st.NB)) {
    row.finished.push_back(merged[static_cast<size_t>(i)]);
    row.done.push_back(merged_done[static_cast<size_t>(i)]);
  }
}

// One step of row b: its top K candidates, the next running beams (the best that did not finish;
// their source hypotheses appended to `sources`) and the finished list. Returns whether every
// candidate finished.
bool step_row(BeamRow& row, int64_t b, const float* logits, const std::vector<int64_t>& source,
              const detail::LogitsProcessors& processors, const BeamSettings& st,
              int64_t cur_len, std::vector<int64_t>& sources) {
  const std::vector<double> acc = continuation_scores(row, logits, source, processors, st);
  std::vector<Candidate> cand;
  bool all_hit = true;
  for (int64_t idx : top_k(acc, st.K)) {
    const int64_t j = idx / st.V, tok = idx % st.V;
    Candidate c{row.running[static_cast<size_t>(j)], b * st.NB + j,
                cur_len + 1 >= st.max_length || (st.eos >= 0 && tok == st.eos)};
    c.hyp.tokens.push_back(tok);
    c.hyp.score = acc[static_cast<size_t>(idx)];
    all_hit = all_hit && c.hit;
    cand.push_back(std::move(c));
  }
  std::vector<double> keep(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) keep[i] = cand[i].hyp.score - (cand[i].hit ? kBig : 0.0);
  std::vector<Hyp> next;
  for (int64_t i : top_k(keep, st.NB)) {
    next.push_back(cand[static_cast<size_t>(i)].hyp);
    next.back().score = keep[static_cast<size_t>(i)];
    sources.push_back(cand[static_cast<size_t>(i)].source);
  }
  merge_finished(row, cand, cur_len, st);
  row.running = std::move(next);
  return all_hit;
}

// transformers' _check_early_stop_heuristic for one row after cur_len tokens; returns whether
// the row can still improve.
bool still_improvable(BeamRow& row, int64_t cur_len, const BeamSettings& st) {
  const double best_len = st.never && st.lpen > 0.0 ? static_cast<double>(st.max_length - 1)
                                                     : static_cast<double>(cur_len - 1);
  const double best_running = row.running[0].score / std::pow(best_len, st.lpen);
  double worst = std::numeric_limits<double>::infinity();
  for (const auto& h : row.finished) worst = std::min(worst, h.score);
  bool better = false;
  for (size_t j = 0; j < row.done.size(); ++j)
    better = better || best_running > (row.done[j] ? worst : -kBig);
  row.improvable = row.improvable && better;
  return row.improvable;
}

// The logits processors of this search (BeamOptions' -2 means "the model's config").
detail::LogitsProcessors beam_processors(const BeamOptions& opt, const BeamSettings& st,
                                         const Seq2SeqConfig& c) {
  detail::LogitsProcessors p;
  p.vocab_size = st.V;
  p.max_length = st.max_length;
  p.min_length = opt.min_length;
  p.eos = st.eos;
  p.forced_eos = opt.forced_eos_token_id == -2 ? c.forced_eos_token_id : opt.forced_eos_token_id;
  p.forced_bos = opt.forced_bos_token_id;
  p.no_repeat_ngram_size = opt.no_repeat_ngram_size;
  p.encoder_no_repeat_ngram_size = opt.encoder_no_repeat_ngram_size;
  return p;
}

// The attention mask (B, S) with each row repeated for its beams (rows `expand`), or undefined.
Tensor expand_mask(const Tensor& attention_mask, const std::vector<int64_t>& expand, int64_t B,
                   int64_t S, Device device) {
  if (!attention_mask.defined()) return {};
  const std::vector<int64_t> m = attention_mask.to_int_vector();
  DS_CHECK(static_cast<int64_t>(m.size()) == B * S,
           "[seq2seq] attention_mask is {}, input_ids ({}, {}): they must have the same shape",
           shape_str(attention_mask.shape()), B, S);
  std::vector<int64_t> rows;
  for (int64_t b : expand) rows.insert(rows.end(), m.begin() + b * S, m.begin() + (b + 1) * S);
  return Tensor::from_ints(rows, {static_cast<int64_t>(expand.size()), S}).to(device);
}

// Each row's best finished hypothesis, (B, longest) padded as transformers pads: with
// `pad_token_id or eos_token_id` (eos when pad is 0).
Tensor best_finished(const std::vector<BeamRow>& rows, const Seq2SeqConfig& c, int64_t eos) {
  const int64_t fill = c.pad_token_id != 0 || eos < 0 ? c.pad_token_id : eos;
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t longest = 0;
  for (const BeamRow& row : rows)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(row.finished[0].tokens.size()));
  std::vector<int64_t> out(static_cast<size_t>(B * longest), fill);
  for (int64_t b = 0; b < B; ++b) {
    const auto& t = rows[static_cast<size_t>(b)].finished[0].tokens;
    std::copy(t.begin(), t.end(), out.begin() + b * longest);
  }
  return Tensor::from_ints(out, {B, longest});
}

}  // namespace

void BeamOptions::validate() const {
  DS_CHECK(num_beams >= 1, "[seq2seq] num_beams must be at least 1, got {}", num_beams);
  DS_CHECK(max_new_tokens >= 1, "[seq2seq] max_new_tokens must be at least 1, got {}",
           max_new_tokens);
  DS_CHECK(min_length >= 0, "[seq2seq] min_length must not be negative, got {}", min_length);
  DS_CHECK(no_repeat_ngram_size >= 0 && encoder_no_repeat_ngram_size >= 0,
           "[seq2seq] n-gram sizes must not be negative (no_repeat_ngram_size {}, "
           "encoder_no_repeat_ngram_size {})",
           no_repeat_ngram_size, encoder_no_repeat_ngram_size);
  DS_CHECK(std::isfinite(length_penalty),
           "[seq2seq] length_penalty must be a finite number, got {}", length_penalty);
  DS_CHECK(early_stopping == "false" || early_stopping == "true" || early_stopping == "never",
           "[seq2seq] early_stopping \"{}\" is not one of false, true, never", early_stopping);
}

Tensor Seq2Seq::generate_beam(const Tensor& input_ids, const Tensor& attention_mask,
                              const BeamOptions& opt) {
  // The source in host memory (ds_generate's) goes to the model's device first.
  if (const Device d = shared_->weight().device(); input_ids.defined() && input_ids.device() != d)
    return generate_beam(input_ids.to(d), attention_mask, opt);
  const Seq2SeqConfig& c = config_;
  opt.validate();
  DS_CHECK(c.is_t5() || opt.max_new_tokens + 1 <= c.max_positions,
           "[seq2seq] 1 + max_new_tokens {} exceeds max_position_embeddings {}", opt.max_new_tokens,
           c.max_positions);
  DS_CHECK(input_ids.defined() && input_ids.dim() == 2,
           "[seq2seq] input_ids must be (B, S), got {}",
           input_ids.defined() ? shape_str(input_ids.shape()) : "undefined");
  BeamSettings st;
  st.NB = opt.num_beams;
  st.V = c.vocab_size;
  st.K = 2 * st.NB;  // max(2, 1 + #eos) * NB
  st.max_length = 1 + opt.max_new_tokens;
  st.eos = opt.eos_token_id == -2 ? c.eos_token_id : opt.eos_token_id;
  st.stop_early = opt.early_stopping == "true";
  st.never = opt.early_stopping == "never";
  st.lpen = opt.length_penalty;
  const detail::LogitsProcessors processors = beam_processors(opt, st, c);

  autograd::NoGradGuard no_grad;
  detail::EvalMode eval(*this);
  const int64_t B = input_ids.size(0), S = input_ids.size(1), NB = st.NB;
  const std::vector<int64_t> src = input_ids.to_int_vector();
  // Every source row num_beams times (hypothesis h = b * NB + j reads row b).
  std::vector<int64_t> expand;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < NB; ++j) expand.push_back(b);
  const Tensor memory = take_rows(encode(input_ids, attention_mask), expand);
  const Tensor mask = expand_mask(attention_mask, expand, B, S, input_ids.device());
  std::vector<BeamRow> rows(static_cast<size_t>(B));
  for (BeamRow& row : rows)
    for (int64_t j = 0; j < NB; ++j) {
      row.running.push_back({{c.decoder_start_token_id}, j == 0 ? 0.0 : -kBig});
      row.finished.push_back({{}, -kBig});
      row.done.push_back(false);
    }
  std::vector<LayerCache> caches;
  // Logits of every hypothesis's next token, (B * NB, V), from the cache or the whole prefix.
  auto next_logits = [&](int64_t cur_len) {
    Tensor last;
    std::vector<int64_t> ids;
    for (const BeamRow& row : rows)
      for (const Hyp& h : row.running)
        if (opt.use_cache)
          ids.push_back(h.tokens.back());
        else
          ids.insert(ids.end(), h.tokens.begin(), h.tokens.end());
    const int64_t len = opt.use_cache ? 1 : cur_len;
    const Tensor dec = Tensor::from_ints(ids, {B * NB, len}).to(input_ids.device());
    if (opt.use_cache)
      last = decode_step(dec, cur_len - 1, memory, mask, caches, st.max_length);
    else
      last = ops::slice(decode(dec, memory, mask), 1, cur_len - 1, cur_len);
    return ops::contiguous(last).to(DType::f32).to_vector();
  };
  for (int64_t cur_len = 1;;) {
    const std::vector<float> logits = next_logits(cur_len);
    bool all_hit = true;
    std::vector<int64_t> sources;  // the hypothesis each new running beam continues
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t> row_src(src.begin() + b * S, src.begin() + (b + 1) * S);
      all_hit = step_row(rows[static_cast<size_t>(b)], b, logits.data() + b * NB * st.V, row_src,
                         processors, st, cur_len, sources) && all_hit;
    }
    if (opt.use_cache && !is_identity(sources)) {  // the caches follow their hypotheses
      const Tensor idx = Tensor::from_ints(sources, {B * NB}).to(input_ids.device());
      for (auto& lc : caches) {
        lc.self_k = gather_rows(lc.self_k, idx);
        lc.self_v = gather_rows(lc.self_v, idx);
      }
    }
    ++cur_len;
    // transformers' _check_early_stop_heuristic and _beam_search_has_unfinished_sequences.
    bool any_improvable = false, all_done = true;
    for (BeamRow& row : rows) {
      any_improvable = still_improvable(row, cur_len, st) || any_improvable;
      for (bool d : row.done) all_done = all_done && d;
    }
    if (!any_improvable || (all_done && st.stop_early) || all_hit) break;
  }
  return best_finished(rows, c, st.eos);
}

}  // namespace ds::models
