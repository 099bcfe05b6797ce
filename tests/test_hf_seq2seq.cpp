// Encoder-decoders (ds/models/seq2seq.h, seq2seq_io.h) against transformers'
// BartForConditionalGeneration, BlenderbotForConditionalGeneration and T5ForConditionalGeneration:
// tests/fixtures/hf_families/{bart_s2s,bart_relu_scaled,blenderbot_s2s,t5_relu_tied,
// t5_gated_untied} are folders as
// transformers 5 saved them, with transformers' float64 logits, loss, every gradient and greedy
// generation for a padded batch (tests/fixtures/generators/gen_seq2seq_fixture.py). Each is imported through the
// public path, compared, exported and re-imported; bad config fields are refused by name; the
// engine trains the model under ZeRO-2 and ZeRO-3.
//
// Error measure and tolerance as in test_hf_encoders: per tensor max|ours - ref| / max|ref| <=
// 1e-5, computing in fp32 from the same fp32 weights the float64 reference used.
//
// With DS_HF_EXPORT_DIR set, the export of every case is also left in $DS_HF_EXPORT_DIR/<case>
// for `tests/fixtures/generators/gen_seq2seq_fixture.py --check-export` (transformers loads it, same logits).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "device_parity.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_decoder.h"
#include "ds/models/seq2seq_io.h"
#include "ds/runtime/engine.h"
#include "hf_fixture.h"

using namespace ds;
namespace fs = std::filesystem;
using nlohmann::json;

using ds::testing::case_dir;
using ds::testing::error_of;
using ds::testing::rel_err;

namespace {

constexpr double kTol = 1e-5;  // see the header comment

std::shared_ptr<models::Seq2Seq> import(const fs::path& dir) {
  auto cfg = models::read_hf_seq2seq_config(dir);
  EXPECT_TRUE(cfg.has_value());
  auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(*m, dir);
  m->train(false);  // the reference ran in eval mode
  return m;
}

class HFSeq2Seq : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = std::make_unique<safetensors::Reader>(
        (case_dir(GetParam()) / "reference.safetensors").string());
  }
  models::Seq2SeqInputs batch() const {
    return {ref_->get("input_ids"), ref_->get("attention_mask"), {}, ref_->get("labels")};
  }
  bool t5() const { return GetParam().rfind("t5", 0) == 0; }
  std::unique_ptr<safetensors::Reader> ref_;
};

TEST_P(HFSeq2Seq, ConfigIsReadAsTransformersReadsIt) {
  const models::Seq2SeqConfig c = *models::read_hf_seq2seq_config(case_dir(GetParam()));
  if (t5()) {
    const bool gated = GetParam() == "t5_gated_untied";
    EXPECT_EQ(c.family, "t5");
    EXPECT_EQ(c.d_model, 32);
    EXPECT_EQ(c.d_kv, gated ? 8 : 12);
    EXPECT_EQ(c.encoder_layers, gated ? 2 : 3);
    EXPECT_EQ(c.decoder_layers, 2);
    EXPECT_EQ(c.encoder_heads, 4);
    EXPECT_EQ(c.encoder_ffn, gated ? 48 : 40);
    EXPECT_EQ(c.relative_buckets, gated ? 16 : 8);
    EXPECT_EQ(c.relative_max_distance, gated ? 20 : 6);
    EXPECT_EQ(c.gated_ffn, gated);
    EXPECT_EQ(c.activation, gated ? "gelu_new" : "relu");
    EXPECT_EQ(c.tie_word_embeddings, !gated);
    EXPECT_EQ(c.scale_decoder_outputs, !gated);
    EXPECT_EQ(c.dropout, 0.1f);
    EXPECT_EQ(c.attention_dropout, 0.1f);
    EXPECT_EQ(c.norm_eps, 1e-6f);
    EXPECT_EQ(c.pad_token_id, 0);
    EXPECT_EQ(c.eos_token_id, 1);
    EXPECT_EQ(c.decoder_start_token_id, 0);
    EXPECT_EQ(c.forced_eos_token_id, -1);
    auto m = import(case_dir(GetParam()));
    EXPECT_EQ(m->num_parameters(), c.num_parameters());
    EXPECT_FALSE(m->final_logits_bias().defined());
    return;
  }
  const bool blender = GetParam() == "blenderbot_s2s";
  EXPECT_EQ(c.family, blender ? "blenderbot" : "bart");
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.vocab_size, 64);
  EXPECT_EQ(c.pre_norm, blender);
  EXPECT_EQ(c.final_norm, blender);
  EXPECT_EQ(c.embedding_norm, !blender);
  EXPECT_EQ(c.position_offset, blender ? 0 : 2);
  EXPECT_EQ(c.pad_token_id, blender ? 0 : 1);
  EXPECT_EQ(c.decoder_start_token_id, blender ? 1 : 2);
  EXPECT_EQ(c.scale_embedding, GetParam() != "bart_s2s");
  EXPECT_EQ(c.activation, GetParam() == "bart_relu_scaled" ? "relu" : "gelu");
  if (GetParam() == "bart_s2s") {
    EXPECT_EQ(c.encoder_heads, 4);
    EXPECT_EQ(c.decoder_heads, 2);
    EXPECT_EQ(c.encoder_ffn, 40);
    EXPECT_EQ(c.decoder_ffn, 48);
  }
  auto m = import(case_dir(GetParam()));
  EXPECT_EQ(m->num_parameters(), c.num_parameters());
}

TEST(HFSeq2SeqShift, ShiftTokensRightAsTransformers) {
  const Tensor labels = Tensor::from_ints({5, 6, 2, -100, 7, 2, -100, -100}, {2, 4});
  EXPECT_EQ(models::shift_tokens_right(labels, 1, 2).to_int_vector(),
            (std::vector<int64_t>{2, 5, 6, 2, 2, 7, 2, 1}));
}

TEST_P(HFSeq2Seq, LogitsLossAndEveryGradientMatchTransformers) {
  auto m = import(case_dir(GetParam()));
  const models::Seq2SeqInputs in = batch();
  const double e_logits = rel_err(m->logits(in).to_vector(), ref_->get("logits").to_vector());
  EXPECT_LE(e_logits, kTol) << "logits";
  Tensor loss = m->loss(in);
  const double ref_loss = ref_->get("loss").item();
  const double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(e_loss, kTol) << "loss " << loss.item() << " vs " << ref_loss;
  loss.backward();
  size_t in_file = 0;
  for (const auto& e : ref_->entries()) in_file += e.name.rfind("grad.", 0) == 0;
  const auto named = m->named_parameters();
  EXPECT_EQ(named.size(), in_file) << "our parameters and transformers' differ";
  // As in test_hf_encoders: the k_proj biases' gradients are zero in exact arithmetic (softmax
  // ignores a constant added to a query's scores); they are measured against the largest
  // gradient of the model.
  double largest = 0.0;
  for (const auto& [name, p] : named)
    for (float v : ref_->get("grad." + name).to_vector())
      largest = std::max(largest, std::abs(static_cast<double>(v)));
  double worst = 0.0, worst_zero = 0.0;
  std::string worst_name;
  for (const auto& [name, p] : named) {
    ASSERT_TRUE(p.grad().defined()) << name << " got no gradient";
    ASSERT_TRUE(ref_->contains("grad." + name)) << name;
    const std::vector<float> ours = p.grad().to_vector(),
                             ref = ref_->get("grad." + name).to_vector();
    double ref_max = 0.0, diff = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ref_max = std::max(ref_max, std::abs(static_cast<double>(ref[i])));
      diff = std::max(diff, std::abs(static_cast<double>(ours[i]) - ref[i]));
    }
    if (ref_max < 1e-10 * largest) {
      EXPECT_NE(name.find("k_proj.bias"), std::string::npos)
          << name << ": an unexpected all-zero gradient";
      EXPECT_LE(diff / largest, kTol) << "gradient of " << name << " (zero in exact arithmetic)";
      worst_zero = std::max(worst_zero, diff / largest);
      continue;
    }
    const double e = rel_err(ours, ref);
    EXPECT_LE(e, kTol) << "gradient of " << name;
    if (e > worst) worst = e, worst_name = name;
  }
  std::printf("%s: logits %.2e, loss %.2e, worst gradient %.2e (%s), zero-gradients %.2e\n",
              GetParam().c_str(), e_logits, e_loss, worst, worst_name.c_str(), worst_zero);
}

// Training with attention_dropout forms the probabilities (softmax of masked scores, then
// dropout) instead of running the fused kernel, in the encoder, the causal decoder and the
// cross-attention. At p = 1e-7 nothing is dropped in this batch, so that path is transformers'
// eager attention: the same logits and loss, the 1/(1-p) scaling adding ~1e-7.
TEST_P(HFSeq2Seq, AttentionDropoutPathMatchesTransformers) {
  auto cfg = models::read_hf_seq2seq_config(case_dir(GetParam()));
  cfg->dropout = cfg->activation_dropout = 0.0f;
  cfg->attention_dropout = 1e-7f;
  if (t5()) cfg->dropout = cfg->activation_dropout = 1e-7f;  // T5 has one dropout_rate
  models::Seq2Seq m(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(m, case_dir(GetParam()));
  m.train(false);
  const std::vector<float> fused = m.logits(batch()).to_vector();
  m.train(true);
  const std::vector<float> formed = m.logits(batch()).to_vector();
  EXPECT_NE(formed, fused);  // another computation: the formed path ran
  EXPECT_LE(rel_err(formed, ref_->get("logits").to_vector()), kTol);
  const double ref = ref_->get("loss").item();
  EXPECT_LE(std::abs(m.loss(batch()).item() - ref) / ref, kTol);
}

// Gradient checkpointing of every layer (the decoder's take [x, encoder output] packed) gives the
// same loss and gradients as the plain forward.
TEST_P(HFSeq2Seq, GradientCheckpointingGivesTheSameGradients) {
  std::vector<std::vector<float>> grads[2];
  float losses[2];
  for (int ck = 0; ck < 2; ++ck) {
    auto m = import(case_dir(GetParam()));
    m->set_gradient_checkpointing(ck == 1);
    Tensor loss = m->loss(batch());
    loss.backward();
    losses[ck] = static_cast<float>(loss.item());
    for (const auto& [name, p] : m->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name << " got no gradient (checkpointing " << ck << ")";
      grads[ck].push_back(p.grad().to_vector());
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  // The k_proj biases' gradients are fp32 rounding noise around zero (~1e-9; see above): tensors
  // that small are measured against the largest gradient of the model.
  double largest = 0.0;
  for (const auto& g : grads[0])
    for (float v : g) largest = std::max(largest, std::abs(static_cast<double>(v)));
  for (size_t i = 0; i < grads[0].size(); ++i) {
    double own = 0.0, diff = 0.0;
    for (size_t k = 0; k < grads[0][i].size(); ++k) {
      own = std::max(own, std::abs(static_cast<double>(grads[0][i][k])));
      diff = std::max(diff, std::abs(static_cast<double>(grads[1][i][k]) - grads[0][i][k]));
    }
    EXPECT_LE(diff / (own < 1e-6 * largest ? largest : own), 1e-6) << "parameter " << i;
  }
}

// The pad row of model.shared gets a gradient from the tied lm_head only: the same as
// transformers' (checked above) and different from the other rows' embedding path. Here: padded
// source tokens do not change the logits of the real ones.
TEST_P(HFSeq2Seq, SourcePaddingIsMasked) {
  auto m = import(case_dir(GetParam()));
  models::Seq2SeqInputs in = batch();
  const std::vector<float> before = m->logits(in).to_vector();
  std::vector<int64_t> ids = in.input_ids.to_int_vector();
  const std::vector<int64_t> mask = in.attention_mask.to_int_vector();
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i] == 0) ids[i] = 5;  // any other token where the mask is 0
  in.input_ids = Tensor::from_ints(ids, in.input_ids.shape());
  EXPECT_LE(rel_err(m->logits(in).to_vector(), before), 1e-6);
}

// generate(num_beams=1, do_sample=False, max_new_tokens=8) token for token, with the KV cache and
// recomputing the prefix; then with an eos that ends row 0 early (its later tokens are pad).
TEST_P(HFSeq2Seq, GreedyGenerationMatchesTransformers) {
  auto m = import(case_dir(GetParam()));
  models::GreedyOptions opt;
  opt.max_new_tokens = std::stoll(ref_->metadata().at("max_new_tokens"));
  for (bool cache : {true, false}) {
    opt.use_cache = cache;
    opt.eos_token_id = -2;  // the config's
    Tensor want = ref_->get("generated");
    Tensor got = m->generate_greedy(ref_->get("input_ids"), ref_->get("attention_mask"), opt);
    EXPECT_EQ(got.shape(), want.shape()) << "use_cache " << cache;
    EXPECT_EQ(got.to_int_vector(), want.to_int_vector()) << "use_cache " << cache;
    opt.eos_token_id = std::stoll(ref_->metadata().at("generated_eos"));
    want = ref_->get("generated_eos");
    got = m->generate_greedy(ref_->get("input_ids"), ref_->get("attention_mask"), opt);
    EXPECT_EQ(got.shape(), want.shape()) << "use_cache " << cache << ", eos " << opt.eos_token_id;
    EXPECT_EQ(got.to_int_vector(), want.to_int_vector())
        << "use_cache " << cache << ", eos " << opt.eos_token_id;
  }
}

// generate(num_beams, length_penalty, no_repeat_ngram_size, encoder_no_repeat_ngram_size,
// min_length, early_stopping false / true / never, forced eos) token for token, with the KV
// cache (reordered with the beams) and recomputing the prefix. The settings are the generator's
// BEAMS; "early" ends hypotheses early with an eos the model emits often.
TEST_P(HFSeq2Seq, BeamSearchMatchesTransformers) {
  auto m = import(case_dir(GetParam()));
  struct Setting {
    const char* name;
    models::BeamOptions opt;
  };
  std::vector<Setting> settings(3);
  settings[0] = {"a", {}};
  settings[0].opt.num_beams = 4;
  settings[0].opt.length_penalty = 0.8f;
  settings[0].opt.no_repeat_ngram_size = 2;
  settings[0].opt.min_length = 3;
  settings[0].opt.early_stopping = "false";
  settings[1] = {"b", {}};
  settings[1].opt.num_beams = 3;
  settings[1].opt.length_penalty = 1.5f;
  settings[1].opt.encoder_no_repeat_ngram_size = 2;
  settings[1].opt.early_stopping = "true";
  settings[2] = {"c", {}};
  settings[2].opt.num_beams = 2;
  settings[2].opt.length_penalty = -0.5f;
  settings[2].opt.no_repeat_ngram_size = 3;
  settings[2].opt.early_stopping = "never";
  for (auto& [name, opt] : settings) {
    const std::string key = std::string("beam_") + name;
    opt.max_new_tokens = std::stoll(ref_->metadata().at("max_new_tokens"));
    opt.eos_token_id = std::stoll(ref_->metadata().at(key + "_eos"));
    const Tensor want = ref_->get(key);
    for (bool cache : {true, false}) {
      opt.use_cache = cache;
      const Tensor got = m->generate_beam(ref_->get("input_ids"), ref_->get("attention_mask"), opt);
      EXPECT_EQ(got.shape(), want.shape()) << key << ", use_cache " << cache;
      EXPECT_EQ(got.to_int_vector(), want.to_int_vector()) << key << ", use_cache " << cache;
    }
  }
}

// Greedy decoding with transformers' n-gram and min-length processors, through generate() with
// num_beams 1.
TEST_P(HFSeq2Seq, GreedyWithProcessorsMatchesTransformers) {
  auto m = import(case_dir(GetParam()));
  models::BeamOptions opt;
  opt.num_beams = 1;
  opt.max_new_tokens = std::stoll(ref_->metadata().at("max_new_tokens"));
  opt.min_length = 4;
  opt.no_repeat_ngram_size = 2;
  opt.encoder_no_repeat_ngram_size = 2;
  const Tensor want = ref_->get("greedy_proc");
  m->train(true);  // generation runs in eval mode and gives the mode back
  const Tensor got = m->generate(ref_->get("input_ids"), ref_->get("attention_mask"), opt);
  EXPECT_TRUE(m->is_training());
  EXPECT_EQ(got.shape(), want.shape());
  EXPECT_EQ(got.to_int_vector(), want.to_int_vector());
}

// The KV-cached decoder step computes the logits of the whole-prefix decoder.
TEST_P(HFSeq2Seq, CachedStepsGiveTheFullDecoderLogits) {
  auto m = import(case_dir(GetParam()));
  const Tensor ids = ref_->get("input_ids"), mask = ref_->get("attention_mask");
  models::GreedyOptions opt;
  opt.max_new_tokens = 6;
  opt.eos_token_id = opt.forced_eos_token_id = -1;        // six steps, every row
  const Tensor seq = m->generate_greedy(ids, mask, opt);  // (B, 7), with the cache
  const Tensor full = m->decode(seq, m->encode(ids, mask), mask);
  // The greedy choice at every position is the full decoder's argmax.
  const std::vector<float> lg = full.to_vector();
  const std::vector<int64_t> s = seq.to_int_vector();
  const int64_t B = seq.size(0), T = seq.size(1), V = full.size(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = lg.data() + (b * T + t) * V;
      EXPECT_EQ(std::max_element(row, row + V) - row, s[b * T + t + 1]) << b << ", " << t;
    }
}

TEST_P(HFSeq2Seq, ExportRoundTrip) {
  auto a = import(case_dir(GetParam()));
  const char* keep = std::getenv("DS_HF_EXPORT_DIR");
  const fs::path dir = keep ? fs::path(keep) / GetParam()
                            : fs::temp_directory_path() /
                                  ("ds_hf_s2s_" + std::to_string(::getpid()) + "_" + GetParam());
  models::export_hf_seq2seq(*a, dir);
  std::ifstream in(dir / "config.json");
  json j = json::parse(in);
  EXPECT_EQ(j.value("dtype", ""), "float32");
  // The Hugging Face fields alone (without our "ds_cpp" block) describe the same model.
  json hf_only = j;
  hf_only.erase("ds_cpp");
  EXPECT_EQ(models::seq2seq_config_from_json(hf_only).to_json(), a->config().to_json())
      << hf_only.dump(1);
  auto b = import(dir);
  EXPECT_EQ(b->config().to_json(), a->config().to_json());
  EXPECT_EQ(a->logits(batch()).to_vector(), b->logits(batch()).to_vector());
  if (t5()) {
    EXPECT_FALSE(b->final_logits_bias().defined());
    // transformers' names, lm_head.weight only when untied, no final_logits_bias.
    safetensors::Reader r((dir / "model.safetensors").string());
    EXPECT_EQ(r.contains("lm_head.weight"), !a->config().tie_word_embeddings);
    EXPECT_FALSE(r.contains("final_logits_bias"));
    EXPECT_TRUE(r.contains("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"));
    EXPECT_EQ(j.value("tie_word_embeddings", true), a->config().tie_word_embeddings);
  } else {
    EXPECT_EQ(a->final_logits_bias().to_vector(), b->final_logits_bias().to_vector());
  }
  if (!keep) fs::remove_all(dir);
}

// A few steps through the engine under ZeRO-2 and ZeRO-3 (one process; ZeRO-3 gathers every
// parameter before its module's forward and releases it after), and ZeRO-3 with gradient
// checkpointing: the first loss is transformers', all take the same steps, and the loss goes down.
TEST_P(HFSeq2Seq, TrainsUnderTheEngineWithZeRO2And3) {
  std::vector<std::vector<float>> runs;
  // ZeRO-2, ZeRO-3, and ZeRO-3 with every layer checkpointed (recomputation gathers again).
  for (int run : {0, 1, 2}) {
    const int stage = run == 0 ? 2 : 3;
    auto cfg = models::read_hf_seq2seq_config(case_dir(GetParam()));
    cfg->dropout = cfg->attention_dropout = cfg->activation_dropout = 0.0f;  // eval math
    auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
    models::load_hf_seq2seq_weights(*m, case_dir(GetParam()));
    m->set_gradient_checkpointing(run == 2);
    const models::Seq2SeqInputs in = batch();
    runtime::InitOptions opt;
    opt.log = [](const std::string&) {};  // the default loss: Seq2Seq::loss of the named batch
    auto engine = runtime::initialize(m,
                                      fmt::format(R"({{
      "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
      "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.1}}}},
      "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 0}}}})",
                                                  stage),
                                      opt);
    std::vector<float> losses;
    for (int step = 0; step < 5; ++step) {
      Tensor loss = engine->forward(nn::Batch{
          .input_ids = in.input_ids, .labels = in.labels, .attention_mask = in.attention_mask});
      engine->backward(loss);
      engine->step();
      losses.push_back(static_cast<float>(loss.item()));
    }
    const double ref = ref_->get("loss").item();
    EXPECT_LE(std::abs(losses[0] - ref) / ref, kTol) << "stage " << stage;
    EXPECT_LT(losses.back(), losses.front()) << "stage " << stage;
    runs.push_back(losses);
  }
  EXPECT_LE(rel_err(runs[1], runs[0]), 1e-5);
  EXPECT_LE(rel_err(runs[2], runs[1]), 1e-6) << "checkpointed";
  std::printf("%s: ZeRO-2/3 losses %.4f -> %.4f over 5 AdamW steps\n", GetParam().c_str(),
              runs[1].front(), runs[1].back());
}

// A fresh model (init from the seed) built whole and built piecewise under nn::PartitionedInit
// (ZeRO-3 drawing each shard from init_parameter_range) trains the same under ZeRO-3, through the
// engine's default loss function (Seq2Seq::loss(ids, labels): an unpadded source).
TEST(HFSeq2SeqEngine, PartitionedInitMatchesWholeInit) {
  auto cfg = *models::read_hf_seq2seq_config(case_dir("blenderbot_s2s"));
  cfg.dropout = 0.0f;
  cfg.seed = 7;
  const Tensor ids = Tensor::from_ints({5, 6, 7, 8, 9, 10, 11, 12}, {2, 4});
  const Tensor labels = Tensor::from_ints({13, 14, 2, 15, 16, 2}, {2, 3});
  std::vector<std::vector<float>> runs;
  for (bool pieces : {false, true}) {
    std::shared_ptr<models::Seq2Seq> m;
    {
      std::optional<nn::PartitionedInit> scope;
      if (pieces) scope.emplace();
      m = std::make_shared<models::Seq2Seq>(cfg);
    }
    runtime::InitOptions opt;
    opt.log = [](const std::string&) {};
    auto engine = runtime::initialize(m, R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
                                      opt);
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
      Tensor loss = engine->forward(ids, labels);
      engine->backward(loss);
      engine->step();
      losses.push_back(static_cast<float>(loss.item()));
    }
    runs.push_back(losses);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_LT(runs[0].back(), runs[0].front());
}

// bf16 mixed precision under ZeRO-3 (bf16 parameters and activations, fp32 master weights): the
// first loss is transformers' up to bf16 rounding and the loss goes down.
TEST_P(HFSeq2Seq, TrainsInBf16UnderZeRO3) {
  auto cfg = models::read_hf_seq2seq_config(case_dir(GetParam()));
  cfg->dropout = cfg->attention_dropout = cfg->activation_dropout = 0.0f;
  auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(*m, case_dir(GetParam()));
  const models::Seq2SeqInputs in = batch();
  runtime::InitOptions opt;
  opt.loss_fn = [in](nn::Module& model, const nn::Batch& b) {
    return static_cast<models::Seq2Seq&>(model).loss(
        models::Seq2SeqInputs{b.input_ids, in.attention_mask, {}, b.labels});
  };
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(m, R"({
    "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
                                    opt);
  std::vector<float> losses;
  for (int step = 0; step < 5; ++step) {
    Tensor loss = engine->forward(in.input_ids, in.labels);
    engine->backward(loss);
    engine->step();
    losses.push_back(static_cast<float>(loss.to(DType::f32).item()));
  }
  const double ref = ref_->get("loss").item();
  EXPECT_LE(std::abs(losses[0] - ref) / ref, 2e-2) << losses[0] << " vs " << ref;
  EXPECT_LT(losses.back(), losses.front());
  std::printf("%s: bf16 ZeRO-3 losses %.4f (transformers fp64 %.4f) -> %.4f\n", GetParam().c_str(),
              losses.front(), ref, losses.back());
}

// On the sim device (tests/device_parity.h): loss and every gradient of the fixture's batch and
// three engine steps (dropout on) at ZeRO 0 and 3 bitwise as the host copy's; the serving decoder
// (Seq2SeqDecoder) gives the same greedy tokens, its logits and a decode_batch step's within 2e-6
// (linear_rows runs Backend's default on the device, the CPU's AVX2 kernel on the host); and
// generate_greedy / beam search over the padded batch given as device tensors (and as host
// tensors) give the host's tokens.
TEST_P(HFSeq2Seq, TrainsAndDecodesOnADeviceAsOnTheHost) {
  const Device sim = ds::testing::sim_device();
  const models::Seq2SeqInputs in = batch();
  const nn::Batch b{
      .input_ids = in.input_ids, .labels = in.labels, .attention_mask = in.attention_mask};
  ds::testing::expect_device_as_host([&] { return import(case_dir(GetParam())); }, b, sim, 0.0);

  auto host = import(case_dir(GetParam())), dev = import(case_dir(GetParam()));
  dev->to(sim);
  std::vector<int32_t> prompt;  // row 0's source without its padding
  const std::vector<int64_t> ids = in.input_ids.to_int_vector(),
                             mask = in.attention_mask.to_int_vector();
  for (int64_t t = 0; t < in.input_ids.size(1); ++t)
    if (mask[t]) prompt.push_back(static_cast<int32_t>(ids[t]));
  models::Seq2SeqDecoder host_dec(host), dev_dec(dev);
  ds::testing::expect_decoding_as_host(host_dec, dev_dec, prompt, 5, 2e-6);

  const Tensor dev_ids = in.input_ids.to(sim), dev_mask = in.attention_mask.to(sim);
  models::GreedyOptions greedy;
  greedy.max_new_tokens = 6;
  EXPECT_EQ(dev->generate_greedy(dev_ids, dev_mask, greedy).to_int_vector(),
            host->generate_greedy(in.input_ids, in.attention_mask, greedy).to_int_vector());
  models::BeamOptions beam;
  beam.num_beams = 3;
  beam.max_new_tokens = 6;
  beam.no_repeat_ngram_size = 2;
  beam.encoder_no_repeat_ngram_size = 2;
  const Tensor got = dev->generate_beam(dev_ids, dev_mask, beam);
  EXPECT_TRUE(got.device().is_cpu());
  const std::vector<int64_t> want =
      host->generate_beam(in.input_ids, in.attention_mask, beam).to_int_vector();
  EXPECT_EQ(got.to_int_vector(), want);
  // Ids in host memory (ds_generate's source) go to the model's device.
  EXPECT_EQ(dev->generate_beam(in.input_ids, in.attention_mask, beam).to_int_vector(), want);
}

INSTANTIATE_TEST_SUITE_P(Seq2Seq, HFSeq2Seq,
                         ::testing::Values("bart_s2s", "bart_relu_scaled", "blenderbot_s2s",
                                           "t5_relu_tied", "t5_gated_untied"));

// T5 in the other forms a folder comes in: bf16 / fp16 exports, sharded safetensors, and an untied
// model as transformers 5.24 saves it (tie_word_embeddings true, scale_decoder_outputs false,
// lm_head.weight in the file: 5.24 unties lm_head when it differs from shared.weight).
TEST(HFSeq2SeqT5, HalfExportsShardsAndTheTransformers5UntiedForm) {
  const fs::path src = case_dir("t5_gated_untied");
  const fs::path tmp = fs::temp_directory_path() / ("ds_hf_t5_" + std::to_string(::getpid()));
  safetensors::Reader ref((src / "reference.safetensors").string());
  const models::Seq2SeqInputs in{
      ref.get("input_ids"), ref.get("attention_mask"), {}, ref.get("labels")};
  auto a = import(src);
  const std::vector<float> want = a->logits(in).to_vector();
  for (DType dt : {DType::bf16, DType::f16}) {
    const fs::path dir = tmp / dtype_name(dt);
    models::export_hf_seq2seq(*a, dir, dt);
    auto b = import(dir);
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)  // the file holds each weight rounded to dt
      EXPECT_EQ(pa[i].second.to(dt).to(DType::f32).to_vector(), pb[i].second.to_vector())
          << dtype_name(dt) << " " << pa[i].first;
    EXPECT_LE(rel_err(b->logits(in).to_vector(), want), dt == DType::bf16 ? 3e-2 : 3e-3)
        << dtype_name(dt);
  }
  {  // two shards and model.safetensors.index.json
    const fs::path dir = tmp / "sharded";
    fs::create_directories(dir);
    fs::copy_file(src / "config.json", dir / "config.json");
    safetensors::Reader whole((src / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> parts[2];
    json map = json::object();
    for (const auto& e : whole.entries()) {
      const int k = e.name.rfind("decoder.", 0) == 0 ? 1 : 0;
      parts[k].emplace_back(e.name, whole.get(e.name));
      map[e.name] = fmt::format("model-0000{}-of-00002.safetensors", k + 1);
    }
    for (int k = 0; k < 2; ++k)
      safetensors::save((dir / fmt::format("model-0000{}-of-00002.safetensors", k + 1)).string(),
                        parts[k], {{"format", "pt"}});
    std::ofstream(dir / "model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump();
    auto b = import(dir);
    EXPECT_FALSE(b->config().tie_word_embeddings);
    EXPECT_EQ(b->logits(in).to_vector(), want);
  }
  {  // transformers 5.24's own save of an untied T5: the config says tied, the file does not
    const fs::path dir = tmp / "v5form";
    fs::create_directories(dir);
    fs::copy_file(src / "model.safetensors", dir / "model.safetensors");
    std::ifstream cin(src / "config.json");
    json j = json::parse(cin);
    j["tie_word_embeddings"] = true;
    j["scale_decoder_outputs"] = false;
    std::ofstream(dir / "config.json") << j.dump();
    const auto c = models::read_hf_seq2seq_config(dir);
    EXPECT_FALSE(c->tie_word_embeddings);
    EXPECT_FALSE(c->scale_decoder_outputs);
    EXPECT_EQ(import(dir)->logits(in).to_vector(), want);
    // The config alone (no weights to look at) keeps lm_head tied, and loading then names the
    // conflict and the fix.
    models::Seq2Seq tied(models::seq2seq_config_from_json(j), /*init=*/false);
    EXPECT_HAS(error_of([&] { models::load_hf_seq2seq_weights(tied, dir); }),
               "'lm_head.weight' differs from shared.weight");
  }
  {  // a tied model whose file also carries lm_head.weight (equal): still tied, the copy skipped
    const fs::path t = case_dir("t5_relu_tied"), dir = tmp / "tied_copy";
    fs::create_directories(dir);
    fs::copy_file(t / "config.json", dir / "config.json");
    safetensors::Reader whole((t / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> all;
    for (const auto& e : whole.entries()) all.emplace_back(e.name, whole.get(e.name));
    all.emplace_back("lm_head.weight", whole.get("shared.weight"));
    all.emplace_back("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
                     Tensor::zeros({8, 4}));  // transformers ignores it on load
    safetensors::save((dir / "model.safetensors").string(), all, {{"format", "pt"}});
    const auto c = models::read_hf_seq2seq_config(dir);
    EXPECT_TRUE(c->tie_word_embeddings);
    models::Seq2Seq m(*c, /*init=*/false);
    const auto rep = models::load_hf_seq2seq_weights(m, dir);
    EXPECT_EQ(rep.ignored.size(), 2u);
    safetensors::Reader tref((t / "reference.safetensors").string());
    m.train(false);
    EXPECT_LE(
        rel_err(
            m.logits({tref.get("input_ids"), tref.get("attention_mask"), {}, tref.get("labels")})
                .to_vector(),
            tref.get("logits").to_vector()),
        kTol);
  }
  fs::remove_all(tmp);
}

// A fresh T5 (T5's own initialisation from the seed) built whole and built piecewise under
// nn::PartitionedInit trains the same under ZeRO-3; the draws have T5's standard deviations.
TEST(HFSeq2SeqEngine, T5PartitionedInitMatchesWholeInit) {
  auto cfg = *models::read_hf_seq2seq_config(case_dir("t5_gated_untied"));
  cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0f;
  cfg.seed = 7;
  {
    models::Seq2Seq m(cfg);
    auto sd = [&](const std::string& name) {
      for (const auto& [n, p] : m.named_parameters())
        if (n == name) {
          double s2 = 0.0;
          for (float v : p.to_vector()) s2 += static_cast<double>(v) * v;
          return std::sqrt(s2 / static_cast<double>(p.numel()));
        }
      ADD_FAILURE() << name;
      return 0.0;
    };
    EXPECT_NEAR(sd("shared.weight"), 1.0, 0.1);  // initializer_factor 1
    EXPECT_NEAR(sd("lm_head.weight"), 1.0, 0.1);
    EXPECT_NEAR(sd("encoder.block.0.layer.0.SelfAttention.q.weight"), 1.0 / 16.0, 0.01);
    EXPECT_NEAR(sd("encoder.block.0.layer.1.DenseReluDense.wo.weight"), 1.0 / std::sqrt(48.0),
                0.02);
    EXPECT_EQ(sd("encoder.final_layer_norm.weight"), 1.0);
  }
  const Tensor ids = Tensor::from_ints({5, 6, 7, 8, 9, 10, 11, 12}, {2, 4});
  const Tensor labels = Tensor::from_ints({13, 14, 1, 15, 16, 1}, {2, 3});
  std::vector<std::vector<float>> runs;
  for (bool pieces : {false, true}) {
    std::shared_ptr<models::Seq2Seq> m;
    {
      std::optional<nn::PartitionedInit> scope;
      if (pieces) scope.emplace();
      m = std::make_shared<models::Seq2Seq>(cfg);
    }
    runtime::InitOptions opt;
    opt.log = [](const std::string&) {};
    auto engine = runtime::initialize(m, R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
                                      opt);
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
      Tensor loss = engine->forward(ids, labels);
      engine->backward(loss);
      engine->step();
      losses.push_back(static_cast<float>(loss.item()));
    }
    runs.push_back(losses);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_LT(runs[0].back(), runs[0].front());
}

json bart(json extra = json::object()) {
  json j = {{"model_type", "bart"},         {"d_model", 32},         {"encoder_layers", 1},
            {"decoder_layers", 1},          {"vocab_size", 64},      {"encoder_attention_heads", 4},
            {"decoder_attention_heads", 4}, {"encoder_ffn_dim", 40}, {"decoder_ffn_dim", 40},
            {"max_position_embeddings", 16}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

std::string config_error(const json& j) {
  return error_of([&] { models::seq2seq_config_from_json(j, "m/config.json"); });
}

TEST(HFSeq2SeqConfig, FieldsThatChangeTheMathAreRefusedByName) {
  EXPECT_HAS(config_error(bart({{"attention_scale", 2.0}})), "\"attention_scale\"");
  EXPECT_HAS(config_error(bart({{"attention_scale", 2.0}})), "m/config.json");
  EXPECT_HAS(config_error(bart({{"activation_function", "gelu_fast"}})), "gelu_fast");
  EXPECT_HAS(config_error(bart({{"add_final_layer_norm", true}})), "add_final_layer_norm");
  EXPECT_HAS(config_error(bart({{"normalize_before", true}})), "normalize_before");
  EXPECT_HAS(config_error(bart({{"extra_pos_embeddings", 0}})), "extra_pos_embeddings");
  EXPECT_HAS(config_error(bart({{"static_position_embeddings", true}})),
             "static_position_embeddings");
  EXPECT_HAS(config_error(bart({{"add_bias_logits", true}})), "add_bias_logits");
  EXPECT_HAS(config_error(bart({{"tie_word_embeddings", false}})), "tie_word_embeddings");
  EXPECT_HAS(config_error(bart({{"encoder_layerdrop", 0.1}})), "encoder_layerdrop");
  EXPECT_HAS(config_error(bart({{"model_type", "pegasus"}})), "\"pegasus\"");
  EXPECT_HAS(config_error(bart({{"d_model", 30}})), "divisible");
  json bb = bart({{"model_type", "blenderbot"}, {"normalize_before", false}});
  EXPECT_HAS(config_error(bb), "normalize_before");
  // The 4.x switches are accepted when they say what the model_type computes.
  const auto c = models::seq2seq_config_from_json(bart({{"model_type", "blenderbot"},
                                                        {"normalize_before", true},
                                                        {"add_final_layer_norm", true},
                                                        {"normalize_embedding", false},
                                                        {"extra_pos_embeddings", 0},
                                                        {"layernorm_variant", "prelayernorm"},
                                                        {"static_position_embeddings", false},
                                                        {"add_bias_logits", false}}));
  EXPECT_TRUE(c.pre_norm);
  EXPECT_EQ(c.position_offset, 0);
}

json t5(json extra = json::object()) {
  json j = {{"model_type", "t5"}, {"d_model", 32},  {"d_kv", 8},       {"d_ff", 40},
            {"num_layers", 1},    {"num_heads", 4}, {"vocab_size", 64}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

TEST(HFSeq2SeqConfig, T5FieldsThatChangeTheMathAreRefusedByName) {
  EXPECT_HAS(config_error(t5({{"feed_forward_proj", "gated-gelu-x"}})), "feed_forward_proj");
  EXPECT_HAS(config_error(t5({{"feed_forward_proj", "gelu_fast"}})), "gelu_fast");
  EXPECT_HAS(config_error(t5({{"feed_forward_proj", "gated-gelu"}, {"dense_act_fn", "relu"}})),
             "dense_act_fn");
  EXPECT_HAS(config_error(t5({{"tie_encoder_decoder", true}})), "tie_encoder_decoder");
  EXPECT_HAS(config_error(t5({{"is_decoder", true}})), "is_decoder");
  EXPECT_HAS(config_error(t5({{"relative_attention_num_buckets", 2}})), "relative_buckets");
  EXPECT_HAS(config_error(t5({{"d_kv", 0}})), "d_kv");
  EXPECT_HAS(config_error(t5({{"encoder_layers", 2}})), "\"encoder_layers\"");
  EXPECT_HAS(config_error(t5({{"scale_attn_by_inverse_layer_idx", true}})),
             "\"scale_attn_by_inverse_layer_idx\"");
  // transformers 5.24's T5Config: "gated-gelu" is gelu_new, num_decoder_layers defaults to
  // num_layers, the output scale follows tie_word_embeddings unless scale_decoder_outputs says.
  auto c = models::seq2seq_config_from_json(t5({{"feed_forward_proj", "gated-gelu"}}));
  EXPECT_EQ(c.activation, "gelu_new");
  EXPECT_TRUE(c.gated_ffn);
  EXPECT_EQ(c.decoder_layers, 1);
  EXPECT_TRUE(c.scale_decoder_outputs);
  c = models::seq2seq_config_from_json(t5({{"feed_forward_proj", "gated-silu"},
                                           {"tie_word_embeddings", false},
                                           {"num_decoder_layers", 3}}));
  EXPECT_EQ(c.activation, "silu");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.scale_decoder_outputs);
  EXPECT_EQ(c.decoder_layers, 3);
  c = models::seq2seq_config_from_json(
      t5({{"tie_word_embeddings", true}, {"scale_decoder_outputs", false}}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.scale_decoder_outputs);
  // Our own config refuses T5 fields on a BART model, and what T5's config.json cannot say.
  models::Seq2SeqConfig b;
  b.d_kv = 8;
  EXPECT_HAS(error_of([&] { b.validate(); }), "d_kv");
  c = models::seq2seq_config_from_json(t5());
  c.decoder_heads = 2;
  EXPECT_HAS(error_of([&] { c.validate(); }), "num_heads");
}

// Published T5 configs (4.x form as on the Hub): t5-small, flan-t5-base, bigscience/T0_3B (the
// DeepSpeed Transformers guide's estimator example). Parameter counts are transformers 5.24's
// T5ForConditionalGeneration built from them, plus the untied lm_head (V * C) for the v1.1
// models: 5.24 builds lm_head tied and unties it when loading their lm_head.weight.
TEST(HFSeq2SeqConfig, PublishedT5Configs) {
  const json t5_small = json::parse(R"({"architectures":["T5ForConditionalGeneration"],"d_ff":2048,
    "d_kv":64,"d_model":512,"decoder_start_token_id":0,"dropout_rate":0.1,"eos_token_id":1,
    "initializer_factor":1.0,"is_encoder_decoder":true,"layer_norm_epsilon":1e-06,
    "model_type":"t5","n_positions":512,"num_heads":8,"num_layers":6,"output_past":true,
    "pad_token_id":0,"relative_attention_num_buckets":32,"task_specific_params":{"summarization":
    {"early_stopping":true,"length_penalty":2.0,"max_length":200,"min_length":30,
    "no_repeat_ngram_size":3,"num_beams":4,"prefix":"summarize: "}},"vocab_size":32128})");
  const json flan_base = json::parse(R"({"architectures":["T5ForConditionalGeneration"],
    "d_ff":2048,"d_kv":64,"d_model":768,"decoder_start_token_id":0,"dense_act_fn":"gelu_new",
    "dropout_rate":0.1,"eos_token_id":1,"feed_forward_proj":"gated-gelu","initializer_factor":1.0,
    "is_encoder_decoder":true,"is_gated_act":true,"layer_norm_epsilon":1e-06,"model_type":"t5",
    "n_positions":512,"num_decoder_layers":12,"num_heads":12,"num_layers":12,"output_past":true,
    "pad_token_id":0,"relative_attention_max_distance":128,"relative_attention_num_buckets":32,
    "tie_word_embeddings":false,"torch_dtype":"float32","transformers_version":"4.23.1",
    "use_cache":true,"vocab_size":32128})");
  const json t0_3b = json::parse(R"({"architectures":["T5ForConditionalGeneration"],"d_ff":5120,
    "d_kv":64,"d_model":2048,"decoder_start_token_id":0,"dropout_rate":0.1,"eos_token_id":1,
    "feed_forward_proj":"gated-gelu","gradient_checkpointing":false,"initializer_factor":1.0,
    "is_encoder_decoder":true,"layer_norm_epsilon":1e-06,"model_type":"t5","num_decoder_layers":24,
    "num_heads":32,"num_layers":24,"output_past":true,"pad_token_id":0,
    "relative_attention_num_buckets":32,"tie_word_embeddings":false,"use_cache":false,
    "vocab_size":32128})");
  const auto a = models::seq2seq_config_from_json(t5_small);
  EXPECT_EQ(a.num_parameters(), 60506624);
  EXPECT_TRUE(a.tie_word_embeddings && a.scale_decoder_outputs && !a.gated_ffn);
  const auto f = models::seq2seq_config_from_json(flan_base);
  EXPECT_EQ(f.num_parameters(), 222903552 + 32128 * 768);
  EXPECT_TRUE(!f.tie_word_embeddings && f.gated_ffn && f.activation == "gelu_new");
  const auto t0 = models::seq2seq_config_from_json(t0_3b);
  EXPECT_EQ(t0.num_parameters(), 2783959040LL + 32128LL * 2048);
}

// config.json of published checkpoints in their 4.x form (as on the Hub, labels and
// task_specific_params left out), with transformers 5.24's parameter counts of
// BartForConditionalGeneration / BlenderbotForConditionalGeneration built from them.
TEST(HFSeq2SeqConfig, PublishedConfigs) {
  const json bart_large = json::parse(R"({"activation_dropout":0.1,"activation_function":"gelu",
    "add_bias_logits":false,"add_final_layer_norm":false,"architectures":["BartModel"],
    "attention_dropout":0.1,"bos_token_id":0,"classif_dropout":0.1,"classifier_dropout":0.0,
    "d_model":1024,"decoder_attention_heads":16,"decoder_ffn_dim":4096,"decoder_layerdrop":0.0,
    "decoder_layers":12,"decoder_start_token_id":2,"dropout":0.1,"early_stopping":true,
    "encoder_attention_heads":16,"encoder_ffn_dim":4096,"encoder_layerdrop":0.0,
    "encoder_layers":12,"eos_token_id":2,"forced_eos_token_id":2,"gradient_checkpointing":false,
    "init_std":0.02,"is_encoder_decoder":true,"max_position_embeddings":1024,"model_type":"bart",
    "no_repeat_ngram_size":3,"normalize_before":false,"num_beams":4,"num_hidden_layers":12,
    "pad_token_id":1,"scale_embedding":false,"transformers_version":"4.12.0.dev0",
    "use_cache":true,"vocab_size":50265})");
  const json blenderbot = json::parse(R"({"activation_dropout":0.0,"activation_function":"gelu",
    "add_bias_logits":false,"add_final_layer_norm":true,
    "architectures":["BlenderbotForConditionalGeneration"],"attention_dropout":0.0,
    "bos_token_id":1,"classif_dropout":0.0,"d_model":1280,"decoder_attention_heads":32,
    "decoder_ffn_dim":5120,"decoder_layerdrop":0.0,"decoder_layers":12,
    "decoder_start_token_id":1,"do_blenderbot_90_layernorm":true,"dropout":0.1,
    "encoder_attention_heads":32,"encoder_ffn_dim":5120,"encoder_layerdrop":0.0,
    "encoder_layers":2,"encoder_no_repeat_ngram_size":3,"eos_token_id":2,
    "extra_layer_norm":false,"extra_pos_embeddings":0,"force_bos_token_to_be_generated":false,
    "forced_eos_token_id":2,"init_std":0.02,"is_encoder_decoder":true,
    "layernorm_variant":"prelayernorm","length_penalty":0.65,"max_length":60,
    "max_position_embeddings":128,"min_length":20,"model_type":"blenderbot",
    "no_repeat_ngram_size":3,"normalize_before":true,"normalize_embedding":false,
    "num_beams":10,"num_hidden_layers":2,"pad_token_id":0,"scale_embedding":true,
    "static_position_embeddings":false,"transformers_version":"4.4.0.dev0","unk_token_id":3,
    "use_cache":true,"vocab_size":8008})");
  const auto b = models::seq2seq_config_from_json(bart_large, "facebook/bart-large");
  EXPECT_EQ(b.num_parameters(), 406291456);
  EXPECT_FALSE(b.pre_norm);
  EXPECT_EQ(b.position_offset, 2);
  const auto bb = models::seq2seq_config_from_json(blenderbot, "blenderbot-400M-distill");
  EXPECT_EQ(bb.num_parameters(), 364802560);
  EXPECT_TRUE(bb.pre_norm && bb.final_norm && bb.scale_embedding && !bb.embedding_norm);
  EXPECT_EQ(bb.decoder_start_token_id, 1);
  EXPECT_EQ(bb.pad_token_id, 0);
  // bart-base's shape (the formula is checked against the built module tree on the fixtures).
  models::Seq2SeqConfig base = b;
  base.d_model = 768;
  base.encoder_layers = base.decoder_layers = 6;
  base.encoder_heads = base.decoder_heads = 12;
  base.encoder_ffn = base.decoder_ffn = 3072;
  EXPECT_EQ(base.num_parameters(), 139420416);
}

// Generation options: the fixture's generation_config.json (transformers 5), and a 4.x
// config.json's generation keys (blenderbot-400M-distill's), and a setting we do not implement.
TEST(HFSeq2SeqGeneration, OptionsAreReadFromTheCheckpoint) {
  const auto cfg = *models::read_hf_seq2seq_config(case_dir("blenderbot_s2s"));
  const models::BeamOptions o = models::read_hf_generation_options(case_dir("blenderbot_s2s"), cfg);
  EXPECT_EQ(o.num_beams, 1);
  EXPECT_EQ(o.encoder_no_repeat_ngram_size, 3);  // BlenderbotConfig's default
  EXPECT_EQ(o.forced_eos_token_id, 2);
  EXPECT_EQ(o.eos_token_id, 2);
  // No max_length anywhere: transformers 5 generates 20 new tokens, the length capped at
  // max_position_embeddings (20 in this fixture: 19 new tokens).
  EXPECT_EQ(o.max_new_tokens, 19);
  const fs::path dir = fs::temp_directory_path() / ("ds_s2s_gen_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type":"blenderbot","num_beams":10,
    "length_penalty":0.65,"max_length":60,"min_length":20,"no_repeat_ngram_size":3,
    "encoder_no_repeat_ngram_size":3,"eos_token_id":2,"forced_eos_token_id":2})";
  const models::BeamOptions h = models::read_hf_generation_options(dir, cfg);
  EXPECT_EQ(h.num_beams, 10);
  EXPECT_FLOAT_EQ(h.length_penalty, 0.65f);
  EXPECT_EQ(h.max_new_tokens, 59);
  EXPECT_EQ(h.min_length, 20);
  EXPECT_EQ(h.no_repeat_ngram_size, 3);
  EXPECT_EQ(h.encoder_no_repeat_ngram_size, 3);
  std::ofstream(dir / "generation_config.json") << R"({"do_sample":true,"top_k":5})";
  EXPECT_HAS(error_of([&] { models::read_hf_generation_options(dir, cfg); }), "do_sample");
  std::ofstream(dir / "generation_config.json") << R"({"watermarking_config":{}})";
  EXPECT_HAS(error_of([&] { models::read_hf_generation_options(dir, cfg); }),
             "watermarking_config");
  std::ofstream(dir / "generation_config.json") << R"({"repetition_penalty":1.2})";
  EXPECT_HAS(error_of([&] { models::read_hf_generation_options(dir, cfg); }), "repetition_penalty");
  fs::remove_all(dir);
}

// ---- generation memory: bounded by the KV cache's capacity, not by the steps taken ----

// A tiny random BART (C 32, 2 + 2 layers, 1024 positions), no dropout.
std::shared_ptr<models::Seq2Seq> tiny_bart(int64_t max_positions = 1024) {
  models::Seq2SeqConfig c;
  c.vocab_size = 64;
  c.max_positions = max_positions;
  c.d_model = 32;
  c.encoder_layers = c.decoder_layers = 2;
  c.encoder_heads = c.decoder_heads = 4;
  c.encoder_ffn = c.decoder_ffn = 64;
  c.dropout = 0.0f;
  c.seed = 7;
  auto m = std::make_shared<models::Seq2Seq>(c);
  m->train(false);
  return m;
}

// What `run` leaves the process holding: the caching allocator's reserved bytes after it, less
// before it, from an emptied cache (freed blocks are kept and never given back, so this is what
// the generation costs in memory, as RSS would show it).
template <class F>
int64_t reserved_by(F&& run) {
  Allocator& a = cpu_allocator();
  a.empty_cache();
  const int64_t before = static_cast<int64_t>(a.stats().bytes_reserved);
  run();
  return static_cast<int64_t>(a.stats().bytes_reserved) - before;
}

// Greedy decoding of 1,000 tokens and beam search (8 beams x 400 tokens) hold their
// self-attention caches at a capacity allocated ahead (doubling, up to 1 + max_new_tokens
// positions) and written in place; beam search reorders them by a gather into one more layer's
// worth. Before, each step concatenated a one-position-longer copy and the allocator kept every
// outgrown size: the greedy run left 80 MB reserved and the beam run 411 MB; now 1.0 MB and 4.4 MB
// (the same tokens). The bound: the caches at full capacity (self-attention keys and values of
// every decoder layer) three times over, plus 1 MiB of the step's activations.
TEST(HFSeq2SeqGeneration, CacheMemoryIsBoundedByItsCapacity) {
  auto m = tiny_bart();
  const models::Seq2SeqConfig& c = m->config();
  const Tensor src = Tensor::from_ints({5, 9, 13, 4, 22, 31, 8, 2}, {1, 8});
  auto cache_bytes = [&](int64_t rows, int64_t positions) {
    return 2 * c.decoder_layers * rows * positions * c.d_model * 4;  // self k and v, fp32
  };
  models::GreedyOptions g;
  g.max_new_tokens = 1000;
  g.eos_token_id = g.forced_eos_token_id = -1;  // all 1,000 steps
  Tensor greedy;
  const int64_t greedy_bytes = reserved_by([&] { greedy = m->generate_greedy(src, Tensor(), g); });
  EXPECT_EQ(greedy.shape(), (Shape{1, 1001}));
  EXPECT_LE(greedy_bytes, 3 * cache_bytes(1, 1001) + (1 << 20));

  models::BeamOptions b;
  b.num_beams = 8;
  b.max_new_tokens = 400;
  b.eos_token_id = b.forced_eos_token_id = -1;
  Tensor beams;
  const int64_t beam_bytes = reserved_by([&] { beams = m->generate_beam(src, Tensor(), b); });
  EXPECT_EQ(beams.shape(), (Shape{1, 401}));
  EXPECT_LE(beam_bytes, 3 * cache_bytes(8, 401) + (1 << 20));
  std::printf("[ memory ] greedy 1000 tokens: %lld bytes reserved; 8 beams x 400: %lld\n",
              static_cast<long long>(greedy_bytes), static_cast<long long>(beam_bytes));

  // The tokens are those of the full decoder (no cache): the in-place cache changes no result.
  g.max_new_tokens = 40;
  b.max_new_tokens = 40;
  models::GreedyOptions g2 = g;
  g2.use_cache = false;
  EXPECT_EQ(m->generate_greedy(src, Tensor(), g).to_int_vector(),
            m->generate_greedy(src, Tensor(), g2).to_int_vector());
  models::BeamOptions b2 = b;
  b2.use_cache = false;
  EXPECT_EQ(m->generate_beam(src, Tensor(), b).to_int_vector(),
            m->generate_beam(src, Tensor(), b2).to_int_vector());
}

// ds_serve's decoders: each sequence's cache stays within cache_bytes_limit() (what ds_serve
// announces per sequence) up to the longest target, and 8 sequences decoded together to it leave
// the process holding at most twice their limits (the caches grow by doubling: the outgrown
// blocks stay with the allocator for the next sequences). Before, the same run held 80 MB; now
// 5.3 MB.
TEST(HFSeq2SeqGeneration, ServedSequencesStayWithinTheAnnouncedCacheBytes) {
  auto m = tiny_bart(/*max_positions=*/384);
  models::Seq2SeqDecoder proto(m);
  const int64_t limit = proto.cache_bytes_limit(), P = proto.capacity_limit();
  EXPECT_EQ(limit, 4 * 2 * 384 * 32 * 4);
  std::vector<std::unique_ptr<models::IncrementalDecoder>> decs;
  std::vector<models::IncrementalDecoder*> ptrs;
  const int64_t bytes = reserved_by([&] {
    for (int i = 0; i < 8; ++i) {
      decs.push_back(proto.fresh());
      const std::vector<int32_t> src(static_cast<size_t>(10 + 40 * i), 7 + i);
      decs.back()->forward(src);
      ptrs.push_back(decs.back().get());
    }
    std::vector<int32_t> ids(8, 11);
    while (decs[0]->length() < P) {
      decs[0]->decode_batch(ptrs, ids);
      for (auto* d : ptrs) EXPECT_LE(d->cache_bytes(), limit);
    }
  });
  EXPECT_EQ(decs[7]->length(), P);
  EXPECT_LE(bytes, 2 * 8 * limit + (1 << 20));
  std::printf(
      "[ memory ] 8 served sequences of %lld positions: %lld bytes reserved (limit %lld "
      "each)\n",
      static_cast<long long>(P), static_cast<long long>(bytes), static_cast<long long>(limit));
  // truncate keeps the capacity (Seq2SeqDecoderTest.TruncateAndErrors: the same logits after it).
  decs[1]->truncate(5);
  EXPECT_LE(decs[1]->cache_bytes(), limit);
}

// Without max_length or max_new_tokens in the folder's files, transformers 5 generates 20 new
// tokens (max_length 20 + the decoder start; capped at max_position_embeddings, which BART's 24
// does not reach, and none for T5): the same 21 positions here (we gave 19 before). With a
// max_length, it counts the decoder start (19 new). tests/fixtures/generators/gen_seq2seq_fixture.py's models; the
// tokens are transformers 5.24's `model.generate(input_ids, attention_mask=mask)`.
TEST(HFSeq2SeqGeneration, DefaultLengthsAreTransformers) {
  const std::map<std::string, std::vector<int64_t>> want = {
      {"bart_s2s",
       {2, 9, 44, 44, 44, 44, 44, 44, 44, 44, 44, 9, 44, 44, 44, 44, 44, 44, 44, 44, 2,
        2, 9, 9,  9,  9,  9,  9,  9,  9,  9,  9,  9, 9,  9,  9,  9,  9,  9,  9,  9,  2,
        2, 9, 9,  9,  9,  9,  9,  9,  9,  9,  9,  9, 9,  9,  9,  9,  9,  9,  9,  9,  2}},
      {"t5_relu_tied",
       {0, 19, 23, 36, 22, 22, 52, 22, 52, 22, 52, 22, 52, 22, 52, 22, 52, 22, 52, 22, 52,
        0, 4,  4,  4,  6,  18, 4,  58, 58, 52, 52, 52, 52, 52, 52, 52, 52, 52, 52, 52, 52,
        0, 6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6,  6}}};
  for (const auto& [name, tokens] : want) {
    auto m = import(case_dir(name));
    const models::BeamOptions o = models::read_hf_generation_options(case_dir(name), m->config());
    EXPECT_EQ(o.max_new_tokens, 20) << name;
    EXPECT_EQ(o.min_length, 0) << name;
    const safetensors::Reader ref((case_dir(name) / "reference.safetensors").string());
    const Tensor got = m->generate(ref.get("input_ids"), ref.get("attention_mask"), o);
    EXPECT_EQ(got.shape(), (Shape{3, 21})) << name;
    EXPECT_EQ(got.to_int_vector(), tokens) << name;
  }
  // A config.json without generation_config.json: its generation keys, as transformers reads
  // them into the generation config (GenerationConfig.from_model_config); max_length counts the
  // decoder start, min_new_tokens bans eos for that many new tokens (min_length 1 + it).
  const fs::path dir = fs::temp_directory_path() / ("ds_s2s_len_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto cfg = *models::read_hf_seq2seq_config(case_dir("bart_s2s"));
  std::ofstream(dir / "config.json") << R"({"model_type":"bart","max_length":30,"min_length":5,
    "num_beams":4,"length_penalty":2.0,"no_repeat_ngram_size":3,"early_stopping":true,
    "forced_bos_token_id":0,"forced_eos_token_id":2,"max_new_tokens":null})";
  models::BeamOptions h = models::read_hf_generation_options(dir, cfg);
  EXPECT_EQ(h.max_new_tokens, 29);
  EXPECT_EQ(h.min_length, 5);
  EXPECT_EQ(h.num_beams, 4);
  EXPECT_FLOAT_EQ(h.length_penalty, 2.0f);
  EXPECT_EQ(h.no_repeat_ngram_size, 3);
  EXPECT_EQ(h.early_stopping, "true");
  EXPECT_EQ(h.forced_bos_token_id, 0);
  std::ofstream(dir / "generation_config.json") << R"({"max_length":20,"min_new_tokens":4})";
  h = models::read_hf_generation_options(dir, cfg);
  EXPECT_EQ(h.max_new_tokens, 19);  // the file's, not config.json's
  EXPECT_EQ(h.min_length, 5);
  EXPECT_EQ(h.num_beams, 1);
  std::ofstream(dir / "generation_config.json") << R"({"max_new_tokens":0})";
  EXPECT_HAS(error_of([&] { models::read_hf_generation_options(dir, cfg); }), "max_new_tokens");
  fs::remove_all(dir);
}

// forced_bos_token_id (ForcedBOSTokenLogitsProcessor: the first new token) and min_new_tokens,
// greedy and beam search, against transformers 5.24's generate(forced_bos_token_id=5,
// max_new_tokens=6[, num_beams=3]) and generate(min_new_tokens=4, max_new_tokens=6) on the T5 and
// BART fixtures.
TEST(HFSeq2SeqGeneration, ForcedBosAndMinNewTokensAsTransformers) {
  auto t5 = import(case_dir("t5_relu_tied"));
  const safetensors::Reader ref((case_dir("t5_relu_tied") / "reference.safetensors").string());
  const Tensor ids = ref.get("input_ids"), mask = ref.get("attention_mask");
  models::BeamOptions o;
  o.num_beams = 1;
  o.max_new_tokens = 6;
  o.forced_bos_token_id = 5;
  EXPECT_EQ(t5->generate(ids, mask, o).to_int_vector(),
            (std::vector<int64_t>{0,  5,  29, 36, 36, 22, 36, 0, 5, 19, 19,
                                  19, 19, 19, 0,  5,  19, 6,  6, 6, 6}));
  o.num_beams = 3;
  EXPECT_EQ(t5->generate(ids, mask, o).to_int_vector(),
            (std::vector<int64_t>{0,  5,  29, 36, 29, 41, 41, 0, 5, 19, 19,
                                  29, 18, 19, 0,  5,  19, 6,  6, 6, 6}));
  // ds_serve's processors force it too.
  const auto proc = models::Seq2SeqProcessors::of(o, t5->config(), 6);
  std::vector<float> logits(static_cast<size_t>(t5->config().vocab_size), 0.0f);
  const std::vector<int32_t> source = {31, 61}, target = {0};
  proc.apply(source, target, logits);
  for (size_t v = 0; v < logits.size(); ++v) EXPECT_EQ(std::isinf(logits[v]), v != 5) << v;

  auto bart = import(case_dir("bart_s2s"));
  const safetensors::Reader bref((case_dir("bart_s2s") / "reference.safetensors").string());
  const fs::path dir = fs::temp_directory_path() / ("ds_s2s_mnt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "generation_config.json") << R"({"min_new_tokens":4,"max_new_tokens":6})";
  const models::BeamOptions m = models::read_hf_generation_options(dir, bart->config());
  fs::remove_all(dir);
  EXPECT_EQ(
      bart->generate(bref.get("input_ids"), bref.get("attention_mask"), m).to_int_vector(),
      (std::vector<int64_t>{2, 9, 44, 44, 44, 44, 2, 2, 9, 9, 9, 9, 9, 2, 2, 9, 9, 9, 9, 9, 2}));
}

// A length penalty that is not a finite number is refused by name (nan made every beam score nan:
// no hypothesis, an empty output); so are the other bad settings.
TEST(HFSeq2SeqGeneration, BadOptionsAreRefusedByName) {
  auto m = import(case_dir("bart_s2s"));
  const Tensor ids = Tensor::from_ints({5, 9, 2}, {1, 3});
  for (float lp : {std::nanf(""), INFINITY, -INFINITY}) {
    models::BeamOptions o;
    o.length_penalty = lp;
    EXPECT_HAS(error_of([&] { o.validate(); }), "length_penalty must be a finite number");
    o.num_beams = 1;  // greedy ignores it, but it was asked for: refused as well
    EXPECT_HAS(error_of([&] { m->generate(ids, Tensor(), o); }), "length_penalty");
    o.num_beams = 2;
    EXPECT_HAS(error_of([&] { m->generate_beam(ids, Tensor(), o); }), "length_penalty");
  }
  models::BeamOptions o;
  o.min_length = -1;
  EXPECT_HAS(error_of([&] { o.validate(); }), "min_length");
  o = {};
  o.early_stopping = "sometimes";
  EXPECT_HAS(error_of([&] { o.validate(); }), "early_stopping");
}

// A bad file: a missing tensor and an extra one are listed together.
TEST(HFSeq2SeqWeights, MissingAndExtraTensorsAreListed) {
  auto cfg = models::read_hf_seq2seq_config(case_dir("bart_s2s"));
  models::Seq2Seq m(*cfg, /*init=*/false);
  const fs::path dir = fs::temp_directory_path() / ("ds_s2s_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  safetensors::Reader r((case_dir("bart_s2s") / "model.safetensors").string());
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& e : r.entries())
    if (e.name != "model.decoder.layers.1.fc2.weight") ts.emplace_back(e.name, r.get(e.name));
  ts.emplace_back("model.decoder.extra.weight", Tensor::zeros({2}));
  safetensors::save((dir / "model.safetensors").string(), ts, {{"format", "pt"}});
  const std::string err = error_of([&] { models::load_hf_seq2seq_weights(m, dir); });
  EXPECT_HAS(err, "missing: 'model.decoder.layers.1.fc2.weight'");
  EXPECT_HAS(err, "extra: 'model.decoder.extra.weight'");
  fs::remove_all(dir);
}

}  // namespace
