// ds_to_fp32 (runtime/consolidate.h and the tool): checkpoints of ZeRO stages 0, 2 and 3 in fp32
// and bf16 consolidate into exactly the engine's fp32 master weights, bf16 output is their
// rounding, the HF export loads back, and damaged checkpoints are refused naming the file. Runs
// plainly and under mpirun with 2 ranks (each rank checks the master weights it holds).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <tuple>

#include "ds/comm/group.h"
#include "ds/core/checksum.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/encoder.h"
#include "ds/models/family.h"
#include "ds/models/encoder_io.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/recorded_model.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/module.h"
#include "ds/runtime/consolidate.h"
#include "ds/runtime/engine.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kB = 2, kT = 16;

std::string ds_config(int stage, const std::string& precision) {
  const std::string prec = precision == "bf16" ? R"("bf16": {"enabled": true},)" : "";
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
    {} "zero_optimization": {{"stage": {}, "reduce_bucket_size": 4000,
      "stage3_param_persistence_threshold": 100}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     kB, prec, stage);
}

std::unique_ptr<runtime::Engine> make_engine(const std::string& cfg, const models::GPTConfig& mc,
                                             std::shared_ptr<comm::Group> g, bool partitioned) {
  std::shared_ptr<models::GPT> model;
  if (partitioned) {
    nn::PartitionedInit no_full_model;
    model = std::make_shared<models::GPT>(mc);
  } else {
    model = std::make_shared<models::GPT>(mc);
  }
  runtime::InitOptions opt;
  opt.group = std::move(g);
  opt.log = [](const std::string&) {};
  return runtime::initialize(model, cfg, opt);
}

// A few optimizer steps on a deterministic token pattern (rank r takes its own samples).
void train(runtime::Engine& e, int steps, int64_t vocab) {
  for (int s = 0; s < steps; ++s) {
    Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
    for (int64_t i = 0; i < kB * kT; ++i) {
      const int64_t v = (s * 11 + e.rank() * 5 + i * 3 + (i / 4) * 7) % vocab;
      x.data<int32_t>()[i] = static_cast<int32_t>(v);
      y.data<int32_t>()[i] = static_cast<int32_t>((v + 1) % vocab);
    }
    Tensor loss = e.forward(x, y);
    e.backward(loss);
    e.step();
  }
}

// The consolidated flat parameter space (numel,) fp32.
std::vector<float> consolidated_flat(const runtime::CheckpointShards& ck) {
  std::vector<float> flat(static_cast<size_t>(ck.numel()));
  for (size_t i = 0; i < ck.parameters().size(); ++i) {
    const Tensor t = ck.parameter(i);
    std::memcpy(flat.data() + ck.parameters()[i].offset, t.data<float>(),
                static_cast<size_t>(t.numel()) * sizeof(float));
  }
  return flat;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void update_checksum(const fs::path& file) {
  const fs::path sums_path = file.parent_path() / "checksums.json";
  nlohmann::json sums = nlohmann::json::parse(std::ifstream(sums_path));
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  sums[file.filename().string()] = {
      {"bytes", bytes.size()},
      {"xxh64", fmt::format("{:016x}", xxh64(bytes.data(), bytes.size()))}};
  std::ofstream(sums_path) << sums.dump(2);
}

fs::path shard_of(const fs::path& folder, int rank, const std::string& precision) {
  return folder / fmt::format("{}zero_pp_rank_{}_mp_rank_00_optim_states.safetensors",
                              precision == "bf16" ? "bf16_" : "", rank);
}

}  // namespace

class ToFp32 : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ToFp32, ConsolidatesExactlyTheMasterWeights) {
  const auto [stage, precision] = GetParam();
  auto g = comm::world();
  const int n = g->size();
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("ds_to_fp32_{}_{}_{}", stage, precision, n);
  if (g->rank() == 0) fs::remove_all(dir);
  g->barrier();
  const auto mc = models::GPTConfig::preset("test-gpt2");
  auto e = make_engine(ds_config(stage, precision), mc, g, stage == 3);
  train(*e, 3, mc.vocab_size);
  e->save_checkpoint(dir.string());

  // This rank's master weights, in the coordinates of its optimizer range.
  std::vector<float> mine;
  e->strategy().state().for_each(zero::Access::Read, [&](const zero::StateChunk& c) {
    if (static_cast<int64_t>(mine.size()) < c.begin + c.numel)
      mine.resize(static_cast<size_t>(c.begin + c.numel));
    std::memcpy(mine.data() + c.begin, c.master, static_cast<size_t>(c.numel) * sizeof(float));
  });

  runtime::CheckpointShards ck(dir);  // 'latest'
  EXPECT_EQ(ck.folder(), dir / "global_step3");
  EXPECT_EQ(ck.world_size(), n);
  EXPECT_EQ(ck.zero_stage(), stage);
  EXPECT_EQ(ck.numel(), e->flat().numel);
  const std::vector<float> flat = consolidated_flat(ck);
  int64_t checked = 0;
  for (const zero::HeldRange& h : e->strategy().held_ranges()) {
    const int64_t len = h.flat_end - h.flat_begin;
    ASSERT_LE(h.offset + len, static_cast<int64_t>(mine.size()));
    EXPECT_EQ(std::memcmp(flat.data() + h.flat_begin, mine.data() + h.offset,
                          static_cast<size_t>(len) * sizeof(float)),
              0)
        << "flat [" << h.flat_begin << ", " << h.flat_end << ") differs from rank " << e->rank()
        << "'s master weights";
    checked += len;
  }
  if (stage == 0 || n == 1) EXPECT_EQ(checked, e->flat().numel);

  if (g->rank() == 0) {
    const fs::path f32 = dir / "out" / "fp32.safetensors", b16 = dir / "out" / "bf16.safetensors";
    fs::create_directories(f32.parent_path());
    ck.write_safetensors(f32, DType::f32);
    ck.write_safetensors(b16, DType::bf16);
    const auto a = safetensors::load(f32.string()), b = safetensors::load(b16.string());
    // The model-states file holds the weights in the training dtype: the rounded master weights.
    const auto model_states =
        safetensors::load((ck.folder() / "mp_rank_00_model_states.safetensors").string());
    ASSERT_EQ(a.size(), ck.parameters().size());
    ASSERT_EQ(b.size(), ck.parameters().size());
    for (const auto& p : ck.parameters()) {
      const Tensor& t32 = a.at(p.name);
      const Tensor& t16 = b.at(p.name);
      ASSERT_EQ(t32.shape(), p.shape) << p.name;
      ASSERT_EQ(t16.dtype(), DType::bf16) << p.name;
      const float* src = flat.data() + p.offset;
      EXPECT_EQ(std::memcmp(t32.data<float>(), src, static_cast<size_t>(p.numel) * 4), 0) << p.name;
      int64_t bad = 0;
      for (int64_t i = 0; i < p.numel; ++i)
        bad += static_cast<const uint16_t*>(t16.raw_data())[i] != float_to_bf16(src[i]);
      EXPECT_EQ(bad, 0) << p.name << ": bf16 output is not the rounding of the master weights";
      const Tensor& w = model_states.at(p.name);
      const Tensor& same = precision == "bf16" ? t16 : t32;
      EXPECT_EQ(std::memcmp(w.raw_data(), same.raw_data(), w.nbytes()), 0)
          << p.name << ": the model-states weights are not the " << precision << " master weights";
    }
    EXPECT_EQ(safetensors::Reader(f32.string()).metadata().at("format"), "pt");

    if (n > 1 && stage > 0) {  // stage 0: rank 0 writes the one shard
      // A missing rank's shard is named.
      const fs::path broken = dir / "broken";
      fs::copy(ck.folder(), broken, fs::copy_options::recursive);
      fs::remove(shard_of(broken, 1, precision));
      const std::string err = error_of([&] { runtime::CheckpointShards bad(broken); });
      EXPECT_NE(err.find(shard_of(broken, 1, precision).string()), std::string::npos) << err;
      EXPECT_NE(err.find("is missing"), std::string::npos) << err;
    }
  }
  g->barrier();
  if (g->rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, ToFp32,
                         ::testing::Combine(::testing::Values(0, 2, 3),
                                            ::testing::Values("fp32", "bf16")),
                         [](const auto& info) {
                           return fmt::format("stage{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param));
                         });

class ToFp32Single : public ::testing::Test {
 protected:
  void SetUp() override {
    if (comm::world()->size() > 1) GTEST_SKIP() << "single-process cases";
    dir_ = fs::temp_directory_path() /
           fmt::format("ds_to_fp32_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A stage-2 fp32 checkpoint of `mc`; returns its global_step folder.
  fs::path save(const models::GPTConfig& mc,
                const nlohmann::json& client = nlohmann::json::object()) {
    auto e = make_engine(ds_config(2, "fp32"), mc, comm::single_process_group(), false);
    train(*e, 2, mc.vocab_size);
    e->save_checkpoint((dir_ / "run").string(), "", client);
    return dir_ / "run" / "global_step2";
  }
  fs::path dir_;
};

TEST_F(ToFp32Single, DamagedCheckpointsAreRefusedNamingTheFile) {
  const fs::path ck = save(models::GPTConfig::preset("test-gpt2"));
  const fs::path shard = shard_of(ck, 0, "fp32");
  auto open = [&](const fs::path& p) { return error_of([&] { runtime::CheckpointShards c(p); }); };
  EXPECT_EQ(open(dir_ / "run"), "(no error)");
  EXPECT_EQ(open(ck), "(no error)");  // the tag folder itself

  // A flipped byte in the master weights.
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x7f');
  }
  std::string err = open(ck);
  EXPECT_NE(err.find(shard.string() + " is corrupted: checksum"), std::string::npos) << err;

  // Truncated.
  fs::resize_file(shard, fs::file_size(shard) - 8);
  err = open(ck);
  EXPECT_NE(err.find(shard.string() + " is truncated"), std::string::npos) << err;

  // Segments that leave a parameter without master weights (checksums updated: a consistent file).
  {
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::map<std::string, std::string> meta;
    fs::resize_file(shard, fs::file_size(shard) + 8);  // the checksum is recomputed below
    {
      safetensors::Reader r(shard.string());
      for (const auto& name : r.names()) tensors.emplace_back(name, r.get(name));
      meta = r.metadata();
    }
    nlohmann::json j = nlohmann::json::parse(meta.at("ds_optimizer"));
    j["segments"][0][1] = j["segments"][0][1].get<int64_t>() - 10;
    meta["ds_optimizer"] = j.dump();
    safetensors::save(shard.string(), tensors, meta);
    update_checksum(shard);
  }
  err = open(ck);
  EXPECT_NE(err.find("cover"), std::string::npos) << err;
  EXPECT_NE(err.find("has no master weights"), std::string::npos) << err;

  // The shard deleted.
  fs::remove(shard);
  err = open(ck);
  EXPECT_NE(err.find(shard.string() + " is missing"), std::string::npos) << err;

  // No checksums.
  fs::remove(ck / "checksums.json");
  err = open(ck);
  EXPECT_NE(err.find("checksums.json is missing"), std::string::npos) << err;
  err = open(dir_ / "nothing");
  EXPECT_NE(err.find("is not a folder"), std::string::npos) << err;
}

TEST_F(ToFp32Single, ToolWritesFilesAndHfFolders) {
  auto mc = models::GPTConfig::preset("test-gpt2");
  mc.vocab_size = 704;  // the fixture tokenizer's 701 ids fit
  const fs::path ck = save(mc, {{"ds_train", {{"model", mc.to_json()}}}});
  const std::string bin = DS_TO_FP32_BIN;
  auto run = [&](const std::string& args) {
    const std::string log = (dir_ / "tool.log").string();
    const int rc = std::system(fmt::format("{} {} > {} 2>&1", bin, args, log).c_str());
    std::ifstream in(log);
    return std::pair{rc, std::string{std::istreambuf_iterator<char>(in), {}}};
  };
  runtime::CheckpointShards shards(ck);

  // One file, bf16.
  auto [rc, out] = run(fmt::format("{} {} --dtype bf16", (dir_ / "run").string(),
                                   (dir_ / "m.safetensors").string()));
  ASSERT_EQ(rc, 0) << out;
  const auto b = safetensors::load((dir_ / "m.safetensors").string());
  for (size_t i = 0; i < shards.parameters().size(); ++i) {
    const Tensor want = shards.parameter(i).to(DType::bf16);
    const Tensor& got = b.at(shards.parameters()[i].name);
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
  }

  // An HF folder with the tokenizer; it loads back into the same fp32 weights.
  std::tie(rc, out) = run(fmt::format(
      "{} {} --tag global_step2 --tokenizer {}", (dir_ / "run").string(), (dir_ / "hf").string(),
      (fs::path(DS_FIXTURE_DIR) / "tokenizers" / "gpt2_bpe").string()));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "tokenizer.json")) << out;
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "config.json")) << out;
  models::GPT loaded(*models::read_hf_config(dir_ / "hf"), /*init=*/false);
  models::load_hf_weights(loaded, dir_ / "hf");
  for (auto& [name, p] : loaded.named_parameters()) {
    size_t i = 0;
    while (shards.parameters()[i].name != name) ++i;
    const Tensor want = shards.parameter(i);
    EXPECT_EQ(std::memcmp(p.data<float>(), want.data<float>(), want.nbytes()), 0) << name;
  }
  // The output exists now: refused, not overwritten.
  std::tie(rc, out) = run(fmt::format("{} {}", (dir_ / "run").string(), (dir_ / "hf").string()));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("exists and is not an empty folder"), std::string::npos) << out;
  // A missing shard: a clear message and no output file.
  fs::remove(shard_of(ck, 0, "fp32"));
  std::tie(rc, out) =
      run(fmt::format("{} {}", (dir_ / "run").string(), (dir_ / "x.safetensors").string()));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("[ds_to_fp32]"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
}

TEST_F(ToFp32Single, HfExportWithoutARecordedModelNeedsModel) {
  const fs::path ck = save(models::GPTConfig::preset("test-gpt2"));
  const std::string log = (dir_ / "tool.log").string();
  const std::string cmd =
      fmt::format("{} {} {} > {} 2>&1", DS_TO_FP32_BIN, ck.string(), (dir_ / "hf").string(), log);
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::ifstream in(log);
  const std::string out{std::istreambuf_iterator<char>(in), {}};
  EXPECT_NE(out.find("give --model"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "hf"));
  const std::string ok = fmt::format("{} {} {} --model test-gpt2 > {} 2>&1", DS_TO_FP32_BIN,
                                     ck.string(), (dir_ / "hf").string(), log);
  EXPECT_EQ(std::system(ok.c_str()), 0);
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "model.safetensors"));
}

// Checkpoints of encoder-decoders (BART, T5 tied and untied) and encoder classifiers (BERT,
// DeBERTa-v2), as ds_train writes them (the model's config recorded in client_state), become HF
// folders of their own kind whose parameters are the master weights bit for bit and whose
// buffers (BART's final_logits_bias) are the model's: checkpoints carry them
// (model_buffers.safetensors), and a resume restores them too.
TEST_F(ToFp32Single, EncoderDecodersAndClassifiersExportTheirKind) {
  const fs::path fixtures = fs::path(DS_FIXTURE_DIR) / "hf_families";
  for (const std::string name :
       {"bart_s2s", "t5_relu_tied", "t5_gated_untied", "bert_cls", "deberta_types"}) {
    SCOPED_TRACE(name);
    const fs::path src = fixtures / name;
    std::shared_ptr<nn::Module> model;
    nlohmann::json recorded;
    if (auto c = models::read_hf_seq2seq_config(src)) {
      auto m = std::make_shared<models::Seq2Seq>(*c, /*init=*/false);
      models::load_hf_seq2seq_weights(*m, src);
      model = m;
      recorded = c->to_json();
    } else {
      const models::EncoderConfig ec = *models::read_hf_encoder_config(src);
      auto m = models::make_encoder_classifier(ec, /*init=*/false);
      models::load_hf_encoder_weights(*m, src);
      model = m;
      recorded = ec.to_json();
    }
    EXPECT_NE(models::recorded_model_kind(recorded), models::ModelKind::decoder);
    runtime::InitOptions opt;
    opt.group = comm::single_process_group();
    opt.log = [](const std::string&) {};
    auto e = runtime::initialize(model, ds_config(3, "fp32"), opt);
    const fs::path run = dir_ / name;
    // A classifier run records its label names beside the model (issue 31, item 8).
    nlohmann::json ds_train = {{"model", recorded}};
    if (name == "bert_cls") ds_train["labels"] = {"neg", "neu", "pos"};
    e->save_checkpoint(run.string(), "", {{"ds_train", ds_train}});
    // The buffers (the fixtures' random final_logits_bias) are in the checkpoint: a resume into
    // a model that lost them restores them.
    std::vector<std::vector<float>> buffers;
    for (const auto& [n, b] : model->named_buffers()) {
      buffers.push_back(b.to_vector());
      b.zero_();
    }
    if (name.rfind("bart", 0) == 0) ASSERT_EQ(buffers.size(), 1u);
    e->load_checkpoint(run.string());
    for (size_t i = 0; i < buffers.size(); ++i)
      EXPECT_EQ(model->named_buffers()[i].second.to_vector(), buffers[i]) << "resumed buffer";
    const fs::path out = dir_ / (name + "_hf"), log = dir_ / "tool.log";
    const int rc = std::system(
        fmt::format("{} {} {} > {} 2>&1", DS_TO_FP32_BIN, run.string(), out.string(), log.string())
            .c_str());
    std::ifstream in(log);
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    ASSERT_EQ(rc, 0) << text;
    runtime::CheckpointShards shards(run);
    std::shared_ptr<nn::Module> back;
    if (auto c = models::read_hf_seq2seq_config(out)) {
      auto m = std::make_shared<models::Seq2Seq>(*c, /*init=*/false);
      models::load_hf_seq2seq_weights(*m, out);
      back = m;
    } else {
      ASSERT_TRUE(models::read_hf_encoder_config(out).has_value()) << text;
      auto m = models::make_encoder_classifier(*models::read_hf_encoder_config(out), false);
      models::load_hf_encoder_weights(*m, out);
      back = m;
    }
    if (name == "bert_cls") {  // the run's id2label, not LABEL_0..2
      const auto cfg = nlohmann::json::parse(std::ifstream(out / "config.json"));
      EXPECT_EQ(cfg["id2label"], nlohmann::json({{"0", "neg"}, {"1", "neu"}, {"2", "pos"}}));
      EXPECT_EQ(cfg["label2id"]["pos"], 2);
    }
    ASSERT_EQ(back->named_parameters().size(), shards.parameters().size());
    ASSERT_EQ(back->named_buffers().size(), buffers.size());
    for (size_t i = 0; i < buffers.size(); ++i)
      EXPECT_EQ(back->named_buffers()[i].second.to_vector(), buffers[i]) << "exported buffer";
    for (size_t i = 0; i < shards.parameters().size(); ++i) {
      const Tensor want = shards.parameter(i);
      Tensor got;
      for (const auto& [n, p] : back->named_parameters())
        if (n == shards.parameters()[i].name) got = p;
      ASSERT_TRUE(got.defined()) << shards.parameters()[i].name;
      EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), want.nbytes()), 0)
          << shards.parameters()[i].name;
    }
  }
  // Weights that do not fit the recorded model are refused by name.
  const models::Seq2SeqConfig c = *models::read_hf_seq2seq_config(fixtures / "bart_s2s");
  models::Seq2Seq m(c, /*init=*/false);
  auto named = m.named_parameters();
  named.pop_back();
  EXPECT_NE(error_of([&] { models::export_hf_recorded(c.to_json(), named, dir_ / "bad"); })
                .find("no weight for parameter"),
            std::string::npos);
  named = m.named_parameters();
  named.emplace_back("model.encoder.layers.9.fc1.weight", named.front().second);
  EXPECT_NE(error_of([&] { models::export_hf_recorded(c.to_json(), named, dir_ / "bad"); })
                .find("is not a parameter of the recorded encoder-decoder model"),
            std::string::npos);
}

// Issue 31, item 5: what a killed ds_to_fp32 left beside its output is cleaned by the next run of
// that output: a dead process's temporary goes; the previous output set aside (".old-<pid>") comes
// back when the replacement never took its name; another output's and a live process's stay.
TEST_F(ToFp32Single, CleansTheTemporariesOfAKilledRun) {
  auto mc = models::GPTConfig::preset("test-gpt2");
  save(mc, {{"ds_train", {{"model", mc.to_json()}}}});
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path tmp = dir_ / fmt::format(".hf.tmp-{}", dead);
  const fs::path other = dir_ / fmt::format(".other.tmp-{}", dead);
  const fs::path live = dir_ / fmt::format(".hf.tmp-{}", ::getpid());
  const fs::path single = dir_ / fmt::format("m.safetensors.tmp.{}", dead);
  for (const fs::path& p : {tmp, other, live}) fs::create_directories(p);
  std::ofstream(single) << "half";
  const std::string log = (dir_ / "tool.log").string();
  auto run = [&](const std::string& out) {
    const int rc = std::system(fmt::format("{} {} {} > {} 2>&1", DS_TO_FP32_BIN,
                                           (dir_ / "run").string(), out, log)
                                   .c_str());
    std::ifstream in(log);
    return std::pair{rc, std::string{std::istreambuf_iterator<char>(in), {}}};
  };
  auto [rc, text] = run((dir_ / "m.safetensors").string());
  ASSERT_EQ(rc, 0) << text;
  EXPECT_FALSE(fs::exists(single)) << text;
  EXPECT_TRUE(fs::exists(tmp));  // another output's
  std::tie(rc, text) = run((dir_ / "hf").string());
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("left by an interrupted earlier ds_to_fp32"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(live));
  // Killed between setting the old folder aside and renaming the new one in: the old one is back.
  fs::rename(dir_ / "hf", dir_ / fmt::format(".hf.old-{}", dead));
  std::tie(rc, text) = run((dir_ / "hf").string());
  EXPECT_NE(rc, 0) << text;  // restored, so the output exists again: --overwrite is needed
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "config.json")) << text;
}

// The output must never land on the checkpoint it reads (it replaced a shard and exited 0), and an
// existing file is replaced only when asked.
TEST_F(ToFp32Single, RefusesOutputsOnTheCheckpointAndExistingFilesWithoutOverwrite) {
  auto mc = models::GPTConfig::preset("test-gpt2");
  const fs::path ck = save(mc, {{"ds_train", {{"model", mc.to_json()}}}});
  auto run = [&](const std::string& args) {
    const std::string log = (dir_ / "tool.log").string();
    const int rc = std::system(fmt::format("{} {} > {} 2>&1", DS_TO_FP32_BIN, args, log).c_str());
    std::ifstream in(log);
    return std::pair{rc, std::string{std::istreambuf_iterator<char>(in), {}}};
  };
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(in), {}};
  };
  const fs::path run_dir = dir_ / "run";
  const fs::path shard = shard_of(ck, 0, "fp32");
  const std::string shard_before = bytes_of(shard);
  // A symbolic link to the run folder must not slip through either.
  fs::create_directory_symlink(run_dir, dir_ / "alias");
  const fs::path via_link = dir_ / "alias" / ck.filename() / "z.safetensors";
  for (const fs::path& bad :
       {shard, ck / "x.safetensors", ck / ".." / "global_step2" / "y.safetensors", fs::path(ck),
        via_link}) {
    auto [rc, out] = run(fmt::format("{} {} --overwrite", run_dir.string(), bad.string()));
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find("inside the checkpoint folder"), std::string::npos) << out;
  }
  auto [rc, out] = run(fmt::format("{} {} --overwrite", run_dir.string(), (run_dir / "latest").string()));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("'latest' file"), std::string::npos) << out;
  EXPECT_EQ(bytes_of(shard), shard_before);
  EXPECT_FALSE(fs::exists(ck / "x.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "z.safetensors"));

  // Beside the checkpoint (zero_to_fp32.py's habit) is fine; a second run needs --overwrite.
  const fs::path file = run_dir / "consolidated.safetensors";
  std::tie(rc, out) = run(fmt::format("{} {}", run_dir.string(), file.string()));
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = run(fmt::format("{} {}", run_dir.string(), file.string()));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("exists; choose another output, or give --overwrite"), std::string::npos)
      << out;
  std::tie(rc, out) = run(fmt::format("{} {} --overwrite --dtype bf16", run_dir.string(),
                                      file.string()));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(safetensors::load(file.string()).begin()->second.dtype(), DType::bf16);
  // A non-empty HF folder is replaced whole with --overwrite.
  const fs::path hf = dir_ / "hf";
  fs::create_directories(hf);
  std::ofstream(hf / "stale.txt") << "old";
  std::tie(rc, out) = run(fmt::format("{} {}", run_dir.string(), hf.string()));
  EXPECT_NE(rc, 0);
  std::tie(rc, out) = run(fmt::format("{} {} --overwrite", run_dir.string(), hf.string()));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(hf / "config.json"));
  EXPECT_FALSE(fs::exists(hf / "stale.txt"));
}

// The tool prints what a damaged `latest` names escaped and cut to ~200 characters, never its raw
// bytes (a binary file) or all of it (a long line).
TEST_F(ToFp32Single, DamagedLatestIsQuotedShortAndEscaped) {
  save(models::GPTConfig::preset("test-gpt2"));
  const fs::path run_dir = dir_ / "run";
  auto run = [&]() {
    const std::string log = (dir_ / "tool.log").string();
    const int rc = std::system(fmt::format("{} {} {} > {} 2>&1", DS_TO_FP32_BIN, run_dir.string(),
                                           (dir_ / "out.safetensors").string(), log)
                                   .c_str());
    std::ifstream in(log);
    return std::pair{rc, std::string{std::istreambuf_iterator<char>(in), {}}};
  };
  std::ofstream(run_dir / "latest", std::ios::binary) << std::string(
      "glob\xff\x01"
      "al\x1b[2J");
  auto [rc, out] = run();
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("[ds_to_fp32]"), std::string::npos) << out;
  EXPECT_NE(out.find("'glob\\xff\\x01al\\x1b[2J'"), std::string::npos) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  // A printable tag of 4000 characters (under the 4 KiB size limit, over any folder name's): it
  // used to reach the filesystem, whose "File name too long" error echoed all of it.
  std::ofstream(run_dir / "latest", std::ios::binary) << std::string(4000, 'g') << "\n";
  std::tie(rc, out) = run();
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("longer than any folder name"), std::string::npos) << out;
  EXPECT_NE(out.find("bytes in all"), std::string::npos) << out;
  EXPECT_LT(out.size(), 1000u) << out;
}
