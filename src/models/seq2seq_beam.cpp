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
  const int64_t NB = opt.num_beams, V = c.vocab_size;
  opt.validate();
  DS_CHECK(c.is_t5() || opt.max_new_tokens + 1 <= c.max_positions,
           "[seq2seq] 1 + max_new_tokens {} exceeds max_position_embeddings {}", opt.max_new_tokens,
           c.max_positions);
  DS_CHECK(input_ids.defined() && input_ids.dim() == 2,
           "[seq2seq] input_ids must be (B, S), got {}",
           input_ids.defined() ? shape_str(input_ids.shape()) : "undefined");
  const int64_t eos = opt.eos_token_id == -2 ? c.eos_token_id : opt.eos_token_id;
  const int64_t forced =
      opt.forced_eos_token_id == -2 ? c.forced_eos_token_id : opt.forced_eos_token_id;
  const bool stop_early = opt.early_stopping == "true", never = opt.early_stopping == "never";
  const double lpen = opt.length_penalty;
  const int64_t max_length = 1 + opt.max_new_tokens, K = 2 * NB;  // max(2, 1 + #eos) * NB
  // transformers fills unused positions with `pad_token_id or eos_token_id`: eos when pad is 0.
  const int64_t fill = c.pad_token_id != 0 || eos < 0 ? c.pad_token_id : eos;

  detail::LogitsProcessors processors;
  processors.vocab_size = V;
  processors.max_length = max_length;
  processors.min_length = opt.min_length;
  processors.eos = eos;
  processors.forced_eos = forced;
  processors.forced_bos = opt.forced_bos_token_id;
  processors.no_repeat_ngram_size = opt.no_repeat_ngram_size;
  processors.encoder_no_repeat_ngram_size = opt.encoder_no_repeat_ngram_size;

  autograd::NoGradGuard no_grad;
  detail::EvalMode eval(*this);
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  const std::vector<int64_t> src = input_ids.to_int_vector();
  // Every source row num_beams times (hypothesis h = b * NB + j reads row b).
  std::vector<int64_t> expand;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < NB; ++j) expand.push_back(b);
  const Tensor memory = take_rows(encode(input_ids, attention_mask), expand);
  Tensor mask;
  if (attention_mask.defined()) {
    const std::vector<int64_t> m = attention_mask.to_int_vector();
    DS_CHECK(static_cast<int64_t>(m.size()) == B * S,
             "[seq2seq] attention_mask is {}, input_ids ({}, {}): they must have the same shape",
             shape_str(attention_mask.shape()), B, S);
    std::vector<int64_t> rows;
    for (int64_t b : expand) rows.insert(rows.end(), m.begin() + b * S, m.begin() + (b + 1) * S);
    mask = Tensor::from_ints(rows, {B * NB, S}).to(input_ids.device());
  }

  // Per batch row: the running beams (best first), the finished list (best first) and its flags.
  std::vector<std::vector<Hyp>> running(static_cast<size_t>(B)), finished(static_cast<size_t>(B));
  std::vector<std::vector<bool>> done(static_cast<size_t>(B));
  std::vector<bool> improvable(static_cast<size_t>(B), true);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < NB; ++j) {
      running[static_cast<size_t>(b)].push_back({{c.decoder_start_token_id}, j == 0 ? 0.0 : -kBig});
      finished[static_cast<size_t>(b)].push_back({{}, -kBig});
    }
    done[static_cast<size_t>(b)].assign(static_cast<size_t>(NB), false);
  }
  std::vector<LayerCache> caches;
  int64_t cur_len = 1;
  while (true) {
    // Logits of every hypothesis's next token, (B * NB, V).
    Tensor last;
    if (opt.use_cache) {
      std::vector<int64_t> newest;
      for (const auto& r : running)
        for (const auto& h : r) newest.push_back(h.tokens.back());
      last = decode_step(Tensor::from_ints(newest, {B * NB, 1}).to(input_ids.device()), cur_len - 1,
                         memory, mask, caches, max_length);
    } else {
      std::vector<int64_t> flat;
      for (const auto& r : running)
        for (const auto& h : r) flat.insert(flat.end(), h.tokens.begin(), h.tokens.end());
      const Tensor dec = Tensor::from_ints(flat, {B * NB, cur_len}).to(input_ids.device());
      last = ops::slice(decode(dec, memory, mask), 1, cur_len - 1, cur_len);
    }
    const std::vector<float> logits = ops::contiguous(last).to(DType::f32).to_vector();

    bool all_hit = true;
    std::vector<int64_t> sources;  // the hypothesis each new running beam continues
    for (int64_t b = 0; b < B; ++b) {
      auto& run = running[static_cast<size_t>(b)];
      auto& fin = finished[static_cast<size_t>(b)];
      auto& fdone = done[static_cast<size_t>(b)];
      const std::vector<int64_t> row(src.begin() + b * S, src.begin() + (b + 1) * S);
      // Accumulated log-probabilities of all NB * V continuations, processors applied.
      std::vector<double> acc(static_cast<size_t>(NB * V));
      for (int64_t j = 0; j < NB; ++j) {
        const float* lg = logits.data() + (b * NB + j) * V;
        double* lp = acc.data() + j * V;
        double m = kNegInf;
        for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(lg[v]));
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(lg[v] - m);
        const double lse = m + std::log(sum);
        for (int64_t v = 0; v < V; ++v) lp[v] = lg[v] - lse;
        processors.apply(run[static_cast<size_t>(j)].tokens, row, lp);
        for (int64_t v = 0; v < V; ++v) lp[v] += run[static_cast<size_t>(j)].score;
      }
      const std::vector<int64_t> top = top_k(acc, K);
      std::vector<Hyp> cand;
      std::vector<int64_t> cand_src;
      std::vector<bool> hits;
      for (int64_t idx : top) {
        const int64_t j = idx / V, tok = idx % V;
        Hyp h = run[static_cast<size_t>(j)];
        h.tokens.push_back(tok);
        h.score = acc[static_cast<size_t>(idx)];
        cand.push_back(std::move(h));
        cand_src.push_back(b * NB + j);
        hits.push_back(cur_len + 1 >= max_length || (eos >= 0 && tok == eos));
        all_hit = all_hit && hits.back();
      }
      // The next running beams: the best candidates that did not finish.
      std::vector<double> keep(cand.size());
      for (size_t i = 0; i < cand.size(); ++i) keep[i] = cand[i].score - (hits[i] ? kBig : 0.0);
      std::vector<Hyp> next;
      for (int64_t i : top_k(keep, NB)) {
        next.push_back(cand[static_cast<size_t>(i)]);
        next.back().score = keep[static_cast<size_t>(i)];
        sources.push_back(cand_src[static_cast<size_t>(i)]);
      }
      // The finished list: the old one merged with the top NB candidates that just finished.
      const bool full =
          stop_early && std::all_of(fdone.begin(), fdone.end(), [](bool d) { return d; });
      std::vector<double> merged_scores;
      std::vector<Hyp> merged;
      std::vector<bool> merged_done;
      for (int64_t j = 0; j < NB; ++j) {
        merged.push_back(fin[static_cast<size_t>(j)]);
        merged_scores.push_back(fin[static_cast<size_t>(j)].score);
        merged_done.push_back(fdone[static_cast<size_t>(j)]);
      }
      const double len_pen = std::pow(static_cast<double>(cur_len), lpen);  // generated tokens
      for (size_t i = 0; i < cand.size(); ++i) {
        const bool just = hits[i] && static_cast<int64_t>(i) < NB;
        double s = cand[i].score / len_pen;
        if (full) s -= kBig;
        if (!improvable[static_cast<size_t>(b)]) s -= kBig;
        if (!just) s -= kBig;
        merged.push_back(cand[i]);
        merged.back().score = s;
        merged_scores.push_back(s);
        merged_done.push_back(just);
      }
      std::vector<Hyp> new_fin;
      std::vector<bool> new_done;
      for (int64_t i : top_k(merged_scores, NB)) {
        new_fin.push_back(merged[static_cast<size_t>(i)]);
        new_done.push_back(merged_done[static_cast<size_t>(i)]);
      }
      run = std::move(next);
      fin = std::move(new_fin);
      fdone = std::move(new_done);
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
    for (int64_t b = 0; b < B; ++b) {
      const auto& fin = finished[static_cast<size_t>(b)];
      const auto& fdone = done[static_cast<size_t>(b)];
      const double best_len = never && lpen > 0.0 ? static_cast<double>(max_length - 1)
                                                  : static_cast<double>(cur_len - 1);
      const double best_running =
          running[static_cast<size_t>(b)][0].score / std::pow(best_len, lpen);
      double worst = std::numeric_limits<double>::infinity();
      for (const auto& h : fin) worst = std::min(worst, h.score);
      bool better = false;
      for (int64_t j = 0; j < NB; ++j)
        better = better || best_running > (fdone[static_cast<size_t>(j)] ? worst : -kBig);
      improvable[static_cast<size_t>(b)] = improvable[static_cast<size_t>(b)] && better;
      any_improvable = any_improvable || improvable[static_cast<size_t>(b)];
      for (bool d : fdone) all_done = all_done && d;
    }
    if (!any_improvable || (all_done && stop_early) || all_hit) break;
  }

  // Each row's best finished hypothesis; the output is as long as the longest.
  int64_t longest = 0;
  for (const auto& fin : finished)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(fin[0].tokens.size()));
  std::vector<int64_t> out(static_cast<size_t>(B * longest), fill);
  for (int64_t b = 0; b < B; ++b) {
    const auto& t = finished[static_cast<size_t>(b)][0].tokens;
    std::copy(t.begin(), t.end(), out.begin() + b * longest);
  }
  return Tensor::from_ints(out, {B, longest});
}

}  // namespace ds::models
