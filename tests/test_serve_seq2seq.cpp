// Encoder-decoders behind the decoder seam and in ds_serve: models::Seq2SeqDecoder against
// Seq2Seq::generate_greedy on the tiny transformers fixtures (tests/fixtures/hf_families/{bart_s2s,
// t5_relu_tied}), continuous batching of sequences with different source and target lengths,
// and the HTTP server serving a tiny BART built and exported in the test (byte tokenizer).
#include <gtest/gtest.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/seq2seq_decoder.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/flat.h"
#include "ds/ops/ops.h"
#include "ds/serve/api.h"
#include "ds/serve/generate.h"
#include "ds/serve/scheduler.h"
#include "hf_fixture.h"
#include "serve/server.h"
#include "serve_fixture.h"

using nlohmann::json;

namespace {

using namespace ds;

std::shared_ptr<models::Seq2Seq> import_case(const std::string& name) {
  const auto dir = ds::testing::case_dir(name);
  auto cfg = models::read_hf_seq2seq_config(dir);
  EXPECT_TRUE(cfg.has_value());
  auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(*m, dir);
  m->train(false);
  return m;
}

Tensor ids_tensor(const std::vector<int32_t>& ids) {
  return Tensor::from_ints(std::vector<int64_t>(ids.begin(), ids.end()),
                           {1, static_cast<int64_t>(ids.size())});
}

// Greedy decoding through the decoder seam, as generate_greedy decides: the processors, then the
// first largest logit, until eos or max_new tokens. -> the decoder start and the tokens.
std::vector<int64_t> seam_greedy(models::IncrementalDecoder& dec, const std::vector<int32_t>& src,
                                 const models::Seq2SeqProcessors& p) {
  std::vector<int32_t> target{dec.decoder_start_token()};
  dec.reset();
  std::vector<float> row = dec.forward(src).to_vector();
  for (int64_t step = 0; step < p.max_new_tokens; ++step) {
    p.apply(src, target, row);
    int32_t best = 0;
    for (int32_t v = 1; v < static_cast<int32_t>(row.size()); ++v)
      if (row[static_cast<size_t>(v)] > row[static_cast<size_t>(best)]) best = v;
    target.push_back(best);
    if (best == p.eos || step + 1 == p.max_new_tokens) break;
    row = dec.forward(std::span<const int32_t>(&best, 1)).to_vector();
  }
  return {target.begin(), target.end()};
}

class Seq2SeqDecoderTest : public ::testing::TestWithParam<std::string> {};

// The fixture's source rows (padding dropped), each decoded greedily through the seam (with and
// without processors) and by generate_greedy: the same tokens.
TEST_P(Seq2SeqDecoderTest, GreedyTokensEqualGenerateGreedy) {
  auto m = import_case(GetParam());
  safetensors::Reader ref((ds::testing::case_dir(GetParam()) / "reference.safetensors").string());
  const Tensor ids = ref.get("input_ids"), mask = ref.get("attention_mask");
  const int64_t B = ids.size(0), S = ids.size(1);
  const std::vector<int64_t> id = ids.to_int_vector(), mk = mask.to_int_vector();
  models::Seq2SeqDecoder dec(m);
  EXPECT_TRUE(dec.encoder_decoder());
  EXPECT_EQ(dec.decoder_start_token(), m->config().decoder_start_token_id);
  for (int settings = 0; settings < 2; ++settings) {
    models::BeamOptions b;
    b.min_length = settings == 0 ? 0 : 4;
    b.no_repeat_ngram_size = settings == 0 ? 0 : 2;
    const auto proc = models::Seq2SeqProcessors::of(b, m->config(), /*max_new_tokens=*/8);
    models::GreedyOptions g;
    g.max_new_tokens = 8;
    g.min_length = b.min_length;
    g.no_repeat_ngram_size = b.no_repeat_ngram_size;
    for (int64_t r = 0; r < B; ++r) {
      std::vector<int32_t> src;
      for (int64_t t = 0; t < S && mk[static_cast<size_t>(r * S + t)] != 0; ++t)
        src.push_back(static_cast<int32_t>(id[static_cast<size_t>(r * S + t)]));
      const std::vector<int64_t> want =
          m->generate_greedy(ids_tensor(src), Tensor(), g).to_int_vector();
      EXPECT_EQ(seam_greedy(dec, src, proc), want) << "row " << r << ", settings " << settings;
      EXPECT_EQ(dec.source_length(), static_cast<int64_t>(src.size()));
    }
  }
}

// Three sequences with sources of 3, 6 and 9 tokens and targets of 1, 2 and 3 positions step
// together: each row of decode_batch equals that sequence's forward alone, bit for bit.
TEST_P(Seq2SeqDecoderTest, DecodeBatchRowsEqualEachSequenceAlone) {
  auto m = import_case(GetParam());
  const std::vector<std::vector<int32_t>> sources = {
      {5, 9, 13}, {7, 3, 11, 20, 4, 8}, {30, 31, 12, 6, 17, 22, 9, 40, 3}};
  models::Seq2SeqDecoder proto(m);
  std::vector<std::unique_ptr<models::IncrementalDecoder>> batch, alone;
  std::vector<models::IncrementalDecoder*> ptrs;
  for (size_t i = 0; i < sources.size(); ++i) {
    batch.push_back(proto.fresh());
    alone.push_back(proto.fresh());
    batch[i]->forward(sources[i]);
    alone[i]->forward(sources[i]);
    for (size_t k = 0; k < i; ++k) {
      const int32_t t = static_cast<int32_t>(10 + k);
      batch[i]->forward(std::span<const int32_t>(&t, 1));
      alone[i]->forward(std::span<const int32_t>(&t, 1));
    }
    ptrs.push_back(batch[i].get());
  }
  const int64_t V = m->config().vocab_size;
  for (int32_t step = 0; step < 3; ++step) {
    const std::vector<int32_t> next = {40 + step, 41 + step, 42 + step};
    const Tensor rows = batch[0]->decode_batch(ptrs, next);
    ASSERT_EQ(rows.shape(), (Shape{3, V}));
    const std::vector<float> all = rows.to_vector();
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::vector<float> one =
          alone[i]->forward(std::span<const int32_t>(&next[i], 1)).to_vector();
      ASSERT_EQ(one.size(), static_cast<size_t>(V));
      EXPECT_EQ(std::memcmp(one.data(), all.data() + i * V, one.size() * sizeof(float)), 0)
          << "sequence " << i << ", step " << step;
      EXPECT_EQ(batch[i]->length(), alone[i]->length());
    }
  }
  EXPECT_EQ(batch[2]->length(), 1 + 2 + 3);
  EXPECT_GT(batch[2]->cache_bytes(), batch[0]->cache_bytes());
}

// truncate(n >= 1) keeps the source and the first n target positions; truncate(0) the source
// too; bad calls are "[generate]" errors.
TEST_P(Seq2SeqDecoderTest, TruncateAndErrors) {
  auto m = import_case(GetParam());
  models::Seq2SeqDecoder d(m);
  const std::vector<int32_t> src = {5, 9, 13, 4};
  d.forward(src);
  const int32_t a = 7, b = 9;
  d.forward(std::span<const int32_t>(&a, 1));
  const std::vector<float> before = d.forward(std::span<const int32_t>(&b, 1)).to_vector();
  EXPECT_EQ(d.length(), 3);
  d.truncate(2);
  const std::vector<float> again = d.forward(std::span<const int32_t>(&b, 1)).to_vector();
  EXPECT_EQ(before, again);
  d.truncate(0);
  EXPECT_EQ(d.length(), 0);
  EXPECT_EQ(d.source_length(), 0);
  EXPECT_EQ(d.cache_bytes(), 0);
  EXPECT_NE(ds::testing::error_of([&] { d.forward({}); }).find("[generate]"), std::string::npos);
  const int32_t bad = static_cast<int32_t>(m->config().vocab_size);
  EXPECT_NE(ds::testing::error_of([&] {
              d.forward(std::span<const int32_t>(&bad, 1));
            }).find("outside the vocabulary"),
            std::string::npos);
  auto empty = d.fresh();
  models::IncrementalDecoder* both[] = {&d, empty.get()};
  d.forward(src);
  const int32_t ids[] = {4, 4};
  EXPECT_NE(ds::testing::error_of([&] { d.decode_batch(both, ids); }).find("no source yet"),
            std::string::npos);
  // The target's positions end at capacity_limit() (BART: max_position_embeddings).
  if (!m->config().is_t5()) {
    EXPECT_EQ(d.capacity_limit(), m->config().max_positions);
    while (d.length() < d.capacity_limit()) d.forward(std::span<const int32_t>(&a, 1));
    EXPECT_NE(ds::testing::error_of([&] {
                d.forward(std::span<const int32_t>(&a, 1));
              }).find("longest target"),
              std::string::npos);
  } else {
    EXPECT_EQ(d.capacity_limit(), models::Seq2SeqDecoder::kT5MaxPositions);
  }
}

// The fixture loaded with bf16 parameters (one bf16 buffer, the fixture's fp32 values rounded to
// nearest even) and its fp32 twin: the same model with each parameter rounded to bf16 and widened.
std::pair<std::shared_ptr<models::Seq2Seq>, std::shared_ptr<models::Seq2Seq>> bf16_and_fp32_twin(
    const std::string& name) {
  const auto dir = ds::testing::case_dir(name);
  auto m16 = std::make_shared<models::Seq2Seq>(*models::read_hf_seq2seq_config(dir), false);
  nn::flatten_parameters(*m16, DType::bf16, DType::f32, 1, /*with_grads=*/false);
  models::load_hf_seq2seq_weights(*m16, dir);
  m16->train(false);
  auto m32 = import_case(name);
  for (auto& [n, p] : m32->named_parameters()) p.copy_from(p.to(DType::bf16));
  return {m16, m32};
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The gap between the largest and the second largest entry.
float top2_gap(const std::vector<float>& v) {
  float a = -INFINITY, b = -INFINITY;
  for (float x : v) {
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

// A bf16 encoder-decoder decodes with bf16 weights, a bf16 encoder and bf16 self- and
// cross-attention caches (half the fp32 caches' bytes), and tracks the fp32 run of the same
// bf16-rounded weights (GPTDecoder.Bf16TracksFp32Twin*'s test): teacher-forced on the fp32 run's
// greedy tokens, every step's logits are within kTol of the fp32 ones, and the greedy choice is
// the same wherever the fp32 run's top two logits are further apart than twice that step's
// largest difference. Free-running, the bf16 greedy tokens (through the seam and by
// generate_greedy) equal the fp32 ones up to the first such near tie, and beam search
// (Seq2Seq::generate, ds_generate's path) runs in bf16.
TEST_P(Seq2SeqDecoderTest, Bf16TracksFp32Twin) {
  // bf16 activations round by up to 2^-9 relative at each op of the encoder and the decoder:
  // measured max logit differences in the printed line, this about 3x the largest.
  constexpr float kTol = 0.15f;
  constexpr int kNew = 12;
  const auto [m16, m32] = bf16_and_fp32_twin(GetParam());
  for (const auto& [name, p] : m16->named_parameters()) ASSERT_EQ(p.dtype(), DType::bf16) << name;
  const std::vector<int32_t> src = {5, 9, 13, 4, 17, 22, 8};
  models::BeamOptions b;
  b.eos_token_id = -1;  // kNew tokens whatever the model says
  b.forced_eos_token_id = -1;
  const auto proc = models::Seq2SeqProcessors::of(b, m32->config(), kNew);
  models::Seq2SeqDecoder d32(m32), d16(m16);
  const std::vector<int64_t> g32 = seam_greedy(d32, src, proc), g16 = seam_greedy(d16, src, proc);
  ASSERT_EQ(g32.size(), static_cast<size_t>(kNew + 1));
  EXPECT_EQ(2 * d16.cache_bytes(), d32.cache_bytes());
  EXPECT_EQ(2 * d16.cache_bytes_limit(), d32.cache_bytes_limit());
  // Teacher-forced: both decoders read the fp32 run's target.
  d32.reset();
  d16.reset();
  std::vector<float> l32 = d32.forward(src).to_vector(), l16 = d16.forward(src).to_vector();
  float worst = 0.0f;
  int first_tie = kNew;
  for (int s = 0; s < kNew; ++s) {
    const int32_t t = static_cast<int32_t>(g32[static_cast<size_t>(s + 1)]);
    float diff = 0.0f;
    for (size_t v = 0; v < l32.size(); ++v) diff = std::max(diff, std::abs(l32[v] - l16[v]));
    worst = std::max(worst, diff);
    EXPECT_LT(diff, kTol) << "step " << s;
    ASSERT_EQ(argmax(l32), t) << "step " << s;
    // No logit moved by more than diff: the top one stays on top when it leads by more than 2 diff.
    if (top2_gap(l32) > 2 * diff)
      EXPECT_EQ(argmax(l16), t) << "step " << s;
    else
      first_tie = std::min(first_tie, s);
    l32 = d32.forward(std::span(&t, 1)).to_vector();
    l16 = d16.forward(std::span(&t, 1)).to_vector();
  }
  models::GreedyOptions g;
  g.max_new_tokens = kNew;
  g.eos_token_id = -1;
  g.forced_eos_token_id = -1;
  const std::vector<int64_t> gen16 = m16->generate_greedy(ids_tensor(src), Tensor(), g).to_int_vector();
  ASSERT_EQ(gen16.size(), g32.size());
  for (int s = 0; s <= first_tie; ++s) {
    EXPECT_EQ(g16[static_cast<size_t>(s)], g32[static_cast<size_t>(s)]) << "step " << s;
    EXPECT_EQ(gen16[static_cast<size_t>(s)], g32[static_cast<size_t>(s)]) << "step " << s;
  }
  models::BeamOptions beam;
  beam.num_beams = 3;
  beam.max_new_tokens = kNew;
  const std::vector<int64_t> b32 = m32->generate(ids_tensor(src), Tensor(), beam).to_int_vector(),
                             b16 = m16->generate(ids_tensor(src), Tensor(), beam).to_int_vector();
  ASSERT_FALSE(b16.empty());
  EXPECT_EQ(b16[0], m16->config().decoder_start_token_id);
  std::printf(
      "%s: bf16 vs fp32 logits max |diff| %.4f, greedy tokens equal for the first %d of %d (first "
      "near tie at %d); beam search (3 beams) %s\n",
      GetParam().c_str(), worst,
      static_cast<int>(std::mismatch(g16.begin(), g16.end(), g32.begin()).first - g16.begin()) - 1,
      kNew, first_tie, b16 == b32 ? "the same tokens" : "different tokens");
}

INSTANTIATE_TEST_SUITE_P(Families, Seq2SeqDecoderTest,
                         ::testing::Values("bart_s2s", "blenderbot_s2s", "t5_relu_tied"));

// ---- ds_serve over a tiny BART (vocabulary 257: the byte tokenizer) ----

class ServeSeq2Seq : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new serve_test::TempDir("s2s");
    models::Seq2SeqConfig c = serve_test::tiny_bart_config(257, 48);
    c.eos_token_id = c.decoder_start_token_id = c.forced_eos_token_id = 256;
    c.seed = 5;
    models::Seq2Seq m(c);
    {  // logits far from ties, and only printable ASCII (or the end) can win: readable answers
      autograd::NoGradGuard no_grad;
      for (auto& [name, p] : m.named_parameters()) {
        if (p.dim() == 2) ops::mul_(p, 8.0f);
        if (name == "model.shared.weight")
          for (int64_t v = 0; v < 256; ++v)
            if (v < 32 || v > 126) {
              float* row = p.data<float>() + v * c.d_model;
              std::fill(row, row + c.d_model, 0.0f);
            }
      }
    }
    const auto folder = dir_->path() / "bart";
    models::export_hf_seq2seq(m, folder);
    // The generation settings the server must apply as generate_greedy does.
    std::ofstream(folder / "generation_config.json")
        << R"({"max_length": 11, "min_length": 4, "no_repeat_ngram_size": 2})";
    ref_ = new serve::LoadedModel(serve::load_model(folder));
    serve::ServerOptions o;
    o.port = 0;
    o.log_requests = false;
    o.max_batch = 4;
    server_ = new serve::Server(serve::load_model(folder), o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->run(); });
    httplib::Client cl("127.0.0.1", port_);
    for (int i = 0; i < 200; ++i) {
      if (auto r = cl.Get("/health"); r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete ref_;
    delete dir_;
  }

  // generate_greedy's answer to a source text, decoded.
  static std::string greedy_text(const std::string& source, int64_t max_new) {
    const std::vector<int32_t> src = ref_->tokenizer->encode(source);
    models::GreedyOptions g;
    g.max_new_tokens = max_new;
    g.min_length = 4;
    g.no_repeat_ngram_size = 2;
    const std::vector<int64_t> out =
        ref_->seq2seq->generate_greedy(ids_tensor(src), Tensor(), g).to_int_vector();
    std::vector<int32_t> tokens;
    for (size_t k = 1; k < out.size() && out[k] != 256; ++k)
      tokens.push_back(static_cast<int32_t>(out[k]));
    return ref_->tokenizer->decode(tokens);
  }

  static std::pair<int, json> post(const std::string& path, const json& body) {
    httplib::Client cl("127.0.0.1", port_);
    cl.set_read_timeout(60, 0);
    auto r = cl.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  static serve_test::TempDir* dir_;
  static serve::LoadedModel* ref_;
  static serve::Server* server_;
  static std::thread* thread_;
  static int port_;
};
serve_test::TempDir* ServeSeq2Seq::dir_ = nullptr;
serve::LoadedModel* ServeSeq2Seq::ref_ = nullptr;
serve::Server* ServeSeq2Seq::server_ = nullptr;
std::thread* ServeSeq2Seq::thread_ = nullptr;
int ServeSeq2Seq::port_ = 0;

TEST_F(ServeSeq2Seq, LoadsAsAnEncoderDecoder) {
  ASSERT_NE(ref_->seq2seq, nullptr);
  EXPECT_EQ(ref_->model, nullptr);
  EXPECT_EQ(ref_->seq2seq_options.max_new_tokens, 10);
  EXPECT_FALSE(ref_->chat_template.has_value());
  EXPECT_TRUE(ref_->make_decoder()->encoder_decoder());
}

// A completion is generate_greedy's text (the generation_config's processors applied), with
// max_tokens given or the generation_config's (max_length - 1); streamed, the same text.
TEST_F(ServeSeq2Seq, CompletionEqualsGenerateGreedy) {
  for (const std::string prompt : {"hello there", "What is the answer?"}) {
    auto [status, j] =
        post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}});
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], greedy_text(prompt, 8)) << prompt;
    EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(prompt.size()));
    // No temperature: greedy (transformers' do_sample false), max_tokens 10.
    auto [s2, j2] = post("/v1/completions", {{"prompt", prompt}});
    ASSERT_EQ(s2, 200) << j2.dump();
    EXPECT_EQ(j2["choices"][0]["text"], greedy_text(prompt, 10)) << prompt;
  }
  httplib::Client cl("127.0.0.1", port_);
  auto r = cl.Post("/v1/completions",
                   json{{"prompt", "hello there"}, {"max_tokens", 8}, {"stream", true}}.dump(),
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string streamed;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string data = r->body.substr(pos + 6, end - pos - 6);
    if (data != "[DONE]") streamed += json::parse(data)["choices"][0].value("text", "");
    pos = end;
  }
  EXPECT_EQ(streamed, greedy_text("hello there", 8));
}

// Two requests at once share decode steps and get what each gets alone.
TEST_F(ServeSeq2Seq, ConcurrentRequestsGetTheirAnswersAlone) {
  const std::vector<std::string> prompts = {"a short one", "and a longer source text here"};
  std::vector<std::future<std::pair<int, json>>> f;
  for (const auto& p : prompts)
    f.push_back(std::async(std::launch::async, [p] {
      return post("/v1/completions", {{"prompt", p}, {"max_tokens", 10}, {"temperature", 0}});
    }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [status, j] = f[i].get();
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], greedy_text(prompts[i], 10)) << prompts[i];
  }
}

// Chat and the guide's POST /: the conversation joined as BlenderBot does is the source.
TEST_F(ServeSeq2Seq, ChatAndGuideRenderTheConversationAsTheSource) {
  const std::vector<serve::ChatMessage> conv = {
      {"user", "Hi!"}, {"assistant", "Hello, how are you?"}, {"user", "Fine."}};
  EXPECT_EQ(serve::render_blenderbot(conv), " Hi!  Hello, how are you?   Fine.");
  json messages = json::array();
  for (const auto& msg : conv) messages.push_back({{"role", msg.role}, {"content", msg.content}});
  auto [status, j] =
      post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["content"], greedy_text(serve::render_blenderbot(conv), 6));
  auto [gs, g] = post("/", {{"prompt", "Fine."},
                            {"history", json::array({json::array({"Hi!", "Hello, how are you?"})})},
                            {"max_length", 7},
                            {"temperature", 0.01},
                            {"top_p", 0.01}});
  ASSERT_EQ(gs, 200) << g.dump();
  EXPECT_EQ(g["response"], greedy_text(serve::render_blenderbot(conv), 6));
}

// Sources and targets over the model's 48 positions are clear 400s; the server keeps serving.
TEST_F(ServeSeq2Seq, OverlongRequestsAre400s) {
  auto [s1, j1] = post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 48}});
  EXPECT_EQ(s1, 400) << j1.dump();
  EXPECT_EQ(j1["error"]["param"], "max_tokens");
  EXPECT_EQ(j1["error"]["code"], "context_length_exceeded");
  EXPECT_NE(j1["error"]["message"].get<std::string>().find("at most 47"), std::string::npos)
      << j1.dump();
  auto [s2, j2] = post("/v1/completions", {{"prompt", std::string(49, 'x')}, {"max_tokens", 4}});
  EXPECT_EQ(s2, 400) << j2.dump();
  EXPECT_EQ(j2["error"]["param"], "prompt");
  EXPECT_EQ(j2["error"]["code"], "context_length_exceeded");
  auto [s3, j3] = post("/", {{"prompt", "hi"}, {"max_length", 1}});
  EXPECT_EQ(s3, 400) << j3.dump();
  auto [s4, j4] =
      post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 47}, {"temperature", 0}});
  EXPECT_EQ(s4, 200) << j4.dump();
}

// The scheduler alone with a sampling request: a seed gives the same text again.
TEST_F(ServeSeq2Seq, SamplingIsSeeded) {
  serve::Scheduler sched(ref_->make_decoder(), *ref_->tokenizer, {.max_batch = 2});
  serve::SamplingParams p;
  p.max_tokens = 6;
  p.temperature = 1.0f;
  p.seed = 3;
  auto run = [&] {
    serve::GenerationRequest r;
    r.prompt = ref_->tokenizer->encode("sample me");
    r.params = p;
    r.eos_ids = ref_->eos_ids;
    return sched.submit(std::move(r));
  };
  auto a = run(), b = run();
  const serve::GenerationResult ra = a.get(), rb = b.get();
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_FALSE(ra.tokens.empty());
}

}  // namespace
