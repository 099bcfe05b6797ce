// An encoder-decoder trained end to end on a synthetic lookup task (one word in, five out),
// prepared with the BART-style BPE fixture tokenizer: the library's Seq2SeqTrainer called
// directly (eval loss falls and BLEU rises; the HF export evaluates the same when a run starts
// from it; a resumed run reproduces an uninterrupted one bit for bit; BlenderBot's preset trains
// and exports; LoRA trains the adapters only and exports a PEFT adapter that reloads and
// generates as the trainer's merged model; options that do not apply are refused by name), then
// ds_prepare --task seq2seq, ds_train (ZeRO-3; LoRA adapter and merged) and ds_generate as
// processes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/seq2seq_set.h"
#include "ds/models/peft_io.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/lora.h"
#include "ds/train/seq2seq_trainer.h"
#include "task_fixture.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ds;

namespace {

struct Recorder : train::Seq2SeqObserver {
  std::vector<train::StepReport> steps;
  std::vector<train::Seq2SeqEvalReport> evals;
  std::vector<std::string> messages;
  void message(const std::string& s) override { messages.push_back(s); }
  void on_step(const train::StepReport& r) override { steps.push_back(r); }
  void on_seq2seq_eval(const train::Seq2SeqEvalReport& r) override { evals.push_back(r); }
};

// Lookup-task records: the source is one word w_i of a small vocabulary, the target the five
// words w_i .. w_i+4 (cyclically): learnt in a few dozen steps, and long enough for 4-grams.
std::string lookup_task(int n, uint32_t seed) {
  // Words the fixture tokenizer keeps whole (after a space).
  static const char* kWords[] = {"the", "on", "in", "is", "it", "and", "to", "of", "he", "we"};
  constexpr size_t kN = std::size(kWords);
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < n; ++i) {
    const size_t w = rng() % kN;
    std::string t;
    for (size_t k = 0; k < 5; ++k) t += (t.empty() ? "" : " ") + std::string(kWords[(w + k) % kN]);
    text += json{{"source", kWords[w]}, {"target", t}}.dump() + "\n";
  }
  return text;
}

class Seq2SeqTrain : public ds::testing::TaskTrainTest<train::Seq2SeqPlan, train::plan_seq2seq> {
 protected:
  static void SetUpTestSuite() {
    set_up_suite("s2s_train_");
    std::ofstream(root_ / "train.jsonl") << lookup_task(256, 1);
    std::ofstream(root_ / "dev.jsonl") << lookup_task(16, 2);
    data::Seq2SeqPrepareOptions o;
    o.inputs = {root_ / "train.jsonl", root_ / "dev.jsonl"};
    o.tokenizer_dir = fs::path(DS_FIXTURE_DIR) / "classification" / "roberta_bpe";
    o.output_dir = root_ / "set";
    o.max_source_len = 12;
    o.max_target_len = 12;
    o.val_files = "dev*";
    data::prepare_seq2seq(o);
    // Tiny BARTs (our JSON form; the data fills vocabulary and special ids), with and without
    // dropout (the resume must restore the dropout stream).
    std::ofstream(root_ / "bart_dropout.json")
        << R"({"family": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
              "encoder_heads": 2, "decoder_heads": 2, "encoder_ffn": 64, "decoder_ffn": 64})";
    std::ofstream(root_ / "bart_nodrop.json")
        << R"({"family": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
              "encoder_heads": 2, "decoder_heads": 2, "encoder_ffn": 64, "decoder_ffn": 64,
              "dropout": 0.0})";
  }

  train::Options options(const std::string& out) const {
    train::Options o;
    o.train_data = (root_ / "set").string();
    o.output_dir = (root_ / out).string();
    o.model = (root_ / "bart_dropout.json").string();
    o.per_device_train_batch_size = 16;
    o.learning_rate = 1e-2;
    o.warmup_steps = 5;
    o.eval_steps = 0;
    o.save_steps = 0;
    o.export_hf = "none";
    o.eval_bleu_examples = 16;
    return o;
  }
};

// About 15 s on 2 cores: 100 steps are what the tiny model needs to learn the task reliably.
TEST_F(Seq2SeqTrain, LearnsTheLookupTaskAndExports) {
  train::Options o = options("learn");
  o.model = (root_ / "bart_nodrop.json").string();
  o.max_steps = 100;
  o.export_hf = (root_ / "learn" / "hf").string();
  ASSERT_TRUE(train::is_seq2seq_run(o));
  Recorder rec;
  train::Seq2SeqTrainer t(train::plan_seq2seq(o, given(), builtin_.c_str()), rec);
  EXPECT_EQ(t.plan().source_len, 12);
  EXPECT_EQ(t.plan().eval_examples, 16);
  EXPECT_EQ(t.plan().bleu_examples, 16);
  EXPECT_EQ(t.plan().model.pad_token_id, 702);
  EXPECT_EQ(t.plan().model.decoder_start_token_id, 701);
  const auto before = t.evaluate();
  ASSERT_TRUE(before.has_value() && before->bleu.has_value());
  t.fit();
  ASSERT_EQ(rec.steps.size(), 100u);
  ASSERT_TRUE(t.last_eval().has_value() && t.last_eval()->bleu.has_value());
  const auto& after = *t.last_eval();
  std::printf("lookup task: eval loss %.4f -> %.4f, BLEU %.2f -> %.2f; '%s' -> '%s'\n",
              before->loss, after.loss, before->bleu->score, after.bleu->score,
              after.sources.at(0).c_str(), after.hypotheses.at(0).c_str());
  EXPECT_LT(after.loss, 0.5);          // from about ln(703) = 6.6
  EXPECT_GT(after.bleu->score, 80.0);  // from 0

  // The export: BartForConditionalGeneration with the tokenizer; a run from it evaluates the same.
  t.export_model(o.export_hf);
  const json cfg = json::parse(std::ifstream(fs::path(o.export_hf) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "BartForConditionalGeneration");
  EXPECT_EQ(cfg["pad_token_id"], 702);
  EXPECT_TRUE(fs::exists(fs::path(o.export_hf) / "tokenizer.json"));
  train::Options e = options("from_export");
  e.model.clear();
  e.init_from = o.export_hf;
  e.eval_only = true;
  e.max_steps = 1;
  train::Given g = given();
  g.model = false;
  Recorder rec2;
  train::Seq2SeqTrainer t2(train::plan_seq2seq(e, g, builtin_.c_str()), rec2);
  const auto again = t2.evaluate();
  ASSERT_TRUE(again.has_value() && again->bleu.has_value());
  EXPECT_NEAR(again->loss, after.loss, 1e-5);
  EXPECT_DOUBLE_EQ(again->bleu->score, after.bleu->score);
  EXPECT_EQ(again->hypotheses, after.hypotheses);

  // Beam search: the generations of the trainer's generate() for the first examples.
  models::BeamOptions beam;
  beam.num_beams = 3;
  beam.max_new_tokens = 12;
  const data::Seq2SeqSet& val = *t.plan().val;
  const auto src = val.source(0);
  const int64_t S = static_cast<int64_t>(src.size());
  const auto texts = t2.generate(Tensor::from_ints({src.begin(), src.end()}, {1, S}),
                                 Tensor::from_ints(std::vector<int64_t>(S, 1), {1, S}), beam);
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_EQ(texts[0], after.references.at(0));
}

TEST_F(Seq2SeqTrain, ResumeReproducesAnUninterruptedRun) {
  // Dropout on, ZeRO-2: 6 steps straight vs 3 steps, checkpoint, a new trainer resuming to 6.
  auto zero2 = [](train::Options& o) {
    o.deepspeed = R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps":
                      "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                      "zero_optimization": {"stage": 2}})";
    o.eval_bleu_examples = 4;
  };
  train::Given g = given();
  g.deepspeed = true;
  train::Options a = options("a");
  zero2(a);
  a.max_steps = 6;
  Recorder ra;
  train::Seq2SeqTrainer ta(train::plan_seq2seq(a, g, builtin_.c_str()), ra);
  ta.fit();

  train::Options b = options("b");
  zero2(b);
  b.max_steps = 6;
  {
    Recorder r;
    train::Seq2SeqTrainer t(train::plan_seq2seq(b, g, builtin_.c_str()), r);
    for (int i = 0; i < 3; ++i) t.step();
    t.save();
  }
  b.resume_from_checkpoint = "latest";
  Recorder rb;
  train::Seq2SeqTrainer tb(train::plan_seq2seq(b, g, builtin_.c_str()), rb);
  const auto res = tb.resume();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->step, 3);
  tb.fit();
  ASSERT_EQ(rb.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rb.steps[i].loss, ra.steps[3 + i].loss) << i;
  ASSERT_TRUE(ta.last_eval() && tb.last_eval());
  EXPECT_EQ(tb.last_eval()->loss, ta.last_eval()->loss);
  EXPECT_EQ(tb.last_eval()->hypotheses, ta.last_eval()->hypotheses);
  const auto wa = ta.engine().full_weights(), wb = tb.engine().full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;

  // An empty output folder has no 'latest' to resume.
  train::Options c = options("c");
  c.max_steps = 6;
  c.resume_from_checkpoint = "latest";
  Recorder rc;
  train::Seq2SeqTrainer tc(train::plan_seq2seq(c, given(), builtin_.c_str()), rc);
  EXPECT_THROW(tc.resume(), ds::Error);
}

// LoRA with PEFT's SEQ_2_SEQ_LM semantics over a base folder (the tiny BART from --seed, exported):
// only the adapters train (the count), the base weights stay, the evaluation generates from the
// merged weights, and the adapter export reloads over the base to the engine's LoRA matrices and
// generates what the trainer's (merged) generate() does.
TEST_F(Seq2SeqTrain, LoraTrainsAdaptersOnlyAndExportsAnAdapter) {
  train::Options b = options("lora_base_plan");
  b.model = (root_ / "bart_nodrop.json").string();
  b.max_steps = 1;
  const fs::path base = root_ / "lora_base";
  {
    const models::Seq2Seq from_seed(train::plan_seq2seq(b, given(), builtin_.c_str()).model);
    models::export_hf_seq2seq(from_seed, base);
  }
  train::Options o = options("lora");
  o.model.clear();
  o.init_from = base.string();
  o.max_steps = 20;
  o.lora_dim = 4;
  o.lora_alpha = 8;
  o.only_optimize_lora = true;
  o.eval_bleu_examples = 4;
  o.export_hf = (root_ / "lora" / "adapter").string();
  train::Given g = given();
  g.model = false;
  g.lora_alpha = true;
  Recorder rec;
  train::Seq2SeqTrainer t(train::plan_seq2seq(o, g, builtin_.c_str()), rec);
  ASSERT_TRUE(t.plan().lora.has_value());
  EXPECT_EQ(t.plan().lora->targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  // q_proj and v_proj of the encoder's self-attention and the decoder's self- and
  // cross-attention (one layer each): 6 x (A (4, 32) + B (32, 4)), nothing else.
  int64_t trainable = 0;
  for (const auto& [name, p] : t.model().named_parameters())
    if (p.requires_grad()) {
      EXPECT_TRUE(nn::is_lora_parameter(name)) << name;
      trainable += p.numel();
    }
  EXPECT_EQ(trainable, 6 * 2 * 4 * 32);
  bool described = false;
  for (const auto& m : rec.messages)
    described = described ||
                m.find("LoRA: r 4, alpha 8 (scaling 2), dropout 0, 6 modules") != std::string::npos;
  EXPECT_TRUE(described);
  const auto before = t.evaluate();
  t.fit();
  ASSERT_TRUE(before.has_value() && t.last_eval().has_value());
  std::printf("LoRA r 4 on the lookup task: eval loss %.4f -> %.4f\n", before->loss,
              t.last_eval()->loss);
  EXPECT_LT(t.last_eval()->loss, before->loss);

  // The base weights did not change; the adapter holds the LoRA matrices under peft's names.
  auto fresh = std::make_shared<models::Seq2Seq>(*models::read_hf_seq2seq_config(base), false);
  models::load_hf_seq2seq_weights(*fresh, base);
  std::map<std::string, Tensor> trained;
  for (const auto& [name, w] : t.engine().full_weights()) trained.emplace(name, w);
  for (const auto& [name, p] : fresh->named_parameters())
    EXPECT_EQ(p.to_vector(), trained.at(name).to_vector()) << name;
  t.export_model(o.export_hf);
  const fs::path adapter(o.export_hf);
  EXPECT_FALSE(fs::exists(adapter / "model.safetensors"));
  const json acfg = json::parse(std::ifstream(adapter / "adapter_config.json"));
  EXPECT_EQ(acfg["task_type"], "SEQ_2_SEQ_LM");
  EXPECT_EQ(acfg["base_model_name_or_path"], fs::absolute(base).lexically_normal().string());
  nn::apply_lora(*fresh, *t.plan().lora);
  EXPECT_EQ(models::load_peft_seq2seq_adapter(*fresh, adapter), 12);
  for (const auto& [name, p] : fresh->named_parameters())
    if (nn::is_lora_parameter(name)) EXPECT_EQ(p.to_vector(), trained.at(name).to_vector()) << name;

  // Greedy generation: the reloaded base + adapter (unmerged) = the trainer's merged model.
  fresh->train(false);
  models::BeamOptions greedy;
  greedy.num_beams = 1;
  greedy.max_new_tokens = 12;
  const data::Seq2SeqSet& val = *t.plan().val;
  const auto& m = t.plan().model;
  for (int64_t i = 0; i < 4; ++i) {
    const auto src = val.source(i);
    const int64_t S = static_cast<int64_t>(src.size());
    const Tensor ids = Tensor::from_ints({src.begin(), src.end()}, {1, S});
    const Tensor mask = Tensor::from_ints(std::vector<int64_t>(S, 1), {1, S});
    const auto merged = t.generate(ids, mask, greedy);
    const auto out = fresh->generate(ids, mask, greedy).to_int_vector();
    std::vector<int32_t> row;
    for (size_t k = 1; k < out.size() && out[k] != m.eos_token_id; ++k)
      if (out[k] != m.pad_token_id) row.push_back(static_cast<int32_t>(out[k]));
    ASSERT_EQ(merged.size(), 1u);
    EXPECT_EQ(merged[0], t.tokenizer()->decode(row, true)) << "example " << i;
  }
}

// The BlenderBot preset (pre-LN, final norms) with gradient checkpointing and bf16.
TEST_F(Seq2SeqTrain, BlenderbotPresetTrainsAndExports) {
  train::Options o = options("blender");
  o.model = "blenderbot-tiny";
  o.max_steps = 3;
  o.bf16 = true;
  o.gradient_checkpointing = true;
  o.eval_bleu_examples = 2;
  o.export_hf = (root_ / "blender" / "hf").string();
  train::Given g = given();
  g.bf16 = true;
  Recorder rec;
  train::Seq2SeqTrainer t(train::plan_seq2seq(o, g, builtin_.c_str()), rec);
  EXPECT_EQ(t.plan().model.family, "blenderbot");
  EXPECT_TRUE(t.plan().model.pre_norm);
  t.fit();
  ASSERT_TRUE(t.last_eval().has_value());
  EXPECT_TRUE(std::isfinite(t.last_eval()->loss));
  EXPECT_EQ(t.last_eval()->generated, 2);
  t.export_model(o.export_hf);
  const json cfg = json::parse(std::ifstream(fs::path(o.export_hf) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "BlenderbotForConditionalGeneration");
}

// --device sim: the encoder-decoder trains, evaluates (BLEU of its generations) and exports on
// the device as on the CPU, and so does a LoRA run (--only_optimize_lora: its PEFT adapter).
TEST_F(Seq2SeqTrain, DeviceRunTrainsEvaluatesAndExportsAsTheHost) {
  auto same_generations = [](const train::Seq2SeqTrainer& host, const train::Seq2SeqTrainer& dev) {
    EXPECT_EQ(dev.last_eval()->hypotheses, host.last_eval()->hypotheses);
  };
  expect_device_run_as_host<train::Seq2SeqTrainer, Recorder>(options("device"), given(), "device",
                                                             4, same_generations);
  train::Options o = options("device_lora");
  o.lora_dim = 4;
  o.only_optimize_lora = true;
  expect_device_run_as_host<train::Seq2SeqTrainer, Recorder>(o, given(), "device_lora", 4,
                                                             same_generations);
}

TEST_F(Seq2SeqTrain, RefusesWhatDoesNotApplyByName) {
  auto expect = [&](train::Options o, train::Given g, const std::string& part) {
    const std::string e = error_of(o, g);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in: " << e;
  };
  const train::Options o = options("refuse");
  const train::Given g = given();
  {
    auto x = o;
    x.merge_lora = true;  // LoRA applies, but needs --lora_dim
    expect(x, g, "--merge_lora needs LoRA");
  }
  {
    auto x = o;
    x.block_size = 64;
    expect(x, g, "--block_size");
  }
  {
    auto x = o;
    x.sample_prompt = "hi";
    expect(x, g, "--sample_prompt");
  }
  {
    auto x = o;
    x.model = "tiny";  // a GPT preset
    expect(x, g, "--model tiny");
  }
  {
    auto x = o;
    x.init_from = (fs::path(DS_FIXTURE_DIR) / "hf_families" / "bart_s2s").string();
    expect(x, g, "--init_from");  // with --model
  }
  {
    // The bart_s2s fixture has a 64-id vocabulary: the data's 703 ids do not fit.
    auto x = o;
    auto y = g;
    x.model.clear();
    y.model = false;
    x.init_from = (fs::path(DS_FIXTURE_DIR) / "hf_families" / "bart_s2s").string();
    expect(x, y, "vocab_size 64");
  }
  {
    // A BERT folder is no encoder-decoder.
    auto x = o;
    auto y = g;
    x.model.clear();
    y.model = false;
    x.init_from = (fs::path(DS_FIXTURE_DIR) / "hf_families" / "bert_cls").string();
    expect(x, y, "encoder-decoder model_type");
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

#ifdef DS_TRAIN_BIN
// ds_prepare --task seq2seq, ds_train (ZeRO-3) and ds_generate as programs.
TEST_F(Seq2SeqTrain, ProcessesPrepareTrainGenerate) {
  std::string log;
  // Runs cmd; log = its stdout and stderr (stdout only when `quiet_stderr`).
  auto sh = [&](const std::string& cmd, bool quiet_stderr = false) {
    return run_command(cmd, &log, "proc_log.txt", quiet_stderr);
  };
  // Records in the {"prompt", "response"} style.
  {
    std::ofstream f(root_ / "chat.jsonl");
    std::mt19937 rng(3);
    for (int i = 0; i < 64; ++i)
      f << json{{"prompt", fmt::format("say {}", rng() % 7)}, {"response", "ok"}}.dump() << "\n";
  }
  const std::string tok = (fs::path(DS_FIXTURE_DIR) / "classification" / "roberta_bpe").string();
  const fs::path set = root_ / "proc_set", out = root_ / "proc";
  ASSERT_EQ(sh(std::string(DS_PREPARE_BIN) + " --task seq2seq --tokenizer " + tok +
               " --max_source_len 8 --max_target_len 6 --val_fraction 0.25 --output " +
               set.string() + " " + (root_ / "chat.jsonl").string()),
            0)
      << log;
  EXPECT_NE(log.find("fields 'prompt' -> 'response'"), std::string::npos) << log;
  EXPECT_NE(log.find("train: 48 examples"), std::string::npos) << log;
  EXPECT_EQ(
      sh(std::string(DS_PREPARE_BIN) + " --task seq2seq --tokenizer " + tok +
         " --seq_len 8 --output " + (root_ / "x").string() + " " + (root_ / "chat.jsonl").string()),
      2);
  EXPECT_NE(log.find("--seq_len does not apply to --task seq2seq"), std::string::npos) << log;

  ASSERT_EQ(sh(std::string(DS_TRAIN_BIN) + " --train_data " + set.string() + " --model " +
               (root_ / "bart_nodrop.json").string() +
               " --threads 1 --max_steps 30 --per_device_train_batch_size 8 --learning_rate 1e-2 "
               "--eval_bleu_examples 4 --generation_num_beams 2 "
               "--deepspeed '{\"train_micro_batch_size_per_gpu\": \"auto\", "
               "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}, "
               "\"zero_optimization\": {\"stage\": 3}}' --output_dir " +
               out.string()),
            0)
      << log;
  EXPECT_NE(log.find("encoder-decoder run"), std::string::npos) << log;
  EXPECT_NE(log.find("ZeRO stage 3"), std::string::npos) << log;
  EXPECT_NE(log.find("beam search, 2 beams"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(out / "hf_model" / "model.safetensors")) << log;
  EXPECT_TRUE(fs::exists(out / "global_step30")) << log;
  const json res = json::parse(std::ifstream(out / "eval_results.json"));
  EXPECT_TRUE(res.contains("eval_bleu")) << res.dump();
  EXPECT_LT(res["eval_loss"].get<double>(), 1.0) << log;  // "ok" is easy to learn

  // ds_generate on the export (and on the output folder, the model on the sim device): the learnt
  // answer.
  ASSERT_EQ(sh(std::string(DS_GENERATE_BIN) + " --model " + (out / "hf_model").string() +
                   " --prompt 'say 3' --num_beams 2 --max_new_tokens 5",
               true),
            0)
      << log;
  EXPECT_EQ(log, "ok\n");
  ASSERT_EQ(sh(std::string(DS_GENERATE_BIN) + " --model " + out.string() +
                   " --source 'say 5' --device sim"),
            0)
      << log;
  EXPECT_NE(log.find("greedy"), std::string::npos) << log;
  EXPECT_NE(log.find("on sim:0"), std::string::npos) << log;
  EXPECT_NE(log.find("\nok\n"), std::string::npos) << log;
  EXPECT_EQ(sh(std::string(DS_GENERATE_BIN) + " --model " + out.string() +
               " --prompt hi --temperature 0.7"),
            1);
  EXPECT_NE(log.find("--temperature does not apply"), std::string::npos) << log;

  // LoRA over that export (PEFT's SEQ_2_SEQ_LM): a PEFT adapter with --only_optimize_lora; the
  // merged model with --merge_lora (ZeRO-3), which ds_generate reads.
  const fs::path lora = root_ / "proc_lora", merged = root_ / "proc_lora_merged";
  const std::string lora_run = std::string(DS_TRAIN_BIN) + " --train_data " + set.string() +
                               " --init_from " + (out / "hf_model").string() +
                               " --threads 1 --max_steps 3 --per_device_train_batch_size 8 "
                               "--learning_rate 1e-4 --eval_bleu_examples 2 --lora_dim 4 "
                               "--lora_alpha 8 ";
  ASSERT_EQ(sh(lora_run + "--only_optimize_lora --output_dir " + lora.string()), 0) << log;
  EXPECT_NE(log.find("LoRA: r 4, alpha 8 (scaling 2), dropout 0, 6 modules matching "
                     "q_proj,v_proj; trainable 1536 of "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("PEFT SEQ_2_SEQ_LM adapter"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(lora / "hf_model" / "adapter_model.safetensors")) << log;
  EXPECT_FALSE(fs::exists(lora / "hf_model" / "model.safetensors")) << log;
  ASSERT_EQ(sh(lora_run +
               "--merge_lora --deepspeed '{\"train_micro_batch_size_per_gpu\": \"auto\", "
               "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}, "
               "\"zero_optimization\": {\"stage\": 3}}' --output_dir " +
               merged.string()),
            0)
      << log;
  EXPECT_NE(log.find("ZeRO stage 3"), std::string::npos) << log;
  EXPECT_NE(log.find("LoRA merged"), std::string::npos) << log;
  ASSERT_EQ(sh(std::string(DS_GENERATE_BIN) + " --model " + (merged / "hf_model").string() +
                   " --prompt 'say 3' --num_beams 2 --max_new_tokens 5",
               true),
            0)
      << log;
  EXPECT_EQ(log, "ok\n");
  // A generation option on a GPT run is refused by ds_train.
  EXPECT_EQ(sh(std::string(DS_TRAIN_BIN) + " --train_data " + set.string() +
               "/nothing --generation_num_beams 2 --output_dir " + (root_ / "e").string()),
            1);
}
// ZeRO-3 with the optimizer state and the parameters on NVMe trains the encoder-decoder bit for bit
// as in RAM (the swap path holds the same fp32 values).
TEST_F(Seq2SeqTrain, Zero3NvmeOffloadMatchesInRam) {
  const std::string train = std::string(DS_TRAIN_BIN) + " --train_data " +
                            (root_ / "set").string() + " --model " +
                            (root_ / "bart_nodrop.json").string();
  const std::string ram = zero3_losses(train, "ram", "");
  const std::string disk = zero3_losses(train, "nvme", nvme_offload(root_ / "nvme"));
  EXPECT_EQ(std::count(ram.begin(), ram.end(), '\n'), 5) << ram;  // header + 4 steps
  EXPECT_EQ(disk, ram);
}

#ifdef DS_LAUNCHER_EXE
// Two ranks under ZeRO-3 (micro-batch 4 each, rank r reading positions 4r .. 4r+3 of each global
// batch of 8) follow one process at micro-batch 4 x gradient accumulation 2, whose micro-steps read
// the same two halves: each micro-batch's loss is the mean over its own target tokens, and the
// ranks' average equals the accumulation's sum / 2 (as in DeepSpeed). So the losses agree up to
// the summation order of the gradients (seen: 7e-8 relative) and the evaluations (loss, BLEU of
// rank 0's generations from the gathered weights) exactly. (One process at micro-batch 8 would
// weigh the tokens of the two halves by their counts instead: another loss, ~1e-5 apart here.)
TEST_F(Seq2SeqTrain, TwoRanksZero3MatchOneProcess) {
  auto run = [&](const std::string& launcher, const std::string& args, std::string* log) {
    return run_command(launcher + std::string(DS_TRAIN_BIN) + " --train_data " +
                           (root_ / "set").string() + " --model " +
                           (root_ / "bart_nodrop.json").string() +
                           " --threads 1 --max_steps 6 --learning_rate 1e-2 --eval_steps 3 "
                           "--eval_bleu_examples 4 " +
                           kZero3Batch8 + args,
                       log, "ranks_log.txt");
  };
  std::string log;
  const fs::path one = root_ / "ranks1", two = root_ / "ranks2";
  ASSERT_EQ(run("", "--per_device_train_batch_size 4 --output_dir " + one.string(), &log), 0)
      << log;
  EXPECT_NE(log.find("micro-batch 4 x accumulation 2"), std::string::npos) << log;
  ASSERT_EQ(run(std::string(DS_LAUNCHER_EXE) + " --num_procs 2 ",
                "--per_device_train_batch_size 4 --output_dir " + two.string(), &log),
            0)
      << log;
  EXPECT_NE(log.find("micro-batch 4 x accumulation 1"), std::string::npos) << log;
  auto column = [](const fs::path& f) { return csv_column(f); };
  for (const char* name :
       {"Train_Samples_train_loss", "Eval_Samples_eval_loss", "Eval_Samples_eval_bleu"}) {
    const auto a = column(one / "metrics" / (std::string(name) + ".csv")),
               b = column(two / "metrics" / (std::string(name) + ".csv"));
    ASSERT_EQ(a.size(), b.size()) << name;
    ASSERT_FALSE(a.empty()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      std::printf("%s[%zu]: one process %.9f, two ranks %.9f\n", name, i, a[i], b[i]);
      EXPECT_NEAR(b[i], a[i], 1e-6 * std::abs(a[i]) + 1e-9) << name;
    }
  }
  EXPECT_TRUE(fs::exists(two / "hf_model" / "model.safetensors"));
}
#endif
#endif

}  // namespace
