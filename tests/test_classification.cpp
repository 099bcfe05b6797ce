// Classification data and scores: GLUE TSV (MRPC's header too) and JSONL records and their errors
// (file, line, field), labels, Hugging Face's longest_first pair truncation against `tokenizers`
// (tests/fixtures/classification, tests/fixtures/generators/gen_classification_fixture.py), the DSCLASSIFY set
// written by prepare_classification and read back, the refusal of each format's folder by the
// other's loader, and accuracy / F1.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/classification.h"
#include "ds/data/classification_set.h"
#include "ds/data/dataset.h"
#include "ds/data/text_tokenizer.h"
#include "ds/train/classify_metrics.h"
#include "task_fixture.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ds;

namespace {

const fs::path kTok = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "bert_wordpiece";

class Classification : public ds::testing::ScratchDirTest {
 protected:
  Classification() : ScratchDirTest("cls_test_") {}
};

TEST_F(Classification, ReadsGlueTsvMrpcHeaderAndJsonl) {
  const auto mrpc = data::read_classification_file(write(
      "train.tsv",
      "\xEF\xBB\xBFQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
      "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused .\r\n"
      "\n"
      "0\t2108705\t2108831\tYucaipa owned Dominick 's\tYucaipa bought Dominick 's\r\n"));
  ASSERT_EQ(mrpc.size(), 2u);
  EXPECT_EQ(mrpc[0].sentence1, "Amrozi accused his brother .");
  EXPECT_EQ(*mrpc[0].sentence2, "Referring to him , Amrozi accused .");
  EXPECT_EQ(mrpc[0].label, "1");
  EXPECT_TRUE(mrpc[0].label_is_int);
  EXPECT_EQ(mrpc[1].line, 4u);  // blank lines count

  const auto glue = data::read_classification_file(
      write("sst.tsv", "sentence\tlabel\nit 's a charming journey\t1\nbad\t0\n"));
  ASSERT_EQ(glue.size(), 2u);
  EXPECT_FALSE(glue[0].sentence2.has_value());

  const auto jl = data::read_classification_file(
      write("d.jsonl",
            "{\"sentence1\": \"a\", \"sentence2\": \"b\", \"label\": \"entailment\"}\n"
            "{\"sentence1\": \"c\", \"sentence2\": \"d\", \"label\": 2}\n"));
  ASSERT_EQ(jl.size(), 2u);
  EXPECT_EQ(jl[0].label, "entailment");
  EXPECT_FALSE(jl[0].label_is_int);
  EXPECT_EQ(jl[1].label, "2");
  EXPECT_TRUE(jl[1].label_is_int);
}

TEST_F(Classification, BadInputNamesFileLineAndField) {
  auto err = [&](const std::string& name, const std::string& text) {
    const fs::path p = write(name, text);
    return error_of([&] { data::read_classification_file(p); });
  };
  std::string e = err("nolabel.tsv", "sentence1\tsentence2\na\tb\n");
  EXPECT_NE(e.find("nolabel.tsv:1"), std::string::npos) << e;
  EXPECT_NE(e.find("'label'"), std::string::npos) << e;
  e = err("nosent.tsv", "foo\tlabel\na\t1\n");
  EXPECT_NE(e.find("nosent.tsv:1"), std::string::npos) << e;
  EXPECT_NE(e.find("'sentence1'"), std::string::npos) << e;
  e = err("fields.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\na\tb\n");
  EXPECT_NE(e.find("fields.tsv:3"), std::string::npos) << e;
  e = err("empty.tsv", "");
  EXPECT_NE(e.find("empty.tsv"), std::string::npos) << e;
  EXPECT_NE(e.find("empty file"), std::string::npos) << e;
  e = err("empty.jsonl", "\n\n");
  EXPECT_NE(e.find("empty.jsonl"), std::string::npos) << e;
  EXPECT_NE(e.find("no records"), std::string::npos) << e;
  e = err("miss.jsonl",
          "{\"sentence1\": \"a\", \"label\": 1}\n{\"sentence2\": \"b\", \"label\": 0}\n");
  EXPECT_NE(e.find("miss.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'sentence1'"), std::string::npos) << e;
  e = err("lab.jsonl", "{\"sentence1\": \"a\", \"label\": 1.5}\n");
  EXPECT_NE(e.find("lab.jsonl:1"), std::string::npos) << e;
  EXPECT_NE(e.find("'label'"), std::string::npos) << e;
  e = err("mixed.jsonl",
          "{\"sentence1\": \"a\", \"sentence2\": \"b\", \"label\": 1}\n{\"sentence1\": \"a\", "
          "\"label\": 1}\n");
  EXPECT_NE(e.find("mixed.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'sentence2'"), std::string::npos) << e;
  e = err("x.csv", "a,b\n");
  EXPECT_NE(e.find("x.csv"), std::string::npos) << e;

  // An unknown label (a label list given): file, line, field and the label.
  data::ClassificationPrepareOptions o;
  o.inputs = {write("u.jsonl",
                    "{\"sentence1\": \"a\", \"label\": \"yes\"}\n"
                    "{\"sentence1\": \"b\", \"label\": \"maybe\"}\n")};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "out";
  o.labels = {"no", "yes"};
  e = error_of([&] { data::prepare_classification(o); });
  EXPECT_NE(e.find("u.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'label'"), std::string::npos) << e;
  EXPECT_NE(e.find("'maybe'"), std::string::npos) << e;
}

// BERT's WordPiece ([CLS] A [SEP] B [SEP], types 0/1) and a RoBERTa-style byte-level BPE
// (<s> A </s></s> B </s>, types 0: RobertaProcessing), against `tokenizers`.
TEST_F(Classification, LongestFirstTruncationMatchesTokenizers) {
  const fs::path fx_dir = fs::path(DS_FIXTURE_DIR) / "classification";
  for (const auto& [tok_dir, cases] :
       {std::pair{kTok, fx_dir / "truncation_cases.json"},
        std::pair{fx_dir / "roberta_bpe", fx_dir / "roberta_cases.json"}}) {
    const auto tok = data::load_tokenizer(tok_dir);
    const json fx = json::parse(std::ifstream(cases));
    int n = 0, cut = 0;
    for (const json& c : fx["cases"]) {
      const std::optional<std::string> b =
          c["b"].is_null() ? std::nullopt : std::optional<std::string>(c["b"].get<std::string>());
      const auto e = data::encode_example(*tok, c["a"], b, c["max_length"].get<size_t>());
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      const auto types = c["type_ids"].get<std::vector<uint32_t>>();
      EXPECT_EQ(e.tokens.ids, ids) << tok_dir << " " << c.dump();
      EXPECT_EQ(e.tokens.type_ids, types) << tok_dir << " " << c.dump();
      cut += e.truncated;
      ++n;
    }
    EXPECT_GT(n, 100) << cases;
    EXPECT_GT(cut, 40) << cases;  // the fixture exercises truncation, not just short pairs
  }
}

TEST_F(Classification, TruncationRule) {
  auto run = [](size_t na, size_t nb, size_t max) {
    std::vector<int32_t> a(na, 1), b(nb, 2);
    data::truncate_longest_first(a, b, max);
    return std::pair{a.size(), b.size()};
  };
  EXPECT_EQ(run(3, 3, 10), (std::pair<size_t, size_t>{3, 3}));
  EXPECT_EQ(run(2, 20, 10), (std::pair<size_t, size_t>{2, 8}));  // only the longer
  EXPECT_EQ(run(20, 2, 10), (std::pair<size_t, size_t>{8, 2}));
  EXPECT_EQ(run(10, 10, 9), (std::pair<size_t, size_t>{4, 5}));  // tie: b gets the odd one
  EXPECT_EQ(run(11, 10, 9), (std::pair<size_t, size_t>{5, 4}));  // the longer gets it
  EXPECT_EQ(run(30, 30, 8), (std::pair<size_t, size_t>{4, 4}));
}

TEST_F(Classification, PreparedSetRoundTripAndFormatChecks) {
  data::ClassificationPrepareOptions o;
  o.inputs = {
      write("train.tsv",
            "sentence1\tsentence2\tlabel\nthe cat\tsat on a mat\tyes\nhello\tworld\tno\n"
            "a b c d e f g h i j k l m n o p\tq r s t u v w x y z\tyes\n"),
      write("dev.jsonl", "{\"sentence1\": \"dogs\", \"sentence2\": \"ran\", \"label\": \"no\"}\n")};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "set";
  o.seq_len = 16;
  o.val_files = "dev*";
  const auto r = data::prepare_classification(o);
  EXPECT_EQ(r.labels, (std::vector<std::string>{"no", "yes"}));  // sorted names
  EXPECT_EQ(r.train.examples, 3);
  EXPECT_EQ(r.val.examples, 1);
  EXPECT_EQ(r.train.truncated, 1);
  EXPECT_EQ(r.train.label_counts, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(data::is_classification_set(o.output_dir));

  const auto set = data::ClassificationSet::open_split(o.output_dir, "train");
  ASSERT_EQ(set.size(), 3);
  EXPECT_EQ(set.seq_len(), 16);
  EXPECT_EQ(set.num_labels(), 2);
  EXPECT_TRUE(set.pair());
  const auto tok = data::load_tokenizer(kTok);
  std::vector<int32_t> ids(16), types(16), mask(16);
  int32_t label = -1;
  set.get(0, ids, types, mask, label);
  const auto want = data::encode_example(*tok, "the cat", std::string("sat on a mat"), 16);
  const size_t n = want.tokens.ids.size();
  EXPECT_EQ(label, 1);
  for (size_t k = 0; k < 16; ++k) {
    EXPECT_EQ(ids[k], k < n ? want.tokens.ids[k] : 0) << k;
    EXPECT_EQ(types[k], k < n ? static_cast<int32_t>(want.tokens.type_ids[k]) : 0) << k;
    EXPECT_EQ(mask[k], k < n ? 1 : 0) << k;
  }
  set.get(2, ids, types, mask, label);
  EXPECT_EQ(set.length(2), 16);  // truncated to seq_len exactly

  // The LM loader refuses a classification folder, and the classification loader an LM one, each
  // naming meta.json.
  std::string e = error_of([&] { data::TokenDataset::open_split(o.output_dir, "train"); });
  EXPECT_NE(e.find((o.output_dir / "meta.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("classification set"), std::string::npos) << e;
  fs::create_directories(dir_ / "lm");
  std::ofstream(dir_ / "lm" / "meta.json")
      << R"({"format": "DSTOKENS", "splits": {"train": {"files": ["train.bin"]}}})";
  e = error_of([&] { data::ClassificationSet::open_split(dir_ / "lm", "train"); });
  EXPECT_NE(e.find((dir_ / "lm" / "meta.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("not a classification set"), std::string::npos) << e;
  // A damaged split file names itself.
  fs::resize_file(o.output_dir / "train.cls", fs::file_size(o.output_dir / "train.cls") - 4);
  e = error_of([&] { data::ClassificationSet::open_split(o.output_dir, "train"); });
  EXPECT_NE(e.find("train.cls"), std::string::npos) << e;
}

TEST_F(Classification, IntegerLabelsAndFractionSplit) {
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += "{\"sentence1\": \"s" + std::to_string(i) + "\", \"label\": " + std::to_string(i % 3) +
            "}\n";
  data::ClassificationPrepareOptions o;
  o.inputs = {write("a.jsonl", text)};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "set";
  o.seq_len = 8;
  o.val_fraction = 0.2;
  const auto r = data::prepare_classification(o);
  EXPECT_EQ(r.labels, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_FALSE(r.pair);
  EXPECT_EQ(r.train.examples, 8);
  EXPECT_EQ(r.val.examples, 2);
  const auto val = data::ClassificationSet::open_split(o.output_dir, "val");
  EXPECT_EQ(val.label(0), 8 % 3);
  EXPECT_EQ(val.label(1), 9 % 3);
}

TEST(ClassifyScores, AccuracyAndF1) {
  // Binary: F1 of label 1. tp 2, fp 1, fn 1 -> 2*2 / (4 + 1 + 1) = 2/3; accuracy 4/6.
  const std::vector<int32_t> y = {1, 1, 1, 0, 0, 0}, p = {1, 1, 0, 1, 0, 0};
  auto s = train::classify_scores(p, y, 2);
  EXPECT_EQ(s.examples, 6);
  EXPECT_DOUBLE_EQ(s.accuracy, 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.f1, 2.0 / 3.0);
  EXPECT_STREQ(s.f1_kind, "binary F1 of label 1");
  // No positive predicted nor true: F1 0 (sklearn's zero_division=0).
  const std::vector<int32_t> zeros = {0, 0};
  EXPECT_DOUBLE_EQ(train::classify_scores(zeros, zeros, 2).f1, 0.0);
  EXPECT_DOUBLE_EQ(train::classify_scores(zeros, zeros, 2).accuracy, 1.0);
  // Three labels: macro F1 = mean of per-label F1 (sklearn f1_score(average="macro")).
  // y = 0 0 1 1 2 2, p = 0 1 1 1 2 0: F1_0 = 2/(2+1+1) = .5, F1_1 = 4/(4+1) = .8, F1_2 = 2/3.
  const std::vector<int32_t> y3 = {0, 0, 1, 1, 2, 2}, p3 = {0, 1, 1, 1, 2, 0};
  s = train::classify_scores(p3, y3, 3);
  EXPECT_NEAR(s.f1, (0.5 + 0.8 + 2.0 / 3.0) / 3.0, 1e-12);
  EXPECT_NEAR(s.accuracy, 4.0 / 6.0, 1e-12);
  EXPECT_STREQ(s.f1_kind, "macro F1");
  EXPECT_THROW(train::classify_scores(p3, y, 2), ds::Error);
}

#ifdef DS_PREPARE_BIN
// Issue 31, items 4, 5, 13 and 18 through the program: bounds on the lengths (negative and huge),
// --labels outside --task classification, a dead run's temporaries cleaned, and the output folder
// given as input.
TEST_F(Classification, DsPrepareBoundsLabelsTemporariesAndOutputAsInput) {
  const fs::path input = write("a.tsv", "sentence\tlabel\na\t0\nb\t1\nc\t0\n");
  const fs::path out = dir_ / "set", log = dir_ / "log.txt";
  auto run = [&](const std::string& args) {
    const int rc = std::system(
        fmt::format("{} --tokenizer {} --output {} {} > {} 2>&1", DS_PREPARE_BIN, kTok.string(),
                    out.string(), args, log.string())
            .c_str());
    std::ifstream in(log);
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
                     std::string{std::istreambuf_iterator<char>(in), {}}};
  };
  auto [rc, text] = run("--task classification --seq_len -1 " + input.string());
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--seq_len -1 is outside [1, 1048576]"), std::string::npos) << text;
  std::tie(rc, text) = run("--task seq2seq --max_target_len 4000000000 " + input.string());
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--max_target_len 4000000000 is outside"), std::string::npos) << text;
  std::tie(rc, text) = run("--task lm --labels a,b " + input.string());
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--labels needs --task classification"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out));

  // A killed run's temporary (its process is gone) is removed; a live process's is not touched.
  fs::create_directories(out);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = out / fmt::format("train.cls.tmp-{}", dead);
  const fs::path live = out / fmt::format("train.cls.tmp-{}", ::getpid());
  std::ofstream(stale) << "half";
  std::ofstream(live) << "busy";
  std::tie(rc, text) = run("--task classification --seq_len 8 --val_fraction 0 " + input.string());
  ASSERT_EQ(rc, 0) << text;
  EXPECT_FALSE(fs::exists(stale)) << text;
  EXPECT_TRUE(fs::exists(live));
  EXPECT_NE(text.find("left by an interrupted earlier run"), std::string::npos) << text;
  EXPECT_NE(text.find("per label: 0: 2, 1: 1"), std::string::npos) << text;
  fs::remove(live);

  // ds_prepare --output D D, run again: its own meta.json is not input.
  std::tie(rc, text) = run("--task classification --seq_len 8 " + out.string());
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("is the output folder"), std::string::npos) << text;
}
#endif

}  // namespace

// DeBERTa-v2's Unigram tokenizer.json ([CLS] A [SEP] B [SEP], types 0/1): encode_example's
// longest_first truncation, and ds_prepare --task classification as a program, give the ids and
// token type ids of transformers' tokenizer(a, b, truncation=True, max_length=T)
// (tests/fixtures/classification/deberta_cases.json, tests/fixtures/generators/gen_unigram_fixtures.py).
TEST_F(Classification, DebertaUnigramMatchesTransformers) {
  const fs::path fx_dir = fs::path(DS_FIXTURE_DIR) / "classification";
  const fs::path tok_dir = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "deberta_unigram";
  const json fx = json::parse(std::ifstream(fx_dir / "deberta_cases.json"));
  const auto tok = data::load_tokenizer(tok_dir);
  int cut = 0;
  std::string jsonl;
  std::vector<const json*> pairs;  // the cases ds_prepare gets: pairs at seq_len
  const auto seq_len = fx["seq_len"].get<size_t>();
  for (const json& c : fx["cases"]) {
    const std::optional<std::string> b =
        c["b"].is_null() ? std::nullopt : std::optional<std::string>(c["b"].get<std::string>());
    const auto e = data::encode_example(*tok, c["a"], b, c["max_length"].get<size_t>());
    EXPECT_EQ(e.tokens.ids, c["ids"].get<std::vector<int32_t>>()) << c.dump();
    EXPECT_EQ(e.tokens.type_ids, c["type_ids"].get<std::vector<uint32_t>>()) << c.dump();
    cut += e.truncated;
    if (b && c["max_length"].get<size_t>() == seq_len) {
      pairs.push_back(&c);
      jsonl +=
          json{{"sentence1", c["a"]}, {"sentence2", c["b"]}, {"label", c["label"]}}.dump() + "\n";
    }
  }
  EXPECT_GT(cut, 10);
  ASSERT_GE(pairs.size(), 5u);

#ifdef DS_PREPARE_BIN
  // --labels: these pairs happen to be of one class, which ds_prepare refuses to guess around.
  const fs::path input = write("deberta.jsonl", jsonl), out = dir_ / "deberta_set";
  const std::string cmd = fmt::format(
      "{} --task classification --tokenizer {} --seq_len {} --val_fraction 0 --labels 0,1 "
      "--output {} {} > {} 2>&1",
      DS_PREPARE_BIN, tok_dir.string(), seq_len, out.string(), input.string(),
      (dir_ / "log.txt").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto set = data::ClassificationSet::open_split(out, "train");
  ASSERT_EQ(set.size(), static_cast<int64_t>(pairs.size()));
  EXPECT_EQ(set.pad_id(), tok->config().pad_id);
  std::vector<int32_t> ids(seq_len), types(seq_len), mask(seq_len);
  for (int64_t i = 0; i < set.size(); ++i) {
    int32_t label = -1;
    set.get(i, ids, types, mask, label);
    const json& c = *pairs[static_cast<size_t>(i)];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto want_types = c["type_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(set.length(i), static_cast<int32_t>(want.size())) << c.dump();
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + set.length(i)), want) << c.dump();
    EXPECT_EQ(std::vector<int32_t>(types.begin(), types.begin() + set.length(i)), want_types)
        << c.dump();
    EXPECT_EQ(label, c["label"].get<int32_t>());
  }
#endif
}

// Issue 31, item 7: labels are trimmed and parsed strictly; mixed kinds, repeated headers, doubled
// label columns and single-class files are errors naming the place; per-class counts reported.
TEST_F(Classification, LabelsAreNormalisedAndAmbiguityRefused) {
  auto prepare = [&](const std::vector<fs::path>& inputs, std::vector<std::string> labels = {}) {
    data::ClassificationPrepareOptions o;
    o.inputs = inputs;
    o.tokenizer_dir = kTok;
    o.output_dir = dir_ / "set";
    o.seq_len = 8;
    o.val_fraction = 0.0;
    o.labels = std::move(labels);
    fs::remove_all(o.output_dir);
    return data::prepare_classification(o);
  };
  // A trailing or leading space, "+1" and "01": the class ids 0 and 1, in id order.
  auto r = prepare({write("sp.tsv", "sentence\tlabel\na\t0\nb\t1 \nc\t 1\nd\t+1\ne\t0 \nf\t01\n")});
  EXPECT_EQ(r.labels, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(r.train.label_counts, (std::vector<int64_t>{2, 4}));
  auto set = data::ClassificationSet::open_split(dir_ / "set", "train");
  EXPECT_EQ(set.label(3), 1);  // "+1"
  // JSON strings holding integers are class ids too (a TSV converted to JSON keeps them text).
  r = prepare({write("s.jsonl", "{\"sentence1\": \"a\", \"label\": \" 1\"}\n"
                                "{\"sentence1\": \"b\", \"label\": 0}\n")});
  EXPECT_EQ(r.labels, (std::vector<std::string>{"0", "1"}));
  // Names are trimmed as well.
  r = prepare({write("n.tsv", "sentence\tlabel\na\tyes \nb\tno\nc\t yes\n")});
  EXPECT_EQ(r.labels, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(r.train.label_counts, (std::vector<int64_t>{1, 2}));

  // One name among ids: refused naming both lines, not a silent switch to names.
  std::string e = error_of(
      [&] { prepare({write("mix.tsv", "sentence\tlabel\na\t0\nb\t1\nc\tone\nd\t0\n")}); });
  EXPECT_NE(e.find("mix.tsv:4"), std::string::npos) << e;
  EXPECT_NE(e.find("mix.tsv:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'one'"), std::string::npos) << e;
  // A repeated header row (cat train.tsv dev.tsv).
  e = error_of([&] {
    prepare({write("cat.tsv", "sentence\tlabel\na\t0\nb\t1\nsentence\tlabel\nc\t1\n")});
  });
  EXPECT_NE(e.find("cat.tsv:4"), std::string::npos) << e;
  EXPECT_NE(e.find("repeats the header"), std::string::npos) << e;
  // Two label columns.
  e = error_of([&] { prepare({write("two.tsv", "sentence\tlabel\tlabel\na\t0\t1\nb\t1\t0\n")}); });
  EXPECT_NE(e.find("two.tsv:1"), std::string::npos) << e;
  EXPECT_NE(e.find("'label' 2 times"), std::string::npos) << e;
  // One class: no invented second class with no example.
  e = error_of([&] { prepare({write("one.tsv", "sentence\tlabel\na\t0\nb\t0\n")}); });
  EXPECT_NE(e.find("two classes"), std::string::npos) << e;
  EXPECT_NE(e.find("--labels 0,1"), std::string::npos) << e;
  // ... unless the classes are listed: then the empty one is reported.
  r = prepare({dir_ / "one.tsv"}, {"0", "1"});
  EXPECT_EQ(r.train.label_counts, (std::vector<int64_t>{2, 0}));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("label '1' (class 1) has no training example"), std::string::npos)
      << r.notes[0];
}

// Issue 31, items 4 and 18, and the damaged-header half of 4: lengths are bounded before anything
// is allocated; an input that is (or holds) the output folder is refused; a header with absurd
// counts is "re-run ds_prepare", not a failed allocation.
TEST_F(Classification, LengthsBoundedOutputOutsideInputsAndAbsurdHeaders) {
  data::ClassificationPrepareOptions o;
  o.inputs = {write("a.tsv", "sentence\tlabel\na\t0\nb\t1\nc\t0\n")};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "set";
  o.val_fraction = 0.0;
  o.seq_len = 10'000'000;
  std::string e = error_of([&] { data::prepare_classification(o); });
  EXPECT_NE(e.find("--seq_len 10000000 exceeds"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(o.output_dir));
  // The tokenizer's model_max_length bounds it where the folder gives one.
  const fs::path tok = dir_ / "tok";
  fs::copy(kTok, tok, fs::copy_options::recursive);
  json tc = json::parse(std::ifstream(tok / "tokenizer_config.json"));
  tc["model_max_length"] = 64;
  std::ofstream(tok / "tokenizer_config.json") << tc.dump();
  o.tokenizer_dir = tok;
  o.seq_len = 65;
  e = error_of([&] { data::prepare_classification(o); });
  EXPECT_NE(e.find("model_max_length 64"), std::string::npos) << e;
  o.seq_len = 64;
  data::prepare_classification(o);

  // The output folder as input (ds_prepare --output D D, run twice) is refused; an output folder
  // inside an input folder is skipped (its meta.json is not a record file).
  auto again = o;
  again.inputs = {o.output_dir};
  e = error_of([&] { data::prepare_classification(again); });
  EXPECT_NE(e.find("is the output folder"), std::string::npos) << e;
  fs::create_directories(dir_ / "in");
  fs::copy_file(dir_ / "a.tsv", dir_ / "in" / "a.tsv");
  again.inputs = {dir_ / "in"};
  again.output_dir = dir_ / "in" / "set";
  again.tokenizer_dir = kTok;
  again.seq_len = 16;
  for (int run = 0; run < 2; ++run) {  // the second run finds the first one's meta.json there
    const auto rep = data::prepare_classification(again);
    ASSERT_EQ(rep.files.size(), 1u) << run;  // in/a.tsv only
    EXPECT_EQ(rep.files[0].first, (dir_ / "in" / "a.tsv").string());
  }

  // Absurd example counts in a split file's header (and meta.json agreeing): the size check.
  const fs::path split = o.output_dir / "train.cls";
  std::string bytes;
  {
    std::ifstream in(split, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(bytes.data() + 16, &huge, 8);
  std::ofstream(split, std::ios::binary) << bytes;
  json meta = json::parse(std::ifstream(o.output_dir / "meta.json"));
  meta["splits"]["train"]["examples"] = huge;
  std::ofstream(o.output_dir / "meta.json") << meta.dump();
  e = error_of([&] { data::ClassificationSet::open_split(o.output_dir, "train"); });
  EXPECT_NE(e.find("wrong size"), std::string::npos) << e;
  EXPECT_NE(e.find("re-run ds_prepare"), std::string::npos) << e;
}

// Issue 31, item 16: a loader given another kind of set says which kind it holds.
TEST_F(Classification, WrongKindOfSetIsNamed) {
  fs::create_directories(dir_ / "s2s");
  std::ofstream(dir_ / "s2s" / "meta.json") << R"({"format": "DSSEQ2SEQ", "kind": "seq2seq"})";
  std::string e = error_of([&] { data::ClassificationSet::open_split(dir_ / "s2s", "train"); });
  EXPECT_NE(e.find("holds a seq2seq set"), std::string::npos) << e;
  EXPECT_EQ(e.find("language-model tokens"), std::string::npos) << e;
  e = error_of([&] { data::TokenDataset::open_split(dir_ / "s2s", "train"); });
  EXPECT_NE(e.find("holds a seq2seq set"), std::string::npos) << e;
}
