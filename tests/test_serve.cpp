// KV-cache generation and sampling (ds/serve): cached decoding against the full forward in both
// layouts, the sampling rules, stop strings, generation_config.json defaults, request parsing.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"
#include "ds/models/family.h"
#include "ds/models/gpt_decoder.h"
#include "ds/models/hf_io.h"
#include "ds/nn/flat.h"
#include "ds/serve/api.h"
#include "ds/serve/generate.h"
#include "ds/serve/sampling.h"
#include "ds/serve/scheduler.h"
#include "serve_fixture.h"

using namespace ds;
namespace fs = std::filesystem;
using serve_test::make_model;

namespace {

std::vector<int32_t> seq(int n, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + salt * 11 + 5) % 256);
  return ids;
}

// Logits of the full (uncached) forward: (T, V).
std::vector<float> full_logits(models::GPT& m, const std::vector<int32_t>& ids) {
  autograd::NoGradGuard ng;
  std::vector<int64_t> v(ids.begin(), ids.end());
  return m.logits(Tensor::from_ints(v, {1, static_cast<int64_t>(ids.size())})).to_vector();
}

float max_abs_diff(const std::vector<float>& a, const float* b, size_t n) {
  float d = 0.0f;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

void check_cached_equals_full(const models::GPTConfig& cfg) {
  auto m = make_model(cfg);
  const int64_t V = cfg.vocab_size;
  const std::vector<int32_t> ids = seq(24, 3);
  const std::vector<float> full = full_logits(*m, ids);  // (24, V)
  models::GPTDecoder dec(m);
  // Prefill 9 tokens (all logits), a 4-token chunk after the cache, then one token at a time.
  Tensor pre = dec.forward(std::span(ids).subspan(0, 9), /*all_logits=*/true);
  ASSERT_EQ(pre.shape(), (Shape{9, V}));
  const std::vector<float> pv = pre.to_vector();
  // Prefill runs the training kernels on the same shapes: equal up to the LM head's GEMM shape.
  EXPECT_LT(max_abs_diff(pv, full.data(), pv.size()), 1e-5f);
  Tensor chunk = dec.forward(std::span(ids).subspan(9, 4), true);
  const std::vector<float> cv = chunk.to_vector();
  // Tolerance: the decode kernel sums in another order than the fused one; logits are O(10).
  EXPECT_LT(max_abs_diff(cv, full.data() + 9 * V, cv.size()), 2e-4f);
  for (size_t t = 13; t < ids.size(); ++t) {
    Tensor one = dec.forward(std::span(ids).subspan(t, 1));
    ASSERT_EQ(one.shape(), (Shape{1, V}));
    EXPECT_LT(max_abs_diff(one.to_vector(), full.data() + t * V, static_cast<size_t>(V)), 2e-4f)
        << "position " << t;
  }
  EXPECT_EQ(dec.length(), 24);
  // Truncating and re-running a suffix reuses the prefix: same logits again.
  dec.truncate(20);
  Tensor again = dec.forward(std::span(ids).subspan(20, 1));
  EXPECT_LT(max_abs_diff(again.to_vector(), full.data() + 20 * V, static_cast<size_t>(V)), 2e-4f);
}

}  // namespace

TEST(GPTDecoder, CachedEqualsFullForwardGpt2) {
  check_cached_equals_full(serve_test::tiny_gpt2());
}
TEST(GPTDecoder, CachedEqualsFullForwardLlamaGqaLlama3Rope) {
  check_cached_equals_full(serve_test::tiny_llama("llama"));
}
TEST(GPTDecoder, CachedEqualsFullForwardQwen2Bias) {
  check_cached_equals_full(serve_test::tiny_llama("qwen2"));
}
TEST(GPTDecoder, CachedEqualsFullForwardQwen3QkNorm) {
  check_cached_equals_full(serve_test::tiny_llama("qwen3"));
}
TEST(GPTDecoder, CachedEqualsFullForwardGlmPartialInterleavedRope) {
  check_cached_equals_full(serve_test::tiny_llama("glm"));
}
TEST(GPTDecoder, CachedEqualsFullForwardGlm4SandwichNorm) {
  check_cached_equals_full(serve_test::tiny_llama("glm4"));
}
TEST(GPTDecoder, CachedEqualsFullForwardPhi3Longrope) {
  check_cached_equals_full(serve_test::tiny_llama("phi3"));
}

// LongRoPE past its original context (12 here): each position's logits are those of a full forward
// of the sequence so far (short table up to 12 tokens, long beyond), whether the decoder steps
// alone, crosses inside a prefill chunk, or crosses in a batched step beside one that does not.
TEST(GPTDecoder, LongropeSwitchRecomputesOnTheLongTable) {
  models::GPTConfig cfg = serve_test::tiny_llama("phi3");
  cfg.rope_scaling.original_max_position = 12;
  auto m = make_model(cfg);
  const int64_t V = cfg.vocab_size;
  const std::vector<int32_t> ids = seq(24, 3);
  auto full_last = [&](size_t len) {  // (V) logits of position len - 1 from a full forward
    const std::vector<float> f = full_logits(*m, {ids.begin(), ids.begin() + len});
    return std::vector<float>(f.end() - V, f.end());
  };
  models::GPTDecoder dec(m);
  dec.forward(std::span(ids).subspan(0, 9));
  for (size_t t = 9; t < 16; ++t) {
    const Tensor one = dec.forward(std::span(ids).subspan(t, 1));
    EXPECT_LT(max_abs_diff(full_last(t + 1), one.to_vector().data(), V), 2e-4f) << "position " << t;
  }
  models::GPTDecoder chunked(m);  // 10 then a chunk of 4 across 12
  chunked.forward(std::span(ids).subspan(0, 10));
  const Tensor c = chunked.forward(std::span(ids).subspan(10, 4), /*all_logits=*/true);
  ASSERT_EQ(c.shape(), (Shape{4, V}));
  EXPECT_LT(max_abs_diff(full_last(14), c.to_vector().data() + 3 * V, V), 2e-4f);
  // A batched step: a crosses 12 (recomputed alone), b stays short.
  auto a = dec.fresh(), b = dec.fresh();
  a->forward(std::span(ids).subspan(0, 12));
  b->forward(std::span(ids).subspan(0, 5));
  std::vector<models::IncrementalDecoder*> both = {a.get(), b.get()};
  const std::vector<int32_t> step = {ids[12], ids[5]};
  const std::vector<float> rows = dec.decode_batch(both, step).to_vector();
  EXPECT_LT(max_abs_diff(full_last(13), rows.data(), V), 2e-4f);
  EXPECT_LT(max_abs_diff(full_last(6), rows.data() + V, V), 2e-4f);
  EXPECT_EQ(a->length(), 13);
  EXPECT_EQ(b->length(), 6);
}

// The decoder runs the model's own layers (nn::Block::decode): a LoRA adapter that is attached and
// not merged takes part, as in the full forward.
TEST(GPTDecoder, UnmergedLoraTakesPart) {
  for (const models::GPTConfig& cfg : {serve_test::tiny_gpt2(), serve_test::tiny_llama("qwen3")}) {
    auto m = make_model(cfg);
    int adapted = 0;
    for (const auto& [name, mod] : m->named_modules()) {
      auto* lin = dynamic_cast<nn::Linear*>(mod);
      if (!lin || name.find(".0.") == std::string::npos || name.find("lora") != std::string::npos)
        continue;
      lin->add_lora(2, 0.5f, 0.0f);
      ++adapted;
    }
    ASSERT_GT(adapted, 2);
    for (const auto& [name, p] : m->named_parameters())
      if (name.find("lora_") != std::string::npos)
        for (int64_t i = 0; i < p.numel(); ++i)
          p.data<float>()[i] = 0.05f * static_cast<float>((i * 7 + name.size()) % 11) - 0.25f;
    const std::vector<int32_t> ids = seq(12, 5);
    const std::vector<float> full = full_logits(*m, ids);
    const int64_t V = cfg.vocab_size;
    models::GPTDecoder dec(m);
    const std::vector<float> pre = dec.forward(std::span(ids).subspan(0, 11), true).to_vector();
    EXPECT_LT(max_abs_diff(pre, full.data(), pre.size()), 1e-5f) << cfg.family;
    const std::vector<float> last = dec.forward(std::span(ids).subspan(11, 1)).to_vector();
    EXPECT_LT(max_abs_diff(last, full.data() + 11 * V, static_cast<size_t>(V)), 2e-4f)
        << cfg.family;
  }
}

TEST(GPTDecoder, RefusesAPipelineStage) {
  auto stage =
      std::make_shared<models::GPT>(serve_test::tiny_gpt2(), nullptr, models::PipeRange{0, 2});
  try {
    models::GPTDecoder dec(stage);
    FAIL() << "a pipeline stage was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the whole model"), std::string::npos) << e.what();
  }
}

TEST(GPTDecoder, CacheHoldsKvHeadsOnlyAndRefusesPastContext) {
  auto m = make_model(serve_test::tiny_llama("llama", 16));
  models::GPTDecoder dec(m);
  dec.forward(seq(16, 1));
  // 2 layers x (K, V) x 16 positions x 2 KV heads x 16 head size x 4 bytes (not 4 query heads).
  EXPECT_EQ(dec.cache_bytes(), 2 * 2 * 16 * 2 * 16 * 4);
  try {
    const int32_t one = 1;
    dec.forward(std::span(&one, 1));
    FAIL() << "no error past block_size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
}

TEST(Generate, GreedyEqualsUncachedGenerate) {
  for (const auto& cfg : {serve_test::tiny_gpt2(), serve_test::tiny_llama("qwen3")}) {
    auto m = make_model(cfg);
    const std::vector<int32_t> prompt = seq(7, 2);
    std::vector<int64_t> p64(prompt.begin(), prompt.end());
    // GPT::generate reruns the whole context every step (no cache); top_k 1 is greedy.
    const std::vector<int64_t> ref =
        m->generate(Tensor::from_ints(p64, {1, 7}), 20, 1).to_int_vector();
    models::GPTDecoder dec(m);
    serve::SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 20;
    auto tok = serve::make_byte_tokenizer();
    const auto r = serve::generate(dec, *tok, prompt, p, /*eos_ids=*/{});
    ASSERT_EQ(r.tokens.size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_EQ(r.tokens[i], ref[7 + i]) << "token " << i;
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.prompt_tokens, 7);
    EXPECT_EQ(r.completion_tokens, 20);
    EXPECT_EQ(r.decode_steps, 19);
  }
}

// ---- Continuous batching ----

// decode_batch: sequences of different lengths advance together, and each row is bit for bit
// what its own decoder gives alone (the row kernel sums in one order whatever the batch).
void check_decode_batch_equals_alone(const models::GPTConfig& cfg, DType dtype = DType::f32) {
  auto m = make_model(cfg);
  if (dtype != DType::f32) nn::flatten_parameters(*m, dtype, DType::f32, 1, /*with_grads=*/false);
  const int64_t V = cfg.vocab_size;
  constexpr int kSeqs = 5;  // rows 0-3 take the four-row kernel, row 4 the one-row kernel
  std::vector<std::unique_ptr<models::GPTDecoder>> batched, alone;
  std::vector<int32_t> next(kSeqs);
  for (int b = 0; b < kSeqs; ++b) {
    const std::vector<int32_t> prompt = seq(3 + 5 * b, b);  // lengths 3, 8, .. 23
    for (auto* v : {&batched, &alone}) {
      v->push_back(std::make_unique<models::GPTDecoder>(m));
      v->back()->forward(prompt);
    }
    next[static_cast<size_t>(b)] = (b * 41 + 7) % 256;
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<models::IncrementalDecoder*> decs;
    for (auto& d : batched) decs.push_back(d.get());
    // From step 3 the last sequence has left the batch (as a finished request does): 4 rows.
    if (step >= 3) decs.pop_back();
    const std::vector<int32_t> ids(next.begin(),
                                   next.begin() + static_cast<ptrdiff_t>(decs.size()));
    const Tensor rows = decs[0]->decode_batch(decs, ids);
    ASSERT_EQ(rows.shape(), (Shape{static_cast<int64_t>(decs.size()), V}));
    const std::vector<float> rv = rows.to_vector();
    for (size_t b = 0; b < decs.size(); ++b) {
      const std::vector<float> one = alone[b]->forward(std::span(&next[b], 1)).to_vector();
      EXPECT_EQ(std::memcmp(one.data(), rv.data() + b * static_cast<size_t>(V),
                            one.size() * sizeof(float)),
                0)
          << "sequence " << b << ", step " << step << ": max diff "
          << max_abs_diff(one, rv.data() + b * static_cast<size_t>(V), one.size());
      EXPECT_EQ(batched[b]->length(), alone[b]->length());
      next[b] = (next[b] * 13 + 29) % 256;
    }
  }
}

TEST(GPTDecoder, DecodeBatchEqualsAloneGpt2) {
  check_decode_batch_equals_alone(serve_test::tiny_gpt2());
}
TEST(GPTDecoder, DecodeBatchEqualsAloneLlamaGqa) {
  check_decode_batch_equals_alone(serve_test::tiny_llama("llama"));
}
TEST(GPTDecoder, DecodeBatchEqualsAloneQwen2Bias) {
  check_decode_batch_equals_alone(serve_test::tiny_llama("qwen2"));
}
TEST(GPTDecoder, DecodeBatchEqualsAloneQwen3QkNorm) {
  check_decode_batch_equals_alone(serve_test::tiny_llama("qwen3"));
}
TEST(GPTDecoder, DecodeBatchEqualsAloneGlm4) {
  check_decode_batch_equals_alone(serve_test::tiny_llama("glm4"));
}

// ---- bf16 decoding (ds_generate / ds_serve --dtype bf16) ----

namespace {

// The model of cfg with its weights in bf16 (rounded to nearest even from make_model's), and its
// fp32 twin holding the same rounded values widened.
std::pair<std::shared_ptr<models::GPT>, std::shared_ptr<models::GPT>> bf16_and_fp32_twin(
    const models::GPTConfig& cfg) {
  auto m16 = make_model(cfg);
  nn::flatten_parameters(*m16, DType::bf16, DType::f32, 1, /*with_grads=*/false);
  auto m32 = make_model(cfg);
  for (auto& [name, p] : m32->named_parameters()) p.copy_from(p.to(DType::bf16));
  return {m16, m32};
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

// The gap between the largest and the second largest logit.
float top2_gap(const float* v, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] > a) {
      b = a;
      a = v[i];
    } else if (v[i] > b) {
      b = v[i];
    }
  }
  return a - b;
}

// A bf16 model decodes with bf16 weights and a bf16 KV cache (half the fp32 cache's bytes), and
// tracks the fp32 run of the same bf16-rounded weights: teacher-forced on the fp32 run's greedy
// tokens, every step's logits are within kTol of the fp32 ones, and the greedy choice is the
// same wherever the fp32 run's top two logits are further apart than twice that step's largest
// difference. Free-running, the bf16 greedy tokens equal the fp32 ones up to the first step
// where they are not (a near tie: random tiny models have top-two gaps of 0.005 to 1.4).
// Bitwise equality is not expected: the bf16 run rounds its activations to bf16 between
// ops (as transformers' bf16 generate() does), the fp32 run keeps them in fp32.
void check_bf16_tracks_fp32(const models::GPTConfig& cfg) {
  // bf16 activations round by up to 2^-9 relative at each op of two layers; measured max logit
  // differences 0.03 (gpt2) to 0.055 (llama): about 3x that.
  constexpr float kTol = 0.15f;
  const auto [m16, m32] = bf16_and_fp32_twin(cfg);
  const int64_t V = cfg.vocab_size;
  for (const auto& [name, p] : m16->named_parameters()) ASSERT_EQ(p.dtype(), DType::bf16) << name;
  const std::vector<int32_t> prompt = seq(9, 4);
  constexpr int kNew = 24;
  serve::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = kNew;
  auto tok = serve::make_byte_tokenizer();
  models::GPTDecoder d32(m32), d16(m16);
  const auto r32 = serve::generate(d32, *tok, prompt, greedy, {});
  const auto r16 = serve::generate(d16, *tok, prompt, greedy, {});
  ASSERT_EQ(r32.tokens.size(), static_cast<size_t>(kNew));
  EXPECT_EQ(d16.length(), d32.length());
  EXPECT_EQ(2 * d16.cache_bytes(), d32.cache_bytes());
  // Teacher-forced: both decoders read the fp32 run's context.
  d32.truncate(0);
  d16.truncate(0);
  const std::vector<float> p32 = d32.forward(prompt).to_vector(),
                           p16 = d16.forward(prompt).to_vector();
  std::vector<float> l32 = p32, l16 = p16;  // the logits predicting token s
  float worst = 0.0f;
  int first_tie = kNew;
  for (int s = 0; s < kNew; ++s) {
    const float diff = max_abs_diff(l32, l16.data(), static_cast<size_t>(V));
    worst = std::max(worst, diff);
    EXPECT_LT(diff, kTol) << "step " << s;
    ASSERT_EQ(argmax(l32.data(), V), r32.tokens[static_cast<size_t>(s)]) << "step " << s;
    // No logit moved by more than diff: the top one stays on top when it leads by more than 2 diff.
    if (top2_gap(l32.data(), V) > 2 * diff)
      EXPECT_EQ(argmax(l16.data(), V), r32.tokens[static_cast<size_t>(s)]) << "step " << s;
    else
      first_tie = std::min(first_tie, s);
    const int32_t t = r32.tokens[static_cast<size_t>(s)];
    l32 = d32.forward(std::span(&t, 1)).to_vector();
    l16 = d16.forward(std::span(&t, 1)).to_vector();
  }
  ASSERT_EQ(r16.tokens.size(), r32.tokens.size());
  for (int s = 0; s < first_tie; ++s)
    EXPECT_EQ(r16.tokens[static_cast<size_t>(s)], r32.tokens[static_cast<size_t>(s)])
        << "step " << s;
  std::printf(
      "%s: bf16 vs fp32 logits max |diff| %.4f, greedy tokens equal for the first %d of %d "
      "(first near tie at %d)\n",
      cfg.family.empty() ? "gpt2" : cfg.family.c_str(), worst,
      static_cast<int>(
          std::mismatch(r16.tokens.begin(), r16.tokens.end(), r32.tokens.begin()).first -
          r16.tokens.begin()),
      kNew, first_tie);
}

}  // namespace

TEST(GPTDecoder, Bf16TracksFp32TwinGpt2) {
  check_bf16_tracks_fp32(serve_test::tiny_gpt2());
}
TEST(GPTDecoder, Bf16TracksFp32TwinLlamaGqa) {
  check_bf16_tracks_fp32(serve_test::tiny_llama("llama"));
}
TEST(GPTDecoder, Bf16TracksFp32TwinQwen3QkNorm) {
  check_bf16_tracks_fp32(serve_test::tiny_llama("qwen3"));
}

// Continuous batching with bf16 weights and caches: each row still equals its decoder alone, bit
// for bit (the bf16 row kernel sums in one order whatever the batch).
TEST(GPTDecoder, DecodeBatchEqualsAloneBf16LlamaGqa) {
  models::GPTConfig cfg = serve_test::tiny_llama("llama");
  check_decode_batch_equals_alone(cfg, DType::bf16);
}
TEST(GPTDecoder, DecodeBatchEqualsAloneBf16Gpt2) {
  check_decode_batch_equals_alone(serve_test::tiny_gpt2(), DType::bf16);
}

// load_model's dtype: bf16 weights from an fp32 export (rounded) and from a bf16 one (as they
// are); --dtype auto follows config.json's dtype; encoder-decoders refuse bf16.
TEST(LoadModel, Bf16DtypeAndAuto) {
  serve_test::TempDir dir("load_bf16");
  const models::GPTConfig cfg = serve_test::tiny_llama("qwen3");
  const auto [m16, m32] = bf16_and_fp32_twin(cfg);
  models::export_hf(*m32, dir.path() / "f32", DType::f32);
  models::export_hf(*m32, dir.path() / "b16", DType::bf16);
  EXPECT_EQ(serve::decode_dtype("auto", dir.path() / "f32"), DType::f32);
  EXPECT_EQ(serve::decode_dtype("auto", dir.path() / "b16"), DType::bf16);
  EXPECT_EQ(serve::decode_dtype("fp32", dir.path() / "b16"), DType::f32);
  EXPECT_EQ(serve::decode_dtype("bf16", dir.path() / "f32"), DType::bf16);
  EXPECT_THROW(serve::decode_dtype("fp16", dir.path() / "f32"), Error);
  const auto want = m16->named_parameters();
  for (const char* sub : {"f32", "b16"}) {
    const serve::LoadedModel lm = serve::load_model(dir.path() / sub, {}, kCPU, DType::bf16);
    EXPECT_EQ(lm.dtype, DType::bf16);
    const auto got = lm.model->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].second.dtype(), DType::bf16) << sub << " " << got[i].first;
      EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector())
          << sub << " " << got[i].first;
    }
    // The KV cache is bf16: half the bytes of the fp32 model's after the same tokens.
    const auto dec = lm.make_decoder();
    dec->forward(seq(5, 1));
    const auto d32 = serve::load_model(dir.path() / sub).make_decoder();
    d32->forward(seq(5, 1));
    EXPECT_EQ(2 * dec->cache_bytes(), d32->cache_bytes()) << sub;
  }
}

// Serving takes its decoder from the family registry: each decoder-only family's entry makes one
// (GPT's), fresh() decoders share the weights and start empty, and a decoder of another kind is
// refused by decode_batch.
TEST(GPTDecoder, RegistryMakesEachFamilysDecoder) {
  for (const models::GPTConfig& cfg :
       {serve_test::tiny_gpt2(), serve_test::tiny_llama("llama"), serve_test::tiny_llama("qwen3"),
        serve_test::tiny_llama("glm4")}) {
    auto m = make_model(cfg);
    std::unique_ptr<models::IncrementalDecoder> dec = models::make_decoder(m);
    ASSERT_NE(dynamic_cast<models::GPTDecoder*>(dec.get()), nullptr) << cfg.family;
    EXPECT_EQ(dec->vocab_size(), cfg.vocab_size);
    EXPECT_EQ(dec->capacity_limit(), cfg.block_size);
    const std::vector<int32_t> ids = seq(6, 4);
    const std::vector<float> a = dec->forward(ids).to_vector();
    auto other = dec->fresh();
    EXPECT_EQ(other->length(), 0);
    EXPECT_EQ(other->forward(ids).to_vector(), a) << cfg.family;
    models::GPTDecoder direct(m);
    EXPECT_EQ(direct.forward(ids).to_vector(), a) << cfg.family;
  }
}

TEST(GPTDecoder, DecodeBatchRefusesBadBatches) {
  auto m = make_model(serve_test::tiny_gpt2(16));
  models::GPTDecoder a(m), b(m), other(make_model(serve_test::tiny_gpt2(16)));
  a.forward(seq(4, 1));
  b.forward(seq(16, 2));  // full
  other.forward(seq(4, 3));
  const std::vector<int32_t> two = {1, 2};
  auto fails = [&](std::vector<models::IncrementalDecoder*> decs, std::vector<int32_t> ids,
                   const std::string& what) {
    try {
      decs[0]->decode_batch(decs, ids);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails({&a, &b}, two, "context");
  fails({&a, &other}, two, "same model");
  fails({&a, &a}, two, "twice");
  fails({&a}, two, "one token per decoder");
}

namespace {

// A request that holds the scheduler's thread (its first cancellation check) until `go`: every
// request submitted meanwhile is waiting when the scheduler next admits, so tests do not depend
// on how fast the submitting thread runs.
serve::CancelCheck hold_until(std::atomic<bool>& go) {
  return [&go] {
    while (!go) std::this_thread::yield();
    return false;
  };
}

struct Case {
  std::vector<int32_t> prompt;
  serve::SamplingParams params;
};

// Requests unlike each other: greedy and seeded sampling, different prompts, lengths, stops.
std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < 6; ++i) {
    Case c;
    c.prompt = seq(2 + 3 * i, i + 5);
    c.params.max_tokens = 6 + 3 * i;
    c.params.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    c.params.top_k = i == 3 ? 20 : 0;
    c.params.top_p = i == 5 ? 0.8f : 1.0f;
    c.params.seed = 100 + static_cast<uint64_t>(i);
    if (i == 4) c.params.stop = {"e"};
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

// What each request gets under batching equals what it gets alone, token for token, text,
// finish reason and streamed pieces alike, for both layouts.
TEST(Scheduler, BatchedEqualsAlone) {
  for (const auto& cfg : {serve_test::tiny_gpt2(), serve_test::tiny_llama("qwen3")}) {
    auto m = make_model(cfg);
    auto tok = serve::make_byte_tokenizer();
    const std::vector<int32_t> eos = {256};
    const std::vector<Case> cases = mixed_cases();
    std::vector<serve::GenerationResult> alone;
    std::vector<std::string> alone_streamed(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      models::GPTDecoder dec(m);
      alone.push_back(serve::generate(dec, *tok, cases[i].prompt, cases[i].params, eos,
                                      [&, i](std::string_view p) {
                                        alone_streamed[i] += std::string(p) + "|";
                                        return true;
                                      }));
    }
    serve::Scheduler sched(models::make_decoder(m), *tok, {.max_batch = 4});  // 6 requests: 2 wait for places
    std::atomic<bool> go{false};
    std::vector<std::string> streamed(cases.size());
    std::vector<std::future<serve::GenerationResult>> futures;
    for (size_t i = 0; i < cases.size(); ++i) {
      serve::GenerationRequest r{cases[i].prompt, cases[i].params, eos};
      r.on_text = [&, i](std::string_view p) {
        streamed[i] += std::string(p) + "|";
        return true;
      };
      if (i == 0) r.cancelled = hold_until(go);
      futures.push_back(sched.submit(std::move(r)));
    }
    go = true;
    for (size_t i = 0; i < cases.size(); ++i) {
      const serve::GenerationResult r = futures[i].get();
      EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i;
      EXPECT_EQ(r.text, alone[i].text) << "request " << i;
      EXPECT_EQ(r.finish_reason, alone[i].finish_reason) << "request " << i;
      EXPECT_EQ(r.completion_tokens, alone[i].completion_tokens) << "request " << i;
      EXPECT_EQ(r.decode_steps, alone[i].decode_steps) << "request " << i;
      EXPECT_EQ(streamed[i], alone_streamed[i]) << "request " << i;
    }
    EXPECT_EQ(sched.running(), 0);
    EXPECT_EQ(sched.waiting(), 0);
  }
}

// The point of batching: 4 requests of 16 tokens admitted together take 15 shared decode steps
// (the first token comes from each prefill), not 4 x 15.
TEST(Scheduler, ConcurrentRequestsShareDecodeSteps) {
  auto m = make_model(serve_test::tiny_gpt2(128));
  auto tok = serve::make_byte_tokenizer();
  std::vector<int> batch_sizes;
  serve::Scheduler sched(models::make_decoder(m), *tok,
                         {.max_batch = 8, .on_step = [&](int b) { batch_sizes.push_back(b); }});
  std::atomic<bool> go{false};
  std::vector<std::future<serve::GenerationResult>> futures;
  for (int i = 0; i < 4; ++i) {
    serve::GenerationRequest r;
    r.prompt = seq(4 + i, i);
    r.params.max_tokens = 16;
    r.params.temperature = 0.0f;
    if (i == 0) r.cancelled = hold_until(go);
    futures.push_back(sched.submit(std::move(r)));
  }
  go = true;
  for (auto& f : futures) {
    const serve::GenerationResult r = f.get();
    EXPECT_EQ(r.completion_tokens, 16);
    EXPECT_EQ(r.decode_steps, 15);
  }
  EXPECT_EQ(sched.decode_steps(), 15u);
  EXPECT_EQ(batch_sizes, std::vector<int>(15, 4));
}

// Admission keeps arrival order: with one place, requests run one after another in the order they
// came; one that gives up while waiting leaves without a token and without holding up the others.
TEST(Scheduler, AdmitsInArrivalOrderAndWaitersThatLeave) {
  auto m = make_model(serve_test::tiny_gpt2(128));
  auto tok = serve::make_byte_tokenizer();
  serve::Scheduler sched(models::make_decoder(m), *tok, {.max_batch = 1});
  std::atomic<bool> go{false}, leave{false};
  std::mutex mu;
  std::vector<int> started;  // request ids in the order their first text came
  std::vector<std::future<serve::GenerationResult>> futures;
  for (int i = 0; i < 5; ++i) {
    serve::GenerationRequest r;
    r.prompt = seq(3, i);
    r.params.max_tokens = 8;
    r.params.temperature = 0.0f;
    r.on_text = [&, i, first = true](std::string_view) mutable {
      if (first) {
        std::lock_guard<std::mutex> lk(mu);
        started.push_back(i);
      }
      first = false;
      return true;
    };
    if (i == 0)
      r.cancelled = [&] {
        while (!go) std::this_thread::yield();
        leave = true;  // request 2 gives up while request 0 runs
        return false;
      };
    if (i == 2) r.cancelled = [&] { return leave.load(); };
    futures.push_back(sched.submit(std::move(r)));
  }
  EXPECT_EQ(sched.waiting(), 5);
  go = true;
  std::vector<std::string> finish;
  for (auto& f : futures) finish.push_back(f.get().finish_reason);
  EXPECT_EQ(finish,
            (std::vector<std::string>{"length", "length", "cancelled", "length", "length"}));
  EXPECT_EQ(started, (std::vector<int>{0, 1, 3, 4}));
}

// A request cancelled in the middle of a batch (its client left) leaves it within a token; the
// others go on and still get what they get alone.
TEST(Scheduler, CancelledSequenceLeavesTheBatch) {
  auto m = make_model(serve_test::tiny_llama("qwen2", 128));
  auto tok = serve::make_byte_tokenizer();
  serve::SamplingParams p;
  p.max_tokens = 24;
  p.temperature = 0.0f;
  std::vector<serve::GenerationResult> alone;
  for (int i = 0; i < 3; ++i) {
    models::GPTDecoder dec(m);
    alone.push_back(serve::generate(dec, *tok, seq(5 + i, i), p, {}));
  }
  serve::Scheduler sched(models::make_decoder(m), *tok);
  std::atomic<bool> go{false};
  std::atomic<int> checks{0};
  std::vector<std::future<serve::GenerationResult>> futures;
  for (int i = 0; i < 3; ++i) {
    serve::GenerationRequest r{seq(5 + i, i), p, {}};
    if (i == 0) r.cancelled = hold_until(go);
    if (i == 1) r.cancelled = [&] { return ++checks > 6; };  // gone after a few steps
    futures.push_back(sched.submit(std::move(r)));
  }
  go = true;
  for (int i = 0; i < 3; ++i) {
    const serve::GenerationResult r = futures[static_cast<size_t>(i)].get();
    if (i == 1) {
      EXPECT_EQ(r.finish_reason, "cancelled");
      EXPECT_LE(r.completion_tokens, 6);  // one check per step: at most one token after it left
      EXPECT_EQ(r.tokens, std::vector<int32_t>(alone[1].tokens.begin(),
                                               alone[1].tokens.begin() + r.completion_tokens));
    } else {
      EXPECT_EQ(r.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
      EXPECT_EQ(r.finish_reason, "length");
    }
  }
}

// A request the scheduler cannot run (its budget exceeds the context) fails alone, through its
// future; the others are served.
TEST(Scheduler, BadRequestFailsAlone) {
  auto m = make_model(serve_test::tiny_gpt2(32));
  auto tok = serve::make_byte_tokenizer();
  serve::Scheduler sched(models::make_decoder(m), *tok);
  serve::GenerationRequest bad{seq(10, 1), {}, {}};
  bad.params.max_tokens = 30;
  serve::GenerationRequest good{seq(10, 2), {}, {}};
  good.params.temperature = 0.0f;
  auto fb = sched.submit(std::move(bad));
  auto fg = sched.submit(std::move(good));
  try {
    fb.get();
    ADD_FAILURE() << "no error for a request past the context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fg.get().finish_reason, "length");
}

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f};
  serve::SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(serve::sample_next(l, {}, 0, p, 0), 1);
}

TEST(Sampling, TopK1EqualsGreedyAndSeedIsDeterministic) {
  std::vector<float> base(300);
  for (size_t i = 0; i < base.size(); ++i) base[i] = std::sin(static_cast<float>(i) * 1.7f) * 3.0f;
  serve::SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto l0 = base;
  const int32_t g = serve::sample_next(l0, {}, 0, greedy, 0);
  serve::SamplingParams k1;
  k1.top_k = 1;
  k1.temperature = 1.5f;
  std::set<int32_t> drawn;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    k1.seed = seed;
    auto l = base;
    EXPECT_EQ(serve::sample_next(l, {}, 0, k1, seed % 3), g);
    serve::SamplingParams s;  // full distribution
    s.seed = seed;
    auto a = base, b = base;
    const int32_t x = serve::sample_next(a, {}, 0, s, 4);
    EXPECT_EQ(serve::sample_next(b, {}, 0, s, 4), x);  // same seed and step: same token
    drawn.insert(x);
  }
  EXPECT_GT(drawn.size(), 5u);  // and different seeds really sample
}

TEST(Sampling, TopKAndTopPKeepOnlyTheHead) {
  // Probabilities 0.5, 0.3, 0.2 (and ~0 for the rest).
  std::vector<float> base = {std::log(0.2f), std::log(0.5f), std::log(0.3f), -50.0f, -50.0f};
  std::set<int32_t> p06, p05, k2;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    serve::SamplingParams p;
    p.seed = seed;
    p.top_p = 0.6f;  // 0.5 < 0.6 <= 0.8: the two most likely
    auto a = base;
    p06.insert(serve::sample_next(a, {}, 0, p, 0));
    p.top_p = 0.5f;  // reached by the first alone
    auto b = base;
    p05.insert(serve::sample_next(b, {}, 0, p, 0));
    p.top_p = 1.0f;
    p.top_k = 2;
    auto c = base;
    k2.insert(serve::sample_next(c, {}, 0, p, 0));
  }
  EXPECT_EQ(p06, (std::set<int32_t>{1, 2}));
  EXPECT_EQ(p05, (std::set<int32_t>{1}));
  EXPECT_EQ(k2, (std::set<int32_t>{1, 2}));
}

TEST(Sampling, RepetitionPenaltyFollowsTransformers) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  serve::SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 4.0f;
  const std::vector<int32_t> hist = {0, 1, 0};
  // 2 / 4 = 0.5, -2 * 4 = -8, 1 unchanged (not seen), 0.5 unchanged: argmax is token 2.
  EXPECT_EQ(serve::sample_next(l, hist, 1, p, 0), 2);
  EXPECT_FLOAT_EQ(l[0], 0.5f);
  EXPECT_FLOAT_EQ(l[1], -8.0f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
  // OpenAI penalties count generated tokens only (history after n_prompt = 1: {1, 0}).
  std::vector<float> q = {2.0f, -2.0f, 1.0f, 0.5f};
  serve::SamplingParams o;
  o.temperature = 0.0f;
  o.presence_penalty = 0.5f;
  o.frequency_penalty = 1.0f;
  serve::sample_next(q, hist, 1, o, 0);
  EXPECT_FLOAT_EQ(q[0], 0.5f);   // 2 - 0.5 - 1
  EXPECT_FLOAT_EQ(q[1], -3.5f);  // -2 - 0.5 - 1
  EXPECT_FLOAT_EQ(q[2], 1.0f);
}

TEST(Sampling, InvalidParamsNameTheField) {
  serve::SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(p.validate(), Error);
  // nan and inf in every float field: refused by name (nan passes range checks).
  for (float bad : {std::nanf(""), INFINITY, -INFINITY})
    for (const char* field :
         {"temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}) {
      serve::SamplingParams q;
      const std::string f = field;
      (f == "temperature"          ? q.temperature
       : f == "top_p"              ? q.top_p
       : f == "repetition_penalty" ? q.repetition_penalty
       : f == "presence_penalty"   ? q.presence_penalty
                                   : q.frequency_penalty) = bad;
      try {
        q.validate();
        ADD_FAILURE() << field << " " << bad << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
      }
    }
  p = {};
  p.temperature = -1.0f;
  try {
    p.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos);
  }
}

TEST(Generate, StopStringsTrimAndStreamingHoldsBackPrefixes) {
  auto m = make_model(serve_test::tiny_gpt2());
  models::GPTDecoder dec(m);
  auto tok = serve::make_byte_tokenizer();
  serve::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 24;
  const std::vector<int32_t> prompt = seq(5, 9);
  const auto free_run = serve::generate(dec, *tok, prompt, p, {});
  ASSERT_GE(free_run.text.size(), 10u);
  // Stop at a 2-byte string that first occurs at byte `at` of the free run's text.
  const size_t at = 6;
  const std::string stop = free_run.text.substr(at, 2);
  const size_t first = free_run.text.find(stop);
  p.stop = {stop, "never-appears"};
  std::string streamed;
  const auto r = serve::generate(dec, *tok, prompt, p, {}, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  EXPECT_EQ(r.text, free_run.text.substr(0, first));
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(streamed, r.text);  // pieces never included the stop string
  // Cancelling from the callback stops at once.
  int calls = 0;
  const auto c = serve::generate(dec, *tok, prompt,
                                 serve::SamplingParams{.max_tokens = 10, .temperature = 0.0f}, {},
                                 [&](std::string_view) { return ++calls < 2; });
  EXPECT_EQ(c.finish_reason, "cancelled");
}

TEST(Generate, EosEndsWithStopAndContextIsChecked) {
  auto m = make_model(serve_test::tiny_gpt2(32));
  models::GPTDecoder dec(m);
  auto tok = serve::make_byte_tokenizer();
  serve::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 8;
  const auto r = serve::generate(dec, *tok, seq(4, 1), p, {});
  ASSERT_FALSE(r.tokens.empty());
  // Declaring the first greedy token an end-of-sequence id ends the generation there.
  const auto e = serve::generate(dec, *tok, seq(4, 1), p, {r.tokens[0]});
  EXPECT_EQ(e.finish_reason, "stop");
  EXPECT_TRUE(e.tokens.empty());
  EXPECT_EQ(e.completion_tokens, 1);
  p.max_tokens = 30;  // 4 + 30 > 32
  EXPECT_THROW(serve::generate(dec, *tok, seq(4, 1), p, {}), Error);
}

TEST(Generate, Utf8TailIsHeldBack) {
  EXPECT_EQ(serve::incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(serve::incomplete_utf8_tail("a\xE4"), 1u);
  EXPECT_EQ(serve::incomplete_utf8_tail("a\xE4\xBD"), 2u);
  EXPECT_EQ(serve::incomplete_utf8_tail("a\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(serve::incomplete_utf8_tail("\xF0\x9F\x98"), 3u);
}

TEST(GenerationConfig, DefaultsAndRequestOverrides) {
  serve_test::TempDir dir("gencfg");
  std::ofstream(dir.path() / "generation_config.json")
      << R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9,
            "repetition_penalty": 1.1, "max_new_tokens": 33, "eos_token_id": [5, 7],
            "bos_token_id": 1, "transformers_version": "5.23.0"})";
  const auto d = serve::GenerationDefaults::load(dir.path());
  EXPECT_EQ(d.eos_token_ids, (std::vector<int32_t>{5, 7}));
  serve::RequestSampling req;
  auto p = req.resolve(d, 16);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.max_tokens, 33);
  req.temperature = 0.0f;
  req.max_tokens = 4;
  req.top_k = 0;
  p = req.resolve(d, 16);
  EXPECT_FLOAT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.max_tokens, 4);
  EXPECT_EQ(p.top_k, 0);
  // do_sample false means greedy unless the request sets a temperature; no file = built-ins.
  const auto g = serve::GenerationDefaults::from_json({{"do_sample", false}}, "x");
  EXPECT_FLOAT_EQ(serve::RequestSampling{}.resolve(g, 16).temperature, 0.0f);
  const auto none = serve::GenerationDefaults::load(dir.path() / "nowhere");
  EXPECT_FLOAT_EQ(serve::RequestSampling{}.resolve(none, 16).temperature, 1.0f);
  EXPECT_THROW(serve::GenerationDefaults::from_json({{"top_k", "many"}}, "x"), Error);
}

TEST(LoadModel, HfFolderAndTrainOutputDir) {
  serve_test::TempDir dir("load");
  auto m = make_model(serve_test::tiny_llama("qwen3"));
  models::export_hf(*m, dir.path() / "hf_model");
  for (const auto& path : {dir.path() / "hf_model", dir.path()}) {  // folder, or --output_dir
    auto lm = serve::load_model(path);
    EXPECT_EQ(lm.tokenizer->name(), "bytes");
    EXPECT_EQ(lm.eos_ids, (std::vector<int32_t>{256}));
    EXPECT_EQ(lm.model->config().n_kv_head, 2);
  }
  try {
    serve::load_model(dir.path() / "missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
}

// Folders that hold no model ds_serve and ds_generate can load say what they are and what to do
// (before: "holds no config.json" for a run folder and an adapter, and for mT5 the decoder
// reader's list of decoders).
TEST(LoadModel, FoldersItCannotLoadSayWhy) {
  serve_test::TempDir dir("why");
  auto write = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  };
  auto error = [](const fs::path& p) -> std::string {
    try {
      serve::load_model(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "<loaded>";
  };
  auto expect_has = [](const std::string& text, const std::string& part) {
    EXPECT_NE(text.find(part), std::string::npos) << text;
  };
  // A PEFT adapter (ds_train --only_optimize_lora), as a folder and as a run's export.
  const fs::path adapter = dir.path() / "adapter";
  write(adapter / "adapter_config.json",
        R"({"peft_type": "LORA", "task_type": "SEQ_2_SEQ_LM", "r": 4,
            "base_model_name_or_path": "/models/bart-base"})");
  write(adapter / "adapter_model.safetensors", "");
  for (const fs::path& p : {adapter, dir.path() / "lora_run"}) {
    if (p != adapter) {
      write(p / "latest", "global_step3\n");
      fs::create_directories(p / "global_step3");
      fs::copy(adapter, p / "hf_model");
    }
    const std::string e = error(p);
    expect_has(e, "is a PEFT LoRA adapter");
    expect_has(e, "/models/bart-base");
    expect_has(e, "--merge_lora");
    expect_has(e, "docs/finetuning.md");
  }
  // A ds_train run folder whose export is elsewhere (--export_hf) or not written yet.
  const fs::path run = dir.path() / "run";
  write(run / "latest", "global_step6\n");
  fs::create_directories(run / "global_step6");
  std::string e = error(run);
  expect_has(e, "is a ds_train run folder");
  expect_has(e, "--export_hf");
  expect_has(e, "ds_to_fp32 " + run.string());
  // Families we do not generate with, by model_type.
  for (const char* type : {"mt5", "umt5"}) {
    write(dir.path() / type / "config.json", fmt::format(R"({{"model_type": "{}"}})", type));
    e = error(dir.path() / type);
    expect_has(e, fmt::format("model_type \"{}\"", type));
    expect_has(e, "mT5 and UMT5 are not implemented yet");
    expect_has(e, "encoder-decoders bart, blenderbot, t5");
  }
  write(dir.path() / "bert" / "config.json", R"({"model_type": "bert"})");
  expect_has(error(dir.path() / "bert"), "an encoder classifier");
  expect_has(error(dir.path() / "nothing_here"), "is not a folder");
  fs::create_directories(dir.path() / "empty");
  expect_has(error(dir.path() / "empty"), "holds no config.json");
}

// ds_serve / ds_generate --device: a model loaded onto a device (the sim emulator) generates what
// the host's copy does, greedy and seeded sampling, under the scheduler's continuous batching
// (its logits differ from the host's by the decode kernels' rounding: Backend's linear_rows and
// decode_attention on the device, the CPU's own on the host).
TEST(LoadModel, OnADeviceGeneratesAsOnTheHost) {
  serve_test::TempDir dir("load_dev");
  models::export_hf(*make_model(serve_test::tiny_llama("qwen3")), dir.path());
  const Device sim{DeviceType::sim, 0};
  const serve::LoadedModel host = serve::load_model(dir.path());
  const serve::LoadedModel dev = serve::load_model(dir.path(), {}, sim);
  for (const auto& [name, p] : dev.model->named_parameters()) EXPECT_EQ(p.device(), sim) << name;
  const std::vector<Case> cases = mixed_cases();
  serve::Scheduler sched(dev.make_decoder(), *dev.tokenizer, {.max_batch = 4});
  std::vector<std::future<serve::GenerationResult>> futures;
  for (const Case& c : cases) futures.push_back(sched.submit({c.prompt, c.params, dev.eos_ids}));
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto dec = host.make_decoder();
    const serve::GenerationResult want =
        serve::generate(*dec, *host.tokenizer, cases[i].prompt, cases[i].params, host.eos_ids);
    const serve::GenerationResult got = futures[i].get();
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got.finish_reason, want.finish_reason) << "request " << i;
  }
}

TEST(Api, ParsesAndRejectsWithTheField) {
  using nlohmann::json;
  auto param_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return "<no error>";
  };
  EXPECT_EQ(param_of([] { serve::parse_json_body("{nope"); }), "body");
  EXPECT_EQ(param_of([] { serve::parse_json_body("[1]"); }), "body");
  // NaN and Infinity (what Python's json.dumps writes for them) are no JSON: the field is named.
  EXPECT_EQ(param_of([] { serve::parse_json_body(R"({"prompt": "x", "temperature": NaN})"); }),
            "temperature");
  EXPECT_EQ(param_of([] { serve::parse_json_body(R"({"prompt": "x", "top_p": -Infinity})"); }),
            "top_p");
  try {
    serve::parse_json_body(R"({"messages": [], "repetition_penalty": Infinity})");
  } catch (const serve::ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("'repetition_penalty' must be a finite number"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(param_of([] {
              serve::parse_completion_request({{"prompt", "x"}, {"temprature", 1}});
            }),
            "temprature");
  EXPECT_EQ(param_of([] { serve::parse_completion_request({{"prompt", 3}}); }), "prompt");
  EXPECT_EQ(param_of([] { serve::parse_completion_request({{"prompt", "x"}, {"n", 2}}); }), "n");
  EXPECT_EQ(param_of([] {
              serve::parse_chat_request({{"messages", {{{"role", "bot"}, {"content", "x"}}}}});
            }),
            "messages[0].role");
  EXPECT_EQ(param_of([] { serve::parse_chat_request({{"messages", "hi"}}); }), "messages");
  EXPECT_EQ(param_of([] {
              serve::parse_chat_request(
                  {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 1.5}});
            }),
            "max_tokens");
  EXPECT_EQ(param_of([] {
              serve::parse_guide_request({{"prompt", "x"}, {"history", {{"a"}}}});
            }),
            "history[0]");
  // Happy paths.
  const auto c = serve::parse_completion_request(
      {{"prompt", {1, 2, 3}}, {"stop", "\n"}, {"max_tokens", 5}, {"seed", 9}, {"n", 1}});
  EXPECT_EQ(c.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(c.sampling.stop, (std::vector<std::string>{"\n"}));
  const auto g = serve::parse_guide_request(
      {{"prompt", "你好"}, {"history", json::array()}, {"max_length", nullptr}});
  EXPECT_EQ(g.max_length, 2048);
  EXPECT_FLOAT_EQ(g.top_p, 0.7f);
  EXPECT_FLOAT_EQ(g.temperature, 0.95f);
  EXPECT_EQ(serve::render_chatglm({{"q", "a"}}, "p"),
            "[Round 0]\n问：q\n答：a\n[Round 1]\n问：p\n答：");
  EXPECT_EQ(serve::render_chatglm({}, "p"), "p");
}

TEST(LoadModel, HfTokenizerAndItsChatTemplate) {
  // A tiny model over the Qwen2-style tokenizer fixture (tokenizer.json with a chat template).
  const std::filesystem::path fixture =
      std::filesystem::path(DS_FIXTURE_DIR) / "tokenizers" / "qwen2_bpe";
  auto hf = data::load_tokenizer(fixture);
  auto cfg = serve_test::tiny_llama("qwen2");
  cfg.vocab_size = hf->vocab_size();
  serve_test::TempDir dir("hftok");
  models::export_hf(*make_model(cfg), dir.path());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(fixture / f, dir.path() / f);
  auto lm = serve::load_model(dir.path());
  EXPECT_EQ(lm.tokenizer->name(), "bpe");
  ASSERT_TRUE(lm.chat_template.has_value());
  EXPECT_EQ(lm.chat_template->name(), "qwen2") << lm.chat_template_note;
  const int32_t im_end = hf->token_to_id("<|im_end|>");
  ASSERT_GE(im_end, 0);
  EXPECT_NE(std::find(lm.chat_eos_ids.begin(), lm.chat_eos_ids.end(), im_end),
            lm.chat_eos_ids.end());
  // A chat prompt encodes through the template (special tokens as single ids) and generates.
  const std::vector<data::ChatMessage> conv = {{"user", "Hello"}};
  const auto ids = lm.chat_template->encode(*lm.tokenizer->hf(), conv, true).ids;
  EXPECT_NE(std::find(ids.begin(), ids.end(), im_end), ids.end());
  models::GPTDecoder dec(lm.model);
  serve::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 5;
  const auto r = serve::generate(dec, *lm.tokenizer, ids, p, lm.chat_eos_ids);
  EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_GE(r.completion_tokens, 1);
}

// ---- Greedy parity with transformers (tests/fixtures/generate,
// tests/fixtures/generators/gen_generate_fixture.py)
// ----
//
// Tiny GPT-2, LLaMA (GQA, llama3 rope), Qwen3 (q/k norm), Mixtral and Qwen3-MoE (experts),
// Phi-3 (fused qkv_proj and gate_up_proj, LongRoPE's short table), Gemma 3 (sliding windows)
// and Gemma 2 (sliding windows, soft-capping) models saved by transformers, with the ids its
// greedy generate() produced. We load the folder as ds_serve does (HF import, byte tokenizer,
// generation_config.json's eos) and must produce the same ids, token for token, through the KV
// decoder and through the uncached forward. The fixture's smallest top-1/top-2 logit gap
// (min_margin, >= 1e-3; for experts also the k-th/(k+1)-th router logit gap, min_router_gap) is
// far above fp32 rounding, so a mismatch is a real difference.
namespace {

void check_greedy_parity(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(DS_FIXTURE_DIR) / "generate" / name;
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in) << "missing " << (dir / "expected.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  serve::LoadedModel lm = serve::load_model(dir);
  EXPECT_EQ(lm.tokenizer->name(), "bytes");
  EXPECT_EQ(lm.eos_ids, std::vector<int32_t>{want["eos_token_id"].get<int32_t>()});
  models::GPTDecoder dec(lm.model);
  ASSERT_EQ(want["prompts"].size(), 4u);
  for (const auto& p : want["prompts"]) {
    const std::string text = p["text"];
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["new_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(lm.tokenizer->encode(text), ids) << name << ": " << text;
    serve::SamplingParams sp;
    sp.temperature = 0.0f;
    sp.max_tokens = want["max_new_tokens"].get<int64_t>();
    const serve::GenerationResult r = serve::generate(dec, *lm.tokenizer, ids, sp, lm.eos_ids);
    std::vector<int32_t> got = r.tokens;  // eos is not in tokens; transformers keeps it
    if (r.finish_reason == "stop") got.push_back(lm.eos_ids[0]);
    EXPECT_EQ(got, expected) << name << ", KV decoder, prompt '" << text << "'";
    // The uncached path: GPT::generate reruns the whole context each step (top_k 1 = greedy).
    std::vector<int64_t> p64(ids.begin(), ids.end());
    const std::vector<int64_t> full =
        lm.model
            ->generate(Tensor::from_ints(p64, {1, static_cast<int64_t>(ids.size())}),
                       static_cast<int64_t>(expected.size()), 1)
            .to_int_vector();
    const std::vector<int32_t> full_new(full.begin() + static_cast<ptrdiff_t>(ids.size()),
                                        full.end());
    EXPECT_EQ(full_new, expected) << name << ", uncached forward, prompt '" << text << "'";
  }
  // Continuous batching: the four prompts in one batch, each still transformers' tokens.
  serve::Scheduler sched(models::make_decoder(lm.model), *lm.tokenizer, {.max_batch = 4});
  std::atomic<bool> go{false};
  std::vector<std::future<serve::GenerationResult>> futures;
  for (const auto& p : want["prompts"]) {
    serve::GenerationRequest r{p["prompt_ids"].get<std::vector<int32_t>>(), {}, lm.eos_ids};
    r.params.temperature = 0.0f;
    r.params.max_tokens = want["max_new_tokens"].get<int64_t>();
    if (futures.empty()) r.cancelled = hold_until(go);
    futures.push_back(sched.submit(std::move(r)));
  }
  go = true;
  for (size_t i = 0; i < futures.size(); ++i) {
    const serve::GenerationResult r = futures[i].get();
    std::vector<int32_t> got = r.tokens;
    if (r.finish_reason == "stop") got.push_back(lm.eos_ids[0]);
    EXPECT_EQ(got, want["prompts"][i]["new_ids"].get<std::vector<int32_t>>())
        << name << ", batched, prompt " << i;
  }
}

}  // namespace

TEST(GreedyParity, Gpt2MatchesTransformersGenerate) {
  check_greedy_parity("gpt2");
}
TEST(GreedyParity, LlamaGqaMatchesTransformersGenerate) {
  check_greedy_parity("llama_gqa");
}
TEST(GreedyParity, Qwen3GqaMatchesTransformersGenerate) {
  check_greedy_parity("qwen3_gqa");
}
TEST(GreedyParity, Phi3LongropeMatchesTransformersGenerate) {
  check_greedy_parity("phi3");
}
// Three prompts pass original_max_position_embeddings (8) while generating: the step that does
// recomputes the sequence on LongRoPE's long table, as Phi3ForCausalLM's generate() does.
TEST(GreedyParity, Phi3LongropeSwitchMatchesTransformersGenerate) {
  check_greedy_parity("phi3_crossing");
}
// Gemma 3: two sliding-window layers (window 4) around a full one; prompts plus 32 new tokens run
// far past the window, so the decoder's windowed attention against the cache decides the tokens.
TEST(GreedyParity, Gemma3SlidingWindowMatchesTransformersGenerate) {
  check_greedy_parity("gemma3");
}
// Gemma 2: sliding and full layers alternating, attention scores and logits soft-capped.
TEST(GreedyParity, Gemma2SoftCappedMatchesTransformersGenerate) {
  check_greedy_parity("gemma2");
}
// Gemma (v1): (1 + w) norms, GeGLU and scaled embeddings under multi-query attention.
TEST(GreedyParity, GemmaMatchesTransformersGenerate) {
  check_greedy_parity("gemma");
}
// ERNIE 4.5: rotary pairs (2i, 2i+1) on the whole head, biases on every projection.
TEST(GreedyParity, Ernie45MatchesTransformersGenerate) {
  check_greedy_parity("ernie4_5");
}
// Mixtral: every block's MLP a router over 4 SwiGLU experts (top-2, weights renormalised); the
// fixture's smallest router-logit gap (min_router_gap) keeps each expert choice clear of rounding.
TEST(GreedyParity, MixtralMatchesTransformersGenerate) {
  check_greedy_parity("mixtral");
}
// Qwen3-MoE: q/k norms, 8 experts of their own width, top-2 weights not renormalised.
TEST(GreedyParity, Qwen3MoeMatchesTransformersGenerate) {
  check_greedy_parity("qwen3_moe");
}
