// An encoder classifier trained end to end on a synthetic sentence-pair task (is sentence B a
// shuffled copy of sentence A, or another sentence?), prepared with the WordPiece fixture
// tokenizer: the library's ClassifierTrainer called directly (accuracy rises well above chance;
// a resumed run reproduces an uninterrupted one exactly; the HF export scores the same; options
// that do not apply are refused by name), then ds_train as a process (ZeRO-3 training, export,
// --eval_only on the export).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/data/classification_set.h"
#include "ds/data/shard.h"
#include "ds/models/family.h"
#include "ds/models/peft_io.h"
#include "ds/nn/lora.h"
#include "ds/train/classifier.h"
#include "ds/train/plan.h"
#include "ds/train/trainer.h"
#include "task_fixture.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ds;

namespace {

struct Recorder : train::ClassifierObserver {
  std::vector<train::StepReport> steps;
  std::vector<train::ClassifyEvalReport> evals;
  std::vector<std::string> messages;
  void message(const std::string& s) override { messages.push_back(s); }
  void on_step(const train::StepReport& r) override { steps.push_back(r); }
  void on_classify_eval(const train::ClassifyEvalReport& r) override { evals.push_back(r); }
};

// Records of the synthetic task: label 1 = B is A's words shuffled, 0 = B is another sentence.
std::string pair_task(int n, uint32_t seed) {
  static const char* kWords[] = {"the",   "cat",   "sat",   "on",   "a",     "mat", "dogs",
                                 "ran",   "far",   "away",  "into", "night", "she", "said",
                                 "hello", "world", "tests", "pass", "maybe"};
  std::mt19937 rng(seed);
  auto word = [&] { return std::string(kWords[rng() % std::size(kWords)]); };
  auto sentence = [&] {
    std::vector<std::string> s(3 + rng() % 3);
    for (auto& w : s) w = word();
    return s;
  };
  auto join = [](const std::vector<std::string>& s) {
    std::string out;
    for (const auto& w : s) out += (out.empty() ? "" : " ") + w;
    return out;
  };
  std::string text;
  for (int i = 0; i < n; ++i) {
    const auto a = sentence();
    auto b = a;
    const int label = static_cast<int>(rng() % 2);
    if (label == 1)
      std::shuffle(b.begin(), b.end(), rng);
    else
      b = sentence();
    text += json{{"sentence1", join(a)}, {"sentence2", join(b)}, {"label", label}}.dump() + "\n";
  }
  return text;
}

class ClassifierTrain
    : public ds::testing::TaskTrainTest<train::ClassifierPlan, train::plan_classifier> {
 protected:
  static void SetUpTestSuite() {
    set_up_suite("cls_train_");
    std::ofstream(root_ / "train.jsonl") << pair_task(640, 1);
    std::ofstream(root_ / "dev.jsonl") << pair_task(160, 2);
    data::ClassificationPrepareOptions o;
    o.inputs = {root_ / "train.jsonl", root_ / "dev.jsonl"};
    o.tokenizer_dir = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "bert_wordpiece";
    o.output_dir = root_ / "set";
    o.seq_len = 32;
    o.val_files = "dev*";
    data::prepare_classification(o);
    // A tiny BERT with dropout (the resume must restore the dropout stream) and one without.
    std::ofstream(root_ / "bert_dropout.json")
        << R"({"n_layer": 2, "n_head": 2, "n_embd": 64, "ffn_hidden": 128})";
    std::ofstream(root_ / "bert_nodrop.json")
        << R"({"n_layer": 2, "n_head": 2, "n_embd": 64, "ffn_hidden": 128, "hidden_dropout": 0.0,
              "attention_dropout": 0.0})";
  }

  train::Options options(const std::string& out) const {
    train::Options o;
    o.train_data = (root_ / "set").string();
    o.output_dir = (root_ / out).string();
    o.model = (root_ / "bert_dropout.json").string();
    o.per_device_train_batch_size = 16;
    o.learning_rate = 2e-3;
    o.warmup_steps = 5;
    o.eval_steps = 0;
    o.save_steps = 0;
    o.export_hf = "none";
    return o;
  }
};

TEST_F(ClassifierTrain, LearnsThePairTaskAndExports) {
  train::Options o = options("learn");
  o.model = (root_ / "bert_nodrop.json").string();
  o.max_steps = 120;
  o.export_hf = (root_ / "learn" / "hf").string();
  ASSERT_TRUE(train::is_classification_run(o));
  Recorder rec;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  EXPECT_EQ(t.plan().seq_len, 32);
  EXPECT_EQ(t.plan().eval_examples, 160);
  const auto before = t.evaluate();
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(before->scores.examples, 160);
  t.fit();
  ASSERT_EQ(rec.steps.size(), 120u);
  ASSERT_TRUE(t.last_eval().has_value());
  const auto& after = *t.last_eval();
  std::printf("pair task: accuracy %.3f -> %.3f, f1 %.3f, eval loss %.4f -> %.4f\n",
              before->scores.accuracy, after.scores.accuracy, after.scores.f1, before->loss,
              after.loss);
  EXPECT_GT(after.scores.accuracy, 0.7);  // chance: about 0.5
  EXPECT_GT(after.scores.accuracy, before->scores.accuracy + 0.15);
  EXPECT_LT(after.loss, before->loss);

  // The export: transformers' folder (id2label, the tokenizer with token type ids), and the
  // same scores when ds_train starts from it.
  t.export_model(o.export_hf);
  const json cfg = json::parse(std::ifstream(fs::path(o.export_hf) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(cfg["id2label"]["1"], "1");
  const json tok = json::parse(std::ifstream(fs::path(o.export_hf) / "tokenizer_config.json"));
  EXPECT_EQ(tok["model_input_names"][1], "token_type_ids");
  train::Options e = options("from_export");
  e.model.clear();
  e.init_from = o.export_hf;
  e.eval_only = true;
  e.max_steps = 1;
  train::Given g = given();
  g.model = false;
  Recorder rec2;
  train::ClassifierTrainer t2(train::plan_classifier(e, g, builtin_.c_str()), rec2);
  const auto again = t2.evaluate();
  ASSERT_TRUE(again.has_value());
  EXPECT_DOUBLE_EQ(again->scores.accuracy, after.scores.accuracy);
  EXPECT_NEAR(again->loss, after.loss, 1e-5);

  // A checkpoint without a classifier head (as bert-base-uncased) whose config says 3 labels:
  // the new head takes the data's 2 and is initialised fresh. With a head, 3 labels are refused.
  const fs::path bare = root_ / "learn" / "bare", headed = root_ / "learn" / "headed";
  for (const fs::path& d : {bare, headed}) {
    fs::create_directories(d);
    json c = cfg;
    c["ds_cpp"]["num_labels"] = 3;
    std::ofstream(d / "config.json") << c.dump();
    std::vector<std::pair<std::string, Tensor>> keep;
    for (auto& [n, t] : safetensors::load((fs::path(o.export_hf) / "model.safetensors").string()))
      if (d == headed || n.rfind("classifier.", 0) != 0) keep.emplace_back(n, t);
    safetensors::save((d / "model.safetensors").string(), keep);
  }
  e.init_from = bare.string();
  Recorder rec3;
  train::ClassifierTrainer t3(train::plan_classifier(e, g, builtin_.c_str()), rec3);
  EXPECT_EQ(t3.plan().model.num_labels, 2);
  bool fresh = false;
  for (const auto& m : rec3.messages) fresh |= m.find("new classifier head") != std::string::npos;
  EXPECT_TRUE(fresh);
  e.init_from = headed.string();
  const std::string err = error_of(e, g);
  EXPECT_NE(err.find("num_labels 3"), std::string::npos) << err;
}

TEST_F(ClassifierTrain, ResumeReproducesAnUninterruptedRun) {
  // Dropout on, ZeRO-2: 8 steps straight vs 4 steps, checkpoint, a new trainer resuming to 8.
  auto zero2 = [](train::Options& o) {
    o.deepspeed = R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps":
                      "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                      "zero_optimization": {"stage": 2}})";
  };
  train::Given g = given();
  g.deepspeed = true;
  train::Options a = options("a");
  zero2(a);
  a.max_steps = 8;
  Recorder ra;
  train::ClassifierTrainer ta(train::plan_classifier(a, g, builtin_.c_str()), ra);
  ta.fit();

  train::Options b = options("b");
  zero2(b);
  b.max_steps = 8;
  b.save_steps = 4;
  {
    train::Options b4 = b;
    Recorder r;
    train::ClassifierTrainer t(train::plan_classifier(b4, g, builtin_.c_str()), r);
    for (int i = 0; i < 4; ++i) t.step();
    t.save();
  }
  b.resume_from_checkpoint = "latest";
  Recorder rb;
  train::ClassifierTrainer tb(train::plan_classifier(b, g, builtin_.c_str()), rb);
  const auto res = tb.resume();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->step, 4);
  tb.fit();
  ASSERT_EQ(rb.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rb.steps[i].loss, ra.steps[4 + i].loss) << i;
  ASSERT_TRUE(ta.last_eval() && tb.last_eval());
  EXPECT_EQ(tb.last_eval()->loss, ta.last_eval()->loss);
  EXPECT_EQ(tb.last_eval()->scores.accuracy, ta.last_eval()->scores.accuracy);
  const auto wa = ta.engine().full_weights(), wb = tb.engine().full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;

  // A GPT run's checkpoint folder is refused (an empty output folder: no 'latest').
  train::Options c = options("c");
  c.max_steps = 8;
  c.resume_from_checkpoint = "latest";
  Recorder rc;
  train::ClassifierTrainer tc(train::plan_classifier(c, given(), builtin_.c_str()), rc);
  EXPECT_THROW(tc.resume(), ds::Error);
}

// --save_total_limit keeps the newest checkpoints of this run and never an earlier run's.
TEST_F(ClassifierTrain, RotationKeepsTheNewestAndEarlierRuns) {
  train::Options o = options("rotate");
  o.max_steps = 2;
  o.save_steps = 1;
  {
    Recorder r;
    train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), r);
    t.fit();
  }
  fs::rename(root_ / "rotate" / "global_step2", root_ / "rotate" / "global_step100");
  o.max_steps = 6;
  o.save_steps = 2;
  o.save_total_limit = 1;
  Recorder r;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), r);
  EXPECT_FALSE(t.resume().has_value());
  t.fit();
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root_ / "rotate"))
    if (e.path().filename().string().rfind("global_step", 0) == 0)
      left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"global_step1", "global_step100", "global_step6"}));
}

// RoBERTa: a byte-level BPE with RobertaProcessing (<s> A </s></s> B </s>, types 0), positions
// past the pad id, RobertaForSequenceClassification exported; BERT-style data (types 0/1) is
// refused for a model with one token type.
TEST_F(ClassifierTrain, RobertaTrainsAndExports) {
  data::ClassificationPrepareOptions p;
  p.inputs = {root_ / "train.jsonl", root_ / "dev.jsonl"};
  p.tokenizer_dir = fs::path(DS_FIXTURE_DIR) / "classification" / "roberta_bpe";
  p.output_dir = root_ / "roberta_set";
  p.seq_len = 32;
  p.val_files = "dev*";
  const auto rep = data::prepare_classification(p);
  std::ofstream(root_ / "roberta.json")
      << R"({"family": "roberta", "n_layer": 2, "n_head": 2, "n_embd": 64, "ffn_hidden": 128,
            "type_vocab_size": 1, "max_positions": 768, "norm_eps": 1e-5})";
  train::Options o = options("roberta");
  o.train_data = p.output_dir.string();
  o.model = (root_ / "roberta.json").string();
  o.max_steps = 4;
  o.export_hf = (root_ / "roberta" / "hf").string();
  Recorder rec;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  EXPECT_EQ(t.plan().model.pad_token_id, rep.pad_id);
  t.fit();
  ASSERT_TRUE(t.last_eval().has_value());
  EXPECT_TRUE(std::isfinite(t.last_eval()->loss));
  t.export_model(o.export_hf);
  const json cfg = json::parse(std::ifstream(fs::path(o.export_hf) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "RobertaForSequenceClassification");
  EXPECT_TRUE(fs::exists(fs::path(o.export_hf) / "tokenizer.json"));

  train::Options bad = o;
  bad.train_data = (root_ / "set").string();  // WordPiece pairs: type ids 0 and 1
  const std::string e = error_of(bad, given());
  EXPECT_NE(e.find("type_vocab_size is 1"), std::string::npos) << e;
}

// DeBERTa-v2 (another class behind models::SequenceClassifier) trains and exports the same way.
TEST_F(ClassifierTrain, DebertaV2TrainsAndExports) {
  std::ofstream(root_ / "deberta.json")
      << R"({"family": "deberta-v2", "n_layer": 2, "n_head": 2, "n_embd": 64, "ffn_hidden": 128})";
  train::Options o = options("deberta");
  o.model = (root_ / "deberta.json").string();
  o.max_steps = 4;
  o.export_hf = (root_ / "deberta" / "hf").string();
  Recorder rec;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  t.fit();
  ASSERT_TRUE(t.last_eval().has_value());
  EXPECT_TRUE(std::isfinite(t.last_eval()->loss));
  t.export_model(o.export_hf);
  const json cfg = json::parse(std::ifstream(fs::path(o.export_hf) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "DebertaV2ForSequenceClassification");
}

// --device sim: the classifier trains, evaluates and exports on the device as on the CPU, and so
// does a LoRA run (--only_optimize_lora: its PEFT adapter).
TEST_F(ClassifierTrain, DeviceRunTrainsEvaluatesAndExportsAsTheHost) {
  auto same_accuracy = [](const train::ClassifierTrainer& host,
                          const train::ClassifierTrainer& dev) {
    EXPECT_EQ(dev.last_eval()->scores.accuracy, host.last_eval()->scores.accuracy);
  };
  expect_device_run_as_host<train::ClassifierTrainer, Recorder>(options("device"), given(),
                                                                "device", 4, same_accuracy);
  train::Options o = options("device_lora");
  o.lora_dim = 4;
  o.only_optimize_lora = true;
  expect_device_run_as_host<train::ClassifierTrainer, Recorder>(o, given(), "device_lora", 4,
                                                                same_accuracy);
}

TEST_F(ClassifierTrain, RefusesWhatDoesNotApplyByName) {
  auto expect = [&](train::Options o, train::Given g, const std::string& part) {
    const std::string e = error_of(o, g);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in: " << e;
  };
  train::Options o = options("refuse");
  train::Given g = given();
  {
    auto x = o;
    x.only_optimize_lora = true;  // a LoRA flag without --lora_dim
    expect(x, g, "--only_optimize_lora needs LoRA");
  }
  {
    auto x = o;
    auto y = g;
    y.sample_tokens = true;
    expect(x, y, "--sample_tokens");
  }
  {
    auto x = o;
    x.tensor_parallel_size = 2;
    expect(x, g, "--tensor_parallel_size");
  }
  {
    auto x = o;
    x.gradient_checkpointing = true;
    expect(x, g, "--gradient_checkpointing");
  }
  {
    auto x = o;
    x.block_size = 64;
    expect(x, g, "--block_size 64");
  }
  {
    auto x = o;
    x.model = "tiny";  // a GPT preset
    expect(x, g, "--model tiny");
  }
  {
    auto x = o;
    x.init_from = (fs::path(DS_FIXTURE_DIR) / "hf_families" / "bert_cls").string();
    expect(x, g, "--init_from");  // with --model
  }
  {
    // The bert_cls fixture has another vocabulary than the data's tokenizer.
    auto x = o;
    auto y = g;
    x.model.clear();
    y.model = false;
    x.init_from = (fs::path(DS_FIXTURE_DIR) / "hf_families" / "bert_cls").string();
    const std::string e = error_of(x, y);
    EXPECT_FALSE(e.empty());
  }
  {
    auto x = o;
    x.deepspeed = R"({"train_micro_batch_size_per_gpu": 4, "pipeline": {"stages": 2}})";
    auto y = g;
    y.deepspeed = true;
    y.per_device_train_batch_size = false;
    expect(x, y, "pipeline.stages");
  }
}

// Issue 31, item 1: DeBERTa-v2 with type_vocab_size 0 (deberta-v2-xlarge's setting) trains and
// evaluates on a pair set: the token type ids are ignored, as transformers ignores them.
TEST_F(ClassifierTrain, DebertaWithoutTokenTypesTrainsOnPairs) {
  std::ofstream(root_ / "deberta_notypes.json")
      << R"({"family": "deberta-v2", "n_layer": 1, "n_head": 2, "n_embd": 32, "ffn_hidden": 64,
            "type_vocab_size": 0})";
  train::Options o = options("deberta_notypes");
  o.model = (root_ / "deberta_notypes.json").string();
  o.max_steps = 2;
  Recorder rec;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  EXPECT_EQ(t.plan().model.type_vocab_size, 0);
  t.fit();
  ASSERT_TRUE(t.last_eval().has_value());
  EXPECT_TRUE(std::isfinite(t.last_eval()->loss));
}

// Issue 31, items 6, 11 and 17: what would fail at the first evaluation or the export fails at
// start-up; --model takes a Hugging Face folder.
TEST_F(ClassifierTrain, StartUpChecksEvalDataTokenizerAndModelFolder) {
  const fs::path roberta = fs::path(DS_FIXTURE_DIR) / "classification" / "roberta_bpe";
  {
    // An eval set prepared with another tokenizer (700 ids; the model has the data's 400).
    data::ClassificationPrepareOptions p;
    p.inputs = {root_ / "train.jsonl", root_ / "dev.jsonl"};
    p.tokenizer_dir = roberta;
    p.output_dir = root_ / "set_roberta";
    p.seq_len = 32;
    p.val_files = "dev*";
    data::prepare_classification(p);
  }
  train::Options o = options("startup");
  o.max_steps = 2;
  o.eval_data = (root_ / "set_roberta").string();
  std::string e = error_of(o, given());
  EXPECT_NE(e.find("does not fit the model's vocab_size"), std::string::npos) << e;
  EXPECT_NE(e.find("val.cls"), std::string::npos) << e;

  o = options("startup");
  o.max_steps = 2;
  o.tokenizer = (root_ / "no_such_tokenizer").string();
  e = error_of(o, given());
  EXPECT_NE(e.find("--tokenizer " + o.tokenizer + ": no such folder"), std::string::npos) << e;
  o.tokenizer = roberta.string();
  e = error_of(o, given());
  EXPECT_NE(e.find("prepared with a tokenizer of"), std::string::npos) << e;

  // --model FOLDER reads FOLDER/config.json (random weights of that shape).
  o = options("startup");
  o.max_steps = 2;
  fs::create_directories(root_ / "bert_folder");
  json cfg = json::parse(std::ifstream(fs::path(DS_FIXTURE_DIR) / "hf_families" / "bert_cls" /
                                       "config.json"));
  cfg["vocab_size"] = 400;
  cfg["max_position_embeddings"] = 64;
  cfg.erase("id2label");
  cfg.erase("label2id");
  std::ofstream(root_ / "bert_folder" / "config.json") << cfg.dump();
  o.model = (root_ / "bert_folder").string();
  const train::ClassifierPlan plan = train::plan_classifier(o, given(), builtin_.c_str());
  EXPECT_EQ(plan.model.n_embd, 32);
  EXPECT_EQ(plan.model_name, "bert_folder");
  o.model = (root_ / "no_such_model").string();
  e = error_of(o, given());
  EXPECT_NE(e.find("deberta-v2"), std::string::npos) << e;  // the families it takes
}

// Issue 31, item 6: the final checkpoint is written before the final evaluation, so an evaluation
// that fails never costs the training.
TEST_F(ClassifierTrain, FailedFinalEvaluationKeepsTheCheckpoint) {
  struct Failing : Recorder {
    void on_classify_eval(const train::ClassifyEvalReport&) override {
      throw std::runtime_error("evaluation broke");
    }
  } rec;
  train::Options o = options("final_eval_fails");
  o.max_steps = 2;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  const std::string e = ds::testing::error_message([&] { t.fit(); });
  EXPECT_NE(e.find("evaluation broke"), std::string::npos) << e;
  EXPECT_NE(e.find("the final evaluation failed, but the training is kept"), std::string::npos)
      << e;
  EXPECT_TRUE(fs::exists(fs::path(o.output_dir) / "global_step2" /
                         "mp_rank_00_model_states.safetensors"));
}

// Issue 31, items 12 and 14: a resume with another --max_steps says the schedule is re-planned,
// and a checkpoint of another task kind is refused by kind before anything loads, both ways.
TEST_F(ClassifierTrain, ResumeNamesReplanningAndOtherTaskKinds) {
  train::Options o = options("replan");
  o.max_steps = 2;
  {
    Recorder rec;
    train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
    t.fit();
  }
  o.max_steps = 3;
  o.resume_from_checkpoint = "latest";
  Recorder rec;
  train::ClassifierTrainer t(train::plan_classifier(o, given(), builtin_.c_str()), rec);
  ASSERT_TRUE(t.resume().has_value());
  bool said = false;
  for (const std::string& m : rec.messages)
    said |= m.find("planned for 2 steps, this one for 3") != std::string::npos;
  EXPECT_TRUE(said) << "no re-planning note";

  // A language-model run (token shards) beside it.
  fs::create_directories(root_ / "lm_set");
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 64);
  data::write_shard(root_ / "lm_set" / "train.bin", tokens, 64);
  std::ofstream(root_ / "lm_set" / "meta.json")
      << json{{"splits", {{"train", {{"files", {"train.bin"}}, {"tokens", tokens.size()}}}}}}
             .dump();
  std::ofstream(root_ / "lm_model.json") << R"({"preset": "test-gpt2"})";
  train::Options lm;
  train::Given lg;
  lm.train_data = (root_ / "lm_set").string();
  lm.model = (root_ / "lm_model.json").string();
  lm.output_dir = (root_ / "lm_run").string();
  lm.block_size = 16;
  lm.per_device_train_batch_size = 2;
  lm.max_steps = 1;
  lm.sample_tokens = 0;
  lm.export_hf = "none";
  lg.model = lg.per_device_train_batch_size = lg.max_steps = true;
  {
    Recorder lrec;
    train::Trainer lt(train::plan_run(lm, lg, builtin_.c_str()), lrec);
    lt.fit();
  }
  // The classifier resumes the LM checkpoint; the LM trainer the classifier's.
  train::Options c = options("cross");
  c.max_steps = 2;
  c.resume_from_checkpoint = (root_ / "lm_run").string();
  Recorder crec;
  train::ClassifierTrainer ct(train::plan_classifier(c, given(), builtin_.c_str()), crec);
  std::string e = ds::testing::error_message([&] { ct.resume(); });
  EXPECT_NE(e.find("is a language-model run's"), std::string::npos) << e;
  EXPECT_NE(e.find("is a classification set"), std::string::npos) << e;
  lm.resume_from_checkpoint = (root_ / "replan").string();
  lm.output_dir = (root_ / "lm_run2").string();
  Recorder lrec;
  train::Trainer lt(train::plan_run(lm, lg, builtin_.c_str()), lrec);
  e = ds::testing::error_message([&] { lt.resume(); });
  EXPECT_NE(e.find("is an encoder classifier run's"), std::string::npos) << e;
  EXPECT_NE(e.find("language-model set"), std::string::npos) << e;
}

// LoRA with --only_optimize_lora: ZeRO-3 steps equal ZeRO-0's; only the LoRA matrices and the
// head (PEFT's modules_to_save) train, the rest keeps its initial values; the adapter export
// loads back (over the same from-scratch base) to the engine's weights.
TEST_F(ClassifierTrain, LoraZero3MatchesZero0AndExportsAnAdapter) {
  auto run = [&](int stage, const std::string& out, Recorder& rec) {
    train::Options o = options(out);
    o.model = (root_ / "bert_nodrop.json").string();
    o.max_steps = 4;
    o.eval_batches = 1;  // the steps are the point
    o.lora_dim = 4;
    o.lora_alpha = 8;
    o.only_optimize_lora = true;
    o.deepspeed = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "optimizer": {{"type": "AdamW", "params": {{"lr": "auto"}}}},
            "zero_optimization": {{"stage": {}}}}})",
        stage);
    train::Given g = given();
    g.deepspeed = g.lora_alpha = g.eval_batches = true;
    return std::make_unique<train::ClassifierTrainer>(
        train::plan_classifier(o, g, builtin_.c_str()), rec);
  };
  // One engine at a time (stage 0 to the end, then stage 3).
  Recorder r0, r3;
  std::map<std::string, std::vector<float>> initial, w0;
  {
    auto t0 = run(0, "lora0", r0);
    // Trainable: the LoRA matrices (2 layers x query, value x (A 4x64 + B 64x4)) and the
    // classifier (2x64 + 2); the pooler and everything else frozen.
    int64_t trainable = 0;
    for (const auto& [n, p] : t0->model().named_parameters()) {
      if (p.requires_grad()) {
        trainable += p.numel();
        EXPECT_TRUE(nn::is_lora_parameter(n) || n.rfind("classifier.", 0) == 0) << n;
      }
    }
    EXPECT_EQ(trainable, 2 * 2 * (4 * 64 + 64 * 4) + 2 * 64 + 2);
    for (const auto& [n, w] : t0->engine().full_weights()) initial[n] = w.to_vector();
    t0->fit();
    for (const auto& [n, w] : t0->engine().full_weights()) w0[n] = w.to_vector();
  }
  auto t3 = run(3, "lora3", r3);
  t3->fit();
  ASSERT_EQ(r0.steps.size(), 4u);
  ASSERT_EQ(r3.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(r3.steps[i].loss, r0.steps[i].loss, 1e-6 * std::abs(r0.steps[i].loss)) << i;
  const auto w3 = t3->engine().full_weights();
  ASSERT_EQ(w0.size(), w3.size());
  for (const auto& [n, t] : w3) {
    const auto& a = w0.at(n);
    const auto b = t.to_vector();
    ASSERT_EQ(a.size(), b.size()) << n;
    double diff = 0;
    for (size_t k = 0; k < a.size(); ++k) diff = std::max(diff, std::abs(double(a[k]) - b[k]));
    EXPECT_LT(diff, 1e-5) << n;
    const bool trains = nn::is_lora_parameter(n) || n.rfind("classifier.", 0) == 0;
    EXPECT_EQ(a == initial.at(n), !trains) << n;
  }
  // The adapter of the ZeRO-3 run over the from-scratch base gives the engine's weights.
  const fs::path dir = root_ / "lora3" / "adapter";
  t3->export_model(dir.string());
  const json cfg = json::parse(std::ifstream(dir / "adapter_config.json"));
  EXPECT_EQ(cfg["task_type"], "SEQ_CLS");
  EXPECT_EQ(cfg["target_modules"], json({"query", "value"}));
  auto fresh = models::make_encoder_classifier(t3->plan().model, /*init=*/true);
  nn::apply_lora(*fresh, *t3->plan().lora);
  EXPECT_EQ(models::load_peft_classifier_adapter(*fresh, *t3->plan().lora, dir), 2 * 2 * 2 + 2);
  std::map<std::string, Tensor> by_name(w3.begin(), w3.end());
  for (const auto& [n, p] : fresh->named_parameters())
    EXPECT_EQ(p.to_vector(), by_name.at(n).to_vector()) << n;
}

// A LoRA classifier's checkpoint resumes to the uninterrupted run's losses and weights; resuming
// it without LoRA is an error.
TEST_F(ClassifierTrain, LoraResumeReproducesAnUninterruptedRun) {
  auto opts = [&](const std::string& out) {
    train::Options o = options(out);
    o.model = (root_ / "bert_nodrop.json").string();
    o.max_steps = 4;
    o.eval_batches = 1;
    o.lora_dim = 4;
    o.lora_dropout = 0.1;  // the resume must restore the dropout stream
    o.only_optimize_lora = true;
    return o;
  };
  train::Given g = given();
  g.eval_batches = g.lora_dropout = true;
  Recorder ra;
  train::ClassifierTrainer ta(train::plan_classifier(opts("lora_a"), g, builtin_.c_str()), ra);
  ta.fit();
  train::Options b = opts("lora_b");
  {
    Recorder r;
    train::ClassifierTrainer t(train::plan_classifier(b, g, builtin_.c_str()), r);
    t.step();
    t.step();
    t.save();
  }
  b.resume_from_checkpoint = "latest";
  Recorder rb;
  train::ClassifierTrainer tb(train::plan_classifier(b, g, builtin_.c_str()), rb);
  ASSERT_TRUE(tb.resume().has_value());
  tb.fit();
  ASSERT_EQ(rb.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rb.steps[i].loss, ra.steps[2 + i].loss) << i;
  const auto wa = ta.engine().full_weights(), wb = tb.engine().full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;
  train::Options c = b;
  c.lora_dim = 0;
  c.lora_dropout = 0;
  c.only_optimize_lora = false;
  train::Given gc = g;
  gc.lora_dropout = false;
  Recorder rc;
  train::ClassifierTrainer tc(train::plan_classifier(c, gc, builtin_.c_str()), rc);
  EXPECT_THROW(tc.resume(), ds::Error);
}

#ifdef DS_TRAIN_BIN
TEST_F(ClassifierTrain, StartUpMemoryCheckRefusesARunThatCannotFit) {
  // The task runs share the LM's start-up check (train/fit.h through TrainerBase's task layer):
  // the tiny BERT's model states are ~1 MB, and DS_MEMORY_LIMIT makes the check believe 200 KB
  // are available. The run stops before the engine allocates anything, naming the need and what
  // would fit; --skip_memory_check runs it anyway.
  const fs::path out = root_ / "nofit";
  const std::string cmd = std::string(DS_TRAIN_BIN) + " --train_data " + (root_ / "set").string() +
                          " --threads 1 --model " + (root_ / "bert_nodrop.json").string() +
                          " --max_steps 1 --eval_steps 0 --export_hf none --output_dir " +
                          out.string();
  std::string log;
  EXPECT_EQ(run_command("env DS_MEMORY_LIMIT=200K " + cmd, &log), 1) << log;
  EXPECT_NE(log.find("this run does not fit in memory"), std::string::npos) << log;
  EXPECT_NE(log.find("model states"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "global_step1")) << log;
  EXPECT_EQ(run_command("env DS_MEMORY_LIMIT=200K " + cmd + " --skip_memory_check", &log), 0)
      << log;
  EXPECT_TRUE(fs::exists(out / "global_step1")) << log;
}

TEST_F(ClassifierTrain, DsTrainProcessZero3ExportAndEvalOnly) {
  const fs::path out = root_ / "proc";
  auto run = [&](const std::string& args, std::string* log) {
    return run_command(std::string(DS_TRAIN_BIN) + " --train_data " + (root_ / "set").string() +
                           " --threads 1 " + args,
                       log);
  };
  std::string log;
  ASSERT_EQ(run("--model " + (root_ / "bert_dropout.json").string() +
                    " --max_steps 6 --per_device_train_batch_size 8 --learning_rate 1e-3 "
                    "--deepspeed '{\"train_micro_batch_size_per_gpu\": \"auto\", "
                    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}, "
                    "\"zero_optimization\": {\"stage\": 3}}' --output_dir " +
                    out.string(),
                &log),
            0)
      << log;
  EXPECT_NE(log.find("encoder classifier run"), std::string::npos) << log;
  EXPECT_NE(log.find("ZeRO stage 3"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(out / "hf_model" / "model.safetensors")) << log;
  EXPECT_TRUE(fs::exists(out / "global_step6")) << log;
  const json res = json::parse(std::ifstream(out / "eval_results.json"));
  const double acc = res["eval_accuracy"];
  // --eval_only on the export prints the same accuracy.
  ASSERT_EQ(run("--init_from " + (out / "hf_model").string() + " --eval_only --output_dir " +
                    (root_ / "proc_eval").string(),
                &log),
            0)
      << log;
  EXPECT_NE(log.find(fmt::format("accuracy {:.4f}", acc)), std::string::npos) << log;
  // An option that does not apply: exit 1, named.
  EXPECT_EQ(run("--model bert-tiny --max_steps 1 --gradient_checkpointing --output_dir " +
                    (root_ / "proc_err").string(),
                &log),
            1);
  EXPECT_NE(log.find("--gradient_checkpointing"), std::string::npos) << log;
  // LoRA (PEFT SEQ_CLS): only LoRA and the head train; the export is an adapter folder; with
  // --merge_lora a plain classifier folder.
  const std::string lora_run = "--model " + (root_ / "bert_dropout.json").string() +
                               " --max_steps 3 --per_device_train_batch_size 8 --lora_dim 4 "
                               "--lora_alpha 8 --only_optimize_lora --output_dir ";
  ASSERT_EQ(run(lora_run + (root_ / "proc_lora").string(), &log), 0) << log;
  EXPECT_NE(log.find("LoRA: r 4, alpha 8 (scaling 2), dropout 0, 4 modules matching query,value"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("only LoRA and the modules to save (classifier, score) trained"),
            std::string::npos)
      << log;
  const json acfg =
      json::parse(std::ifstream(root_ / "proc_lora" / "hf_model" / "adapter_config.json"));
  EXPECT_EQ(acfg["task_type"], "SEQ_CLS");
  EXPECT_EQ(acfg["modules_to_save"], json({"classifier", "score"}));
  EXPECT_TRUE(fs::exists(root_ / "proc_lora" / "hf_model" / "adapter_model.safetensors"));
  ASSERT_EQ(run(lora_run + (root_ / "proc_merged").string() + " --merge_lora", &log), 0) << log;
  for (const auto& n :
       safetensors::Reader((root_ / "proc_merged" / "hf_model" / "model.safetensors").string())
           .names())
    EXPECT_EQ(n.find("lora_"), std::string::npos) << n;

  // ds_prepare --task classification as a program: the report, and an option of another format
  // refused by name (exit 2).
  auto prepare = [&](const std::string& args) {
    return run_command(std::string(DS_PREPARE_BIN) + " --task classification --tokenizer " +
                           (fs::path(DS_FIXTURE_DIR) / "tokenizers" / "bert_wordpiece").string() +
                           " " + args,
                       &log, "prep_log.txt");
  };
  const std::string inputs =
      " " + (root_ / "train.jsonl").string() + " " + (root_ / "dev.jsonl").string();
  ASSERT_EQ(prepare("--seq_len 32 --labels no,yes --val_files 'dev*' --output " +
                    (root_ / "prep").string() + inputs),
            1)
      << log;  // integer labels 0/1 are not the names no/yes (dev.jsonl is read first)
  EXPECT_NE(log.find("dev.jsonl:1: field 'label': '"), std::string::npos) << log;
  ASSERT_EQ(
      prepare("--seq_len 32 --val_files 'dev*' --output " + (root_ / "prep").string() + inputs), 0)
      << log;
  EXPECT_NE(log.find("train: 640 examples"), std::string::npos) << log;
  EXPECT_NE(log.find("val  : 160 examples"), std::string::npos) << log;
  EXPECT_EQ(prepare("--val_from_year 2001 --output " + (root_ / "prep2").string() + inputs), 2);
  EXPECT_NE(log.find("--val_from_year does not apply to --task classification"), std::string::npos)
      << log;
}

// ZeRO-3 with the optimizer state and the parameters on NVMe trains the classifier bit for bit as
// in RAM (the swap path holds the same fp32 values).
TEST_F(ClassifierTrain, Zero3NvmeOffloadMatchesInRam) {
  const std::string train = std::string(DS_TRAIN_BIN) + " --train_data " +
                            (root_ / "set").string() + " --model " +
                            (root_ / "bert_nodrop.json").string();
  const std::string ram = zero3_losses(train, "ram", "");
  const std::string disk = zero3_losses(train, "nvme", nvme_offload(root_ / "nvme"));
  EXPECT_EQ(std::count(ram.begin(), ram.end(), '\n'), 5) << ram;  // header + 4 steps
  EXPECT_EQ(disk, ram);
}

#ifdef DS_LAUNCHER_EXE
// Two ranks under ZeRO-3 train on the same global batches as one process (micro-batch 4 x 2
// ranks = 8): the same losses and scores within fp32 summation order; plainly and with LoRA.
TEST_F(ClassifierTrain, TwoRanksZero3MatchOneProcess) {
  auto run = [&](const std::string& launcher, const std::string& args, std::string* log) {
    return run_command(
        launcher + std::string(DS_TRAIN_BIN) + " --train_data " + (root_ / "set").string() +
            " --model " + (root_ / "bert_nodrop.json").string() +
            " --threads 1 --max_steps 6 --learning_rate 1e-3 --eval_steps 3 " + kZero3Batch8 + args,
        log, "ranks_log.txt");
  };
  std::string log;
  // Plainly (the two ranks' models on the sim device: ZeRO-3's collectives through host memory),
  // and with LoRA (only the LoRA matrices and the head train; the adapter is exported).
  for (const std::string lora : {"", " --lora_dim 4 --lora_alpha 8 --only_optimize_lora"}) {
    SCOPED_TRACE(lora);
    const std::string tag = lora.empty() ? "" : "_lora";
    const std::string device = lora.empty() ? " --device sim" : "";
    const fs::path one = root_ / ("ranks1" + tag), two = root_ / ("ranks2" + tag);
    ASSERT_EQ(run("", "--output_dir " + one.string() + lora, &log), 0) << log;
    ASSERT_EQ(run(std::string(DS_LAUNCHER_EXE) + " --num_procs 2 ",
                  "--output_dir " + two.string() + lora + device, &log),
              0)
        << log;
    if (!device.empty()) EXPECT_NE(log.find("device: sim:0"), std::string::npos) << log;
    EXPECT_NE(log.find("micro-batch 4 x accumulation 1"), std::string::npos) << log;
    auto column = [](const fs::path& f) { return csv_column(f); };
    for (const char* name :
         {"Train_Samples_train_loss", "Eval_Samples_eval_loss", "Eval_Samples_eval_accuracy"}) {
      const auto a = column(one / "metrics" / (std::string(name) + ".csv")),
                 b = column(two / "metrics" / (std::string(name) + ".csv"));
      ASSERT_EQ(a.size(), b.size()) << name;
      ASSERT_FALSE(a.empty()) << name;
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(b[i], a[i], 1e-4 * std::abs(a[i]) + 1e-6) << name;
    }
    EXPECT_TRUE(fs::exists(two / "hf_model" /
                           (lora.empty() ? "model.safetensors" : "adapter_model.safetensors")));
  }
}
#endif
#endif

}  // namespace
