// The DeBERTa-v2 sequence classifier (ds/models/deberta.h, through encoder_io.h and
// family.h) against transformers' DebertaV2ForSequenceClassification:
// tests/fixtures/hf_families/{deberta_xl,deberta_types,deberta_regression} are tiny fp32 models as
// transformers 5 saved them, with transformers' float64 logits, loss, every gradient and ten AdamW
// losses (tests/fixtures/generators/gen_deberta_fixture.py): deberta_xl has microsoft/deberta-v2-xlarge's switches
// (log-bucketed shared relative attention, rel LayerNorm, the conv layer, no absolute positions or
// token types) and a padded batch; deberta_types absolute positions, token types, embed_proj,
// separate pos_key/pos_query projections, clamped unbucketed distances, a padded batch;
// deberta_regression c2p alone, a grouped kernel-5 conv, MSE, no mask.
//
// Error measure and tolerance as test_hf_encoders: per tensor max|ours - ref| / max|ref| <= 1e-5
// (fp32 against the float64 reference from the same fp32 weights).
//
// With DS_HF_EXPORT_DIR set, the export of every case is left in $DS_HF_EXPORT_DIR/<case> for
// `tests/fixtures/generators/gen_deberta_fixture.py --check-export` (transformers loads it, same logits).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "device_parity.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/deberta.h"
#include "ds/models/family.h"
#include "ds/models/encoder_io.h"
#include "ds/nn/flat.h"
#include "ds/optim/optimizer.h"
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

std::shared_ptr<models::SequenceClassifier> import(const fs::path& dir) {
  auto cfg = models::read_hf_encoder_config(dir);
  EXPECT_TRUE(cfg.has_value());
  auto m = models::make_encoder_classifier(*cfg, /*init=*/false);
  models::load_hf_encoder_weights(*m, dir);
  m->train(false);  // the reference ran in eval mode
  return m;
}

// Gradients that are zero in exact arithmetic, or nearly: the key bias (the relative key's too)
// adds q . b to every score of query q, which softmax ignores, but for p2c's K . Qr term; without
// p2c the rel LayerNorm's bias likewise only shifts every c2p score of a query alike. Both sides
// hold rounding noise there, measured against the model's largest gradient instead.
bool zero_in_exact_arithmetic(const std::string& name, const models::EncoderConfig& c) {
  return name.ends_with("pos_key_proj.bias") ||
         (!c.deberta.p2c && name.ends_with("key_proj.bias")) ||
         (!c.deberta.p2c && name == "encoder.LayerNorm.bias");
}

class HFDeberta : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = std::make_unique<safetensors::Reader>(
        (case_dir(GetParam()) / "reference.safetensors").string());
  }
  Tensor get_or_none(const char* name) const {
    return ref_->contains(name) ? ref_->get(name) : Tensor();
  }
  models::EncoderInputs batch() const {
    return {ref_->get("input_ids"), get_or_none("attention_mask"), get_or_none("token_type_ids")};
  }
  // Every gradient of m against the reference; returns the worst relative error.
  double check_gradients(const models::SequenceClassifier& m, std::string* worst_name = nullptr,
                         double* worst_zero_out = nullptr) const {
    const models::Family& fam = models::family_of(m.config());
    const auto named = m.named_parameters();
    size_t in_file = 0;
    for (const auto& e : ref_->entries()) in_file += e.name.rfind("grad.", 0) == 0;
    EXPECT_EQ(named.size(), in_file) << "our parameters and transformers' differ";
    double largest = 0.0;
    for (const auto& [name, p] : named)
      for (float v : ref_->get("grad." + fam.encoder.place(m.config(), name).name).to_vector())
        largest = std::max(largest, std::abs(static_cast<double>(v)));
    double worst = 0.0, worst_zero = 0.0;
    for (const auto& [name, p] : named) {
      const std::string hf = "grad." + fam.encoder.place(m.config(), name).name;
      if (!p.grad().defined()) {
        ADD_FAILURE() << name << " got no gradient";
        continue;
      }
      if (!ref_->contains(hf)) {
        ADD_FAILURE() << hf << " is not in the reference";
        continue;
      }
      const std::vector<float> ours = p.grad().to_vector(), ref = ref_->get(hf).to_vector();
      if (zero_in_exact_arithmetic(name, m.config())) {
        double diff = 0.0;
        for (size_t i = 0; i < ref.size(); ++i)
          diff = std::max(diff, std::abs(static_cast<double>(ours[i]) - ref[i]));
        EXPECT_LE(diff / largest, kTol) << "gradient of " << name << " (zero in exact arithmetic)";
        worst_zero = std::max(worst_zero, diff / largest);
        continue;
      }
      const double e = rel_err(ours, ref);
      EXPECT_LE(e, kTol) << "gradient of " << name;
      if (e > worst) {
        worst = e;
        if (worst_name) *worst_name = name;
      }
    }
    if (worst_zero_out) *worst_zero_out = worst_zero;
    return worst;
  }
  std::unique_ptr<safetensors::Reader> ref_;
};

TEST_P(HFDeberta, ConfigIsReadAsTransformersReadsIt) {
  const models::EncoderConfig c = *models::read_hf_encoder_config(case_dir(GetParam()));
  const models::DebertaOptions& d = c.deberta;
  const std::string& n = GetParam();
  EXPECT_EQ(c.family, "deberta-v2");
  EXPECT_EQ(c.n_embd, 32);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.ffn_hidden, 48);
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_TRUE(d.relative_attention);
  if (n == "deberta_xl") {
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.num_labels, 3);
    EXPECT_EQ(c.norm_eps, 1e-7f);
    EXPECT_EQ(c.type_vocab_size, 0);
    EXPECT_FALSE(d.position_biased_input);
    EXPECT_EQ(d.position_buckets, 8);
    EXPECT_EQ(d.att_span(c.max_positions), 8);
    EXPECT_TRUE(d.share_att_key && d.c2p && d.p2c && d.norm_rel_ebd);
    EXPECT_EQ(d.conv_kernel_size, 3);
    EXPECT_EQ(d.conv_act, "gelu");
  } else if (n == "deberta_types") {
    EXPECT_EQ(c.type_vocab_size, 2);
    EXPECT_TRUE(d.position_biased_input);
    EXPECT_EQ(d.embedding_size, 24);
    EXPECT_EQ(d.att_span(c.max_positions), 6);
    EXPECT_FALSE(d.share_att_key || d.norm_rel_ebd);
    EXPECT_EQ(d.conv_kernel_size, 0);
    EXPECT_EQ(c.hidden_act, "gelu_new");
    EXPECT_EQ(d.pooler_hidden_act, "tanh");
    EXPECT_EQ(c.resolved_classifier_dropout(), 0.2f);
  } else {
    EXPECT_EQ(c.n_layer, 1);
    EXPECT_TRUE(c.regression());
    EXPECT_TRUE(d.c2p && !d.p2c);
    EXPECT_EQ(d.conv_groups, 2);
    EXPECT_EQ(d.conv_kernel_size, 5);
    EXPECT_EQ(d.att_span(c.max_positions), 4);
  }
  EXPECT_EQ(models::make_encoder_classifier(c, false)->num_parameters(), c.num_parameters());
}

TEST_P(HFDeberta, LogitsLossAndEveryGradientMatchTransformers) {
  auto m = import(case_dir(GetParam()));
  EXPECT_NE(dynamic_cast<models::DebertaClassifier*>(m.get()), nullptr);
  const models::EncoderInputs in = batch();
  const double e_logits = rel_err(m->logits(in).to_vector(), ref_->get("logits").to_vector());
  EXPECT_LE(e_logits, kTol) << "logits";
  Tensor loss = m->loss(in, ref_->get("labels"));
  const double ref_loss = ref_->get("loss").item();
  const double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(e_loss, kTol) << "loss " << loss.item() << " vs " << ref_loss;
  loss.backward();
  std::string worst_name;
  double worst_zero = 0.0;
  const double worst = check_gradients(*m, &worst_name, &worst_zero);
  std::printf("%s: gradients zero in exact arithmetic within %.2e of the largest gradient\n",
              GetParam().c_str(), worst_zero);
  std::printf("%s: logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", GetParam().c_str(),
              e_logits, e_loss, worst, worst_name.c_str());
}

TEST_P(HFDeberta, PadRowOfTheWordEmbeddingsGetsNoGradient) {
  auto m = import(case_dir(GetParam()));
  m->loss(batch(), ref_->get("labels")).backward();
  const models::EncoderConfig& c = m->config();
  const int64_t E = c.deberta.embedding_dim(c.n_embd);
  for (const auto& [name, p] : m->named_parameters()) {
    if (name != "embeddings.word_embeddings.weight") continue;
    const std::vector<float> g = p.grad().to_vector();
    for (int64_t j = 0; j < E; ++j) EXPECT_EQ(g[static_cast<size_t>(c.pad_token_id * E + j)], 0.0f);
  }
}

TEST_P(HFDeberta, PaddedTokensDoNotChangeTheLogits) {
  const models::EncoderInputs in = batch();
  if (!in.attention_mask.defined()) GTEST_SKIP() << "this case has no padding";
  auto m = import(case_dir(GetParam()));
  const std::vector<float> base = m->logits(in).to_vector();
  std::vector<int64_t> ids = in.input_ids.to_int_vector();
  const std::vector<int64_t> mask = in.attention_mask.to_int_vector();
  std::vector<int64_t> types(ids.size(), 0);
  if (in.token_type_ids.defined()) types = in.token_type_ids.to_int_vector();
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i] == 0) {
      ids[i] = 7 + static_cast<int64_t>(i % 50);
      if (m->config().type_vocab_size > 1) types[i] = 1 - types[i];
    }
  const Shape s = in.input_ids.shape();
  models::EncoderInputs other{Tensor::from_ints(ids, s), in.attention_mask,
                              in.token_type_ids.defined() ? Tensor::from_ints(types, s) : Tensor()};
  // Equal up to rounding: masked keys have probability exactly 0, but the padded rows' own
  // (never read) values differ, and with them nothing else.
  EXPECT_EQ(m->logits(other).to_vector(), base);
  models::EncoderInputs unmasked{in.input_ids, Tensor(), in.token_type_ids};
  EXPECT_GT(rel_err(m->logits(unmasked).to_vector(), base), 1e-3);
}

// Training with every dropout at 1e-7: no element is dropped in this batch, so the training path
// (dropout on the relative embeddings, the probabilities, the conv, the pooler) computes the
// reference's eval math up to the 1/(1-p) scaling.
TEST_P(HFDeberta, TrainingPathMatchesTransformersWithoutDrops) {
  auto cfg = models::read_hf_encoder_config(case_dir(GetParam()));
  cfg->hidden_dropout = cfg->classifier_dropout = cfg->attention_dropout = 1e-7f;
  cfg->deberta.pooler_dropout = 1e-7f;
  auto m = models::make_encoder_classifier(*cfg, /*init=*/false);
  models::load_hf_encoder_weights(*m, case_dir(GetParam()));
  m->train(true);
  Tensor loss = m->loss(batch(), ref_->get("labels"));
  EXPECT_LE(std::abs(loss.item() - ref_->get("loss").item()) / std::abs(ref_->get("loss").item()),
            kTol);
  loss.backward();
  check_gradients(*m);
}

TEST_P(HFDeberta, TenAdamWStepsFollowTorch) {
  auto m = import(case_dir(GetParam()));
  nn::FlatParameters flat = nn::flatten_parameters(*m);
  optim::OptimizerParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  hp.eps = 1e-6f;  // the fixture's (tests/fixtures/generators/gen_deberta_fixture.py says why)
  auto opt = optim::make_optimizer("AdamW", hp);
  const std::vector<float> ref = ref_->get("adamw_losses").to_vector();
  ASSERT_EQ(ref.size(), 10u);
  double worst = 0.0;
  for (size_t step = 0; step < ref.size(); ++step) {
    flat.grads.zero_();
    Tensor loss = m->loss(batch(), ref_->get("labels"));
    loss.backward();
    opt->step(flat.params.data<float>(), flat.grads.data<float>(), flat.numel);
    const double e = std::abs(loss.item() - ref[step]) / std::abs(ref[step]);
    EXPECT_LE(e, 1e-4) << "step " << step << ": loss " << loss.item() << " vs " << ref[step];
    worst = std::max(worst, e);
  }
  std::printf("%s: 10 AdamW losses within %.2e of torch (%.4f -> %.4f)\n", GetParam().c_str(),
              worst, ref.front(), ref.back());
}

// The same ten steps through the engine under ZeRO stage 3 (every parameter gathered before its
// module's forward and released after): the relative embeddings and the conv weight are read
// inside their modules' calls.
TEST_P(HFDeberta, TrainsUnderTheEngineWithZeRO3) {
  auto cfg = models::read_hf_encoder_config(case_dir(GetParam()));
  cfg->hidden_dropout = cfg->classifier_dropout = cfg->attention_dropout = 0.0f;
  auto m = models::make_encoder_classifier(*cfg, /*init=*/false);
  models::load_hf_encoder_weights(*m, case_dir(GetParam()));
  const models::EncoderInputs in = batch();
  runtime::InitOptions opt;
  opt.loss_fn = [in](nn::Module& model, const nn::Batch& b) {
    return static_cast<models::SequenceClassifier&>(model).loss(
        {b.input_ids, in.attention_mask, in.token_type_ids}, b.labels);
  };
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(m, R"({
    "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
                                    opt);
  const std::vector<float> ref = ref_->get("adamw_losses").to_vector();
  double worst = 0.0;
  for (size_t step = 0; step < ref.size(); ++step) {
    Tensor loss = engine->forward(in.input_ids, ref_->get("labels"));
    engine->backward(loss);
    engine->step();
    const double e = std::abs(loss.item() - ref[step]) / std::abs(ref[step]);
    EXPECT_LE(e, 1e-4) << "step " << step << ": loss " << loss.item() << " vs " << ref[step];
    worst = std::max(worst, e);
  }
  std::printf("%s: ZeRO-3 engine, 10 AdamW losses within %.2e of torch\n", GetParam().c_str(),
              worst);
}

TEST_P(HFDeberta, ExportRoundTrip) {
  auto a = import(case_dir(GetParam()));
  const char* keep = std::getenv("DS_HF_EXPORT_DIR");
  const fs::path dir = keep ? fs::path(keep) / GetParam()
                            : fs::temp_directory_path() /
                                  ("ds_hf_deb_" + std::to_string(::getpid()) + "_" + GetParam());
  models::export_hf_encoder(*a, dir);
  std::ifstream in(dir / "config.json");
  json j = json::parse(in);
  EXPECT_EQ(j["architectures"][0], "DebertaV2ForSequenceClassification");
  EXPECT_EQ(j["model_type"], "deberta-v2");
  json hf_only = j;
  hf_only.erase("ds_cpp");
  EXPECT_EQ(models::encoder_config_from_json(hf_only).to_json(), a->config().to_json())
      << hf_only.dump(1);
  // Tensor names as transformers': the file holds exactly the fixture's names.
  safetensors::Reader ours((dir / "model.safetensors").string());
  safetensors::Reader theirs((case_dir(GetParam()) / "model.safetensors").string());
  std::vector<std::string> a_names, b_names;
  for (const auto& e : ours.entries()) a_names.push_back(e.name);
  for (const auto& e : theirs.entries()) b_names.push_back(e.name);
  std::sort(a_names.begin(), a_names.end());
  std::sort(b_names.begin(), b_names.end());
  EXPECT_EQ(a_names, b_names);
  auto b = import(dir);
  EXPECT_EQ(b->config().to_json(), a->config().to_json());
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
  }
  EXPECT_EQ(a->logits(batch()).to_vector(), b->logits(batch()).to_vector());
  if (!keep) fs::remove_all(dir);
}

// On the sim device (tests/device_parity.h): loss and every gradient of the fixture's batch,
// then three engine steps (dropout on) at ZeRO 0 and 3, as the host copy computes them, bitwise.
// deberta_xl again as a multi-label classifier (multi-hot labels): its binary cross entropy runs
// Backend's composed default on the device (bce_with_logits_*), the CPU's fused kernel on the
// host, a rounding apart.
TEST_P(HFDeberta, TrainsOnADeviceAsOnTheHost) {
  const models::EncoderInputs in = batch();
  nn::Batch b{.input_ids = in.input_ids,
              .labels = ref_->get("labels"),
              .attention_mask = in.attention_mask,
              .token_type_ids = in.token_type_ids};
  ds::testing::expect_device_as_host([&] { return import(case_dir(GetParam())); }, b,
                                     ds::testing::sim_device(), 0.0);
  if (GetParam() != "deberta_xl") return;
  const int64_t B = in.input_ids.size(0), NL = 3;
  std::vector<float> multi_hot(static_cast<size_t>(B * NL));
  for (size_t i = 0; i < multi_hot.size(); ++i) multi_hot[i] = static_cast<float>(i % 3 != 1);
  b.labels = Tensor::from_data(multi_hot, {B, NL});
  auto multi_label = [&] {
    auto cfg = models::read_hf_encoder_config(case_dir(GetParam()));
    cfg->problem_type = "multi_label_classification";
    auto m = models::make_encoder_classifier(*cfg, /*init=*/false);
    models::load_hf_encoder_weights(*m, case_dir(GetParam()));
    m->train(false);
    return m;
  };
  ds::testing::expect_device_as_host(multi_label, b, ds::testing::sim_device(), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Deberta, HFDeberta,
                         ::testing::Values("deberta_xl", "deberta_types", "deberta_regression"));

// make_log_bucket_position, computed in float32 as torch does, over every distance for the
// xlarge settings (256 buckets, 512 positions) and the fixture's (8, 24).
TEST(Deberta, LogBucketsMatchTransformers) {
  safetensors::Reader r((case_dir("deberta_xl") / "reference.safetensors").string());
  for (const auto& [name, bucket, maxpos] :
       {std::tuple<const char*, int64_t, int64_t>{"bucket.256_512", 256, 512},
        {"bucket.8_24", 8, 24}}) {
    const std::vector<int64_t> want = r.get(name).to_int_vector();
    ASSERT_EQ(static_cast<int64_t>(want.size()), 4 * maxpos - 1);
    int bad = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
      const int64_t d = i - (2 * maxpos - 1);
      if (models::deberta_log_bucket(d, bucket, maxpos) != want[static_cast<size_t>(i)] &&
          ++bad < 5)
        ADD_FAILURE() << name << ": distance " << d << " -> "
                      << models::deberta_log_bucket(d, bucket, maxpos) << ", transformers "
                      << want[static_cast<size_t>(i)];
    }
    EXPECT_EQ(bad, 0) << name;
  }
  EXPECT_EQ(models::deberta_log_bucket(-700, -1, 512), -700);  // no buckets: the distance
}

json xlarge_mnli() {  // microsoft/deberta-v2-xlarge-mnli's config.json fields
  return json::parse(R"({"model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 1536,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 512,
    "relative_attention": true, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
    "share_att_key": true, "pos_att_type": "p2c|c2p", "conv_kernel_size": 3,
    "pooler_dropout": 0, "pooler_hidden_act": "gelu", "pooler_hidden_size": 1536,
    "conv_act": "gelu", "layer_norm_eps": 1e-7, "max_relative_positions": -1,
    "position_biased_input": false, "num_attention_heads": 24, "attention_head_size": 64,
    "num_hidden_layers": 24, "type_vocab_size": 0, "vocab_size": 128100,
    "id2label": {"0": "CONTRADICTION", "1": "NEUTRAL", "2": "ENTAILMENT"},
    "label2id": {"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2}})");
}

std::string config_error(json j) {
  return error_of([&] { models::encoder_config_from_json(j, "m/config.json"); });
}

TEST(DebertaConfig, PublishedXlargeMnli) {
  const auto c = models::encoder_config_from_json(xlarge_mnli(), "deberta-v2-xlarge-mnli");
  EXPECT_EQ(c.family, "deberta-v2");
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.deberta.att_span(c.max_positions), 256);
  EXPECT_TRUE(c.deberta.c2p && c.deberta.p2c && c.deberta.share_att_key);
  // transformers' DebertaV2ForSequenceClassification(config) has 886,958,595 parameters.
  EXPECT_EQ(c.num_parameters(), 886958595);
}

TEST(DebertaConfig, FieldsThatChangeTheMathAreRefusedByName) {
  auto with = [](json extra) {
    json j = xlarge_mnli();
    j.update(extra);
    return j;
  };
  EXPECT_HAS(config_error(with({{"pos_att_type", "p2c|c2p|p2p"}})), "pos_att_type \"p2p\"");
  EXPECT_HAS(config_error(with({{"pos_att_type", {"c2p", "x2y"}}})), "pos_att_type \"x2y\"");
  EXPECT_HAS(config_error(with({{"norm_rel_ebd", "batch_norm"}})), "norm_rel_ebd");
  EXPECT_HAS(config_error(with({{"z_steps", 2}})), "\"z_steps\"");
  EXPECT_HAS(config_error(with({{"conv_kernel_size", 4}})), "conv_kernel_size 4 must be odd");
  EXPECT_HAS(config_error(with({{"conv_groups", 5}})), "conv_groups 5");
  EXPECT_HAS(config_error(with({{"conv_act", "relu"}})), "conv_act");
  EXPECT_HAS(config_error(with({{"attention_head_size", 32}})), "attention_head_size");
  EXPECT_HAS(config_error(with({{"pooler_hidden_size", 1024}})), "pooler_hidden_size");
  EXPECT_HAS(config_error(with({{"hidden_act", "relu"}})), "hidden_act");
  EXPECT_HAS(config_error(with({{"model_type", "deberta"}})), "DeBERTa (v1)");
  EXPECT_HAS(config_error(with({{"pos_att_type", "p2c|c2p|p2p"}})), "m/config.json");
  // Our own JSON form rejects unknown DeBERTa fields too.
  json own = models::encoder_config_from_json(xlarge_mnli()).to_json();
  own["deberta"]["z_steps"] = 2;
  EXPECT_HAS(error_of([&] { models::EncoderConfig::from_json(own); }), "z_steps");
}

models::EncoderConfig tiny() {
  models::EncoderConfig c = models::encoder_config_from_json(xlarge_mnli());
  c.vocab_size = 40;
  c.max_positions = 20;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.ffn_hidden = 16;
  c.deberta.position_buckets = 4;
  return c;
}

TEST(DebertaClassifier, OwnModelInitialisesAndChecksItsInputs) {
  models::DebertaClassifier m(tiny());
  EXPECT_EQ(m.num_parameters(), m.config().num_parameters());
  const auto named = m.named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const std::vector<float> whole = named[k].second.to_vector();
    std::vector<float> pieces(whole.size());
    const int64_t n = static_cast<int64_t>(whole.size()), half = n / 2 + 1;
    ASSERT_TRUE(m.init_parameter_range(k, 0, half, pieces.data()));
    ASSERT_TRUE(m.init_parameter_range(k, half, n - half, pieces.data() + half));
    EXPECT_EQ(pieces, whole) << named[k].first;
  }
  const Tensor ids = Tensor::from_ints({5, 6, 7, 0, 8, 9, 0, 0}, {2, 4});
  EXPECT_HAS(error_of([&] {
               m.logits({ids, Tensor::from_ints({0, 1, 1, 0, 1, 1, 0, 0}, {2, 4}), {}});
             }),
             "masks token 0");
  EXPECT_HAS(error_of([&] {
               m.logits({ids, Tensor::from_ints({1, 2, 1, 0, 1, 1, 0, 0}, {2, 4}), {}});
             }),
             "only 0 and 1");
  EXPECT_HAS(error_of([&] {
               m.loss({ids, {}, {}}, Tensor::from_ints({0, 3}, {2}));
             }),
             "outside [0, num_labels 3)");
  // A mask with a hole in the middle is fine (any 0/1 mask with token 0 kept), and longer
  // sequences than max_positions are too (no absolute positions; distances are clamped).
  m.train(false);
  EXPECT_EQ(m.logits({ids, Tensor::from_ints({1, 0, 1, 1, 1, 1, 0, 0}, {2, 4}), {}}).shape(),
            (Shape{2, 3}));
  EXPECT_EQ(m.logits({Tensor::from_ints(std::vector<int64_t>(50, 5), {2, 25}), {}, {}}).shape(),
            (Shape{2, 3}));
  // One token (the skew's degenerate case) is the same computation as the first of two whose
  // second is masked out.
  const std::vector<float> one = m.logits({Tensor::from_ints({5, 8}, {2, 1}), {}, {}}).to_vector();
  const std::vector<float> two =
      m.logits(
           {Tensor::from_ints({5, 6, 8, 9}, {2, 2}), Tensor::from_ints({1, 0, 1, 0}, {2, 2}), {}})
          .to_vector();
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(one[i], two[i], 1e-6f);
  // Checkpointing the whole model (Module::operator() recomputes it in backward) gives the same
  // gradients; one layer alone is refused.
  {
    models::DebertaClassifier plain(tiny()), ckpt(tiny());
    plain.train(false);
    ckpt.train(false);
    ckpt.set_gradient_checkpointing(true);
    ops::sum(plain(ids)).backward();
    ops::sum(ckpt(ids)).backward();
    const auto pa = plain.named_parameters(), pb = ckpt.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(pa[i].second.grad().to_vector(), pb[i].second.grad().to_vector()) << pa[i].first;
    ckpt.set_gradient_checkpointing(false);
    for (const auto& [name, module] : ckpt.named_modules())
      if (name == "encoder.layer.0") module->set_gradient_checkpointing(true);
    EXPECT_HAS(error_of([&] { ckpt(ids); }), "gradient checkpointing of one DeBERTa layer");
  }
  // Dropout only in training.
  models::EncoderConfig dc = tiny();
  dc.hidden_dropout = 0.5f;
  models::DebertaClassifier d(dc);
  d.train(false);
  const std::vector<float> eval = d.logits({ids, {}, {}}).to_vector();
  EXPECT_EQ(d.logits({ids, {}, {}}).to_vector(), eval);
  d.train(true);
  EXPECT_NE(d.logits({ids, {}, {}}).to_vector(), eval);
}

TEST(DebertaIO, MismatchedHeadIsNamedAndAPretrainingCheckpointGetsAFreshHead) {
  const fs::path dir = case_dir("deberta_xl");
  models::EncoderConfig c = *models::read_hf_encoder_config(dir);
  models::EncoderConfig wrong = c;
  wrong.num_labels = 5;
  models::DebertaClassifier m(wrong, false);
  const std::string e = error_of([&] { models::load_hf_encoder_weights(m, dir); });
  EXPECT_HAS(e, "classifier.weight");
  EXPECT_HAS(e, "the file's head has 3 labels, config.json 5");
  // A pretraining checkpoint (DebertaV2ForMaskedLM: no pooler or classifier, an MLM head, and
  // position_embeddings that position_biased_input false ignores) loads with a fresh head.
  const fs::path base = fs::temp_directory_path() / ("ds_deb_base_" + std::to_string(::getpid()));
  {
    auto full = import(dir);
    models::export_hf_encoder(*full, base);
    safetensors::Reader r((base / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> kept;
    for (const auto& entry : r.entries())
      if (entry.name.rfind("classifier.", 0) != 0 && entry.name.rfind("pooler.", 0) != 0)
        kept.emplace_back(entry.name, r.get(entry.name));
    kept.emplace_back("lm_predictions.lm_head.dense.weight", Tensor::zeros({32, 32}));
    kept.emplace_back("deberta.embeddings.position_embeddings.weight", Tensor::zeros({24, 32}));
    safetensors::save((base / "model.safetensors").string(), kept, {{"format", "pt"}});
  }
  models::DebertaClassifier fresh(c, /*init=*/true);
  EXPECT_HAS(error_of([&] { models::load_hf_encoder_weights(fresh, base); }), "allow_missing_head");
  const auto report = models::load_hf_encoder_weights(fresh, base, /*allow_missing_head=*/true);
  EXPECT_EQ(report.missing_head.size(), 4u);  // pooler.dense.*, classifier.*
  EXPECT_EQ(report.ignored.size(), 2u);       // the MLM head and the position embeddings
  fs::remove_all(base);
}

}  // namespace
