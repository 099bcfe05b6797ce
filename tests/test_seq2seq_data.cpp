// Seq2seq data and BLEU: JSONL source/target records (field detection, named fields, errors with
// file, line and field), transformers' truncation of sources against
// tests/fixtures/seq2seq/truncation_cases.json (tests/fixtures/generators/gen_seq2seq_data_fixture.py), the
// DSSEQ2SEQ set written by prepare_seq2seq and read back (labels ending with eos, -100 padding,
// the refusal of other folders), and corpus BLEU and the 13a tokenizer against sacreBLEU
// (tests/fixtures/bleu/cases.json, tests/fixtures/generators/gen_bleu_fixture.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/classification_set.h"
#include "ds/data/seq2seq_set.h"
#include "ds/data/text_tokenizer.h"
#include "ds/train/bleu.h"
#include "task_fixture.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ds;

namespace {

const fs::path kTok = fs::path(DS_FIXTURE_DIR) / "classification" / "roberta_bpe";

class Seq2SeqData : public ds::testing::ScratchDirTest {
 protected:
  Seq2SeqData() : ScratchDirTest("s2s_data_") {}
};

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST_F(Seq2SeqData, ReadsRecordsWithDetectedOrNamedFields) {
  const auto a =
      data::read_seq2seq_file(write("a.jsonl",
                                    "\xEF\xBB\xBF{\"source\": \"hi\", \"target\": \"hello\"}\r\n\n"
                                    "{\"source\": \"bye\", \"target\": \"\"}\n"));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].source, "hi");
  EXPECT_EQ(a[0].target, "hello");
  EXPECT_EQ(a[1].line, 3u);
  EXPECT_EQ(a[1].target, "");
  std::pair<std::string, std::string> used;
  const auto b = data::read_seq2seq_file(
      write("b.jsonl", "{\"prompt\": \"p\", \"response\": \"r\", \"history\": []}\n"), "", "",
      &used);
  EXPECT_EQ(b[0].source, "p");
  EXPECT_EQ(used, (std::pair<std::string, std::string>{"prompt", "response"}));
  const auto c =
      data::read_seq2seq_file(write("c.jsonl", "{\"q\": \"x\", \"a\": \"y\"}\n"), "q", "a");
  EXPECT_EQ(c[0].target, "y");
}

TEST_F(Seq2SeqData, ErrorsNameFileLineAndField) {
  const auto f1 = write("bad.jsonl",
                        "{\"source\": \"a\", \"target\": \"b\"}\n{\"source\": 3, "
                        "\"target\": \"b\"}\n");
  const std::string e1 = error_of([&] { data::read_seq2seq_file(f1); });
  EXPECT_HAS(e1, "[seq2seq]");
  EXPECT_HAS(e1, "bad.jsonl:2");
  EXPECT_HAS(e1, "field 'source' must be a string");
  const auto f2 =
      write("miss.jsonl", "{\"source\": \"a\", \"target\": \"b\"}\n{\"source\": \"a\"}\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f2); }),
             "miss.jsonl:2: field 'target' is missing");
  const auto f3 = write("none.jsonl", "{\"text\": \"a\"}\n");
  const std::string e3 = error_of([&] { data::read_seq2seq_file(f3); });
  EXPECT_HAS(e3, "none.jsonl:1");
  EXPECT_HAS(e3, "--source_field");
  EXPECT_HAS(e3, "fields text");
  const auto f4 = write("json.jsonl", "{\"source\": \"a\", \"target\": \"b\"}\n[1, 2]\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f4); }), "json.jsonl:2: a record must be");
  const auto f5 = write("cut.jsonl", "{\"source\": \"a\", \"tar\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f5); }), "cut.jsonl:1: not a JSON object");
  const auto f6 = write("empty.jsonl", "\n\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f6); }), "no records");
  const auto f7 = write("x.tsv", "a\tb\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f7); }), "unknown file type '.tsv'");
  const auto f8 = write("es.jsonl", "{\"source\": \"\", \"target\": \"b\"}\n");
  EXPECT_HAS(error_of([&] { data::read_seq2seq_file(f8); }),
             "es.jsonl:1: field 'source' (the source) is empty");
}

// Sources as tokenizer(text, truncation=True, max_length=L): <s> x </s> cut to L ids.
TEST_F(Seq2SeqData, TruncationMatchesTransformers) {
  const auto tok = data::load_tokenizer(kTok);
  const json cases =
      json::parse(std::ifstream(fs::path(DS_FIXTURE_DIR) / "seq2seq" / "truncation_cases.json"));
  ASSERT_GE(cases["cases"].size(), 10u);
  for (const json& c : cases["cases"]) {
    const std::string text = c["text"];
    const size_t L = c["max_length"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = data::encode_seq2seq_text(*tok, text, L);
    EXPECT_EQ(got.ids, want) << text << " max_length " << L;
    EXPECT_EQ(got.truncated,
              want.size() == L && got.ids.size() == L && tok->encode(text).size() + 2 > L)
        << text;
    // Labels: the same ids (the template already ends with eos </s>): nothing appended.
    EXPECT_EQ(data::encode_seq2seq_text(*tok, text, L, true, 701).ids, want);
  }
  EXPECT_HAS(error_of([&] { data::encode_seq2seq_text(*tok, "hello", 2); }),
             "cannot hold the 2 special tokens");
}

TEST_F(Seq2SeqData, PreparesAndReadsBackTheSet) {
  std::string lines;
  for (int i = 0; i < 10; ++i)
    lines += "{\"prompt\": \"question number " + std::to_string(i) +
             " is a long one with many words\", \"response\": \"answer " + std::to_string(i) +
             "\"}\n";
  write("chat.jsonl", lines);
  data::Seq2SeqPrepareOptions o;
  o.inputs = {dir_ / "chat.jsonl"};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "set";
  o.max_source_len = 6;
  o.max_target_len = 8;
  o.val_fraction = 0.2;
  const auto r = data::prepare_seq2seq(o);
  EXPECT_EQ(r.train.examples, 8);
  EXPECT_EQ(r.val.examples, 2);
  EXPECT_EQ(r.train.truncated_source, 8);
  EXPECT_EQ(r.train.truncated_target, 0);
  EXPECT_EQ(r.source_field, "prompt");
  EXPECT_EQ(r.pad_id, 702);
  EXPECT_EQ(r.eos_id, 701);
  EXPECT_EQ(r.decoder_start_id, 701);
  EXPECT_TRUE(data::is_seq2seq_set(o.output_dir));
  EXPECT_FALSE(data::is_classification_set(o.output_dir));

  const auto tok = data::load_tokenizer(kTok);
  const auto set = data::Seq2SeqSet::open_split(o.output_dir, "train");
  EXPECT_EQ(set.size(), 8);
  EXPECT_EQ(set.source_len(), 6);
  EXPECT_EQ(set.target_len(), 8);
  EXPECT_EQ(set.pad_id(), 702);
  EXPECT_EQ(set.decoder_start_id(), 701);
  EXPECT_EQ(set.tokenizer_path(), kTok);
  std::vector<int32_t> src(6), mask(6), labels(8);
  set.get(3, src, mask, labels);
  std::vector<int32_t> want_src = tok->encode("question number 3 is a long one with many words");
  want_src.resize(4);
  want_src.insert(want_src.begin(), 700);
  want_src.push_back(701);
  EXPECT_EQ(src, want_src);
  EXPECT_EQ(mask, std::vector<int32_t>(6, 1));
  std::vector<int32_t> want_t = tok->encode("answer 3");
  want_t.insert(want_t.begin(), 700);
  want_t.push_back(701);
  EXPECT_EQ(set.target(3), want_t);
  for (size_t k = 0; k < 8; ++k) EXPECT_EQ(labels[k], k < want_t.size() ? want_t[k] : -100);
  EXPECT_EQ(set.source(3), want_src);
  EXPECT_EQ(tok->decode(set.target(3), true), "answer 3");
  EXPECT_EQ(data::Seq2SeqSet::open_split(o.output_dir, "val").size(), 2);

  // Short sources are padded with pad_id and masked.
  write("short.jsonl", "{\"source\": \"hi\", \"target\": \"yo\"}\n");
  o.inputs = {dir_ / "short.jsonl"};
  o.output_dir = dir_ / "short";
  o.val_fraction = 0.0;
  data::prepare_seq2seq(o);
  const auto sh = data::Seq2SeqSet::open_split(o.output_dir, "train");
  sh.get(0, src, mask, labels);
  const size_t n = tok->encode("hi").size() + 2;
  ASSERT_LT(n, 6u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(mask[k], k < n ? 1 : 0);
    if (k >= n) EXPECT_EQ(src[k], 702);
  }
  EXPECT_HAS(error_of([&] { data::Seq2SeqSet::open_split(o.output_dir, "val"); }),
             "has no split 'val'");

  // Errors: another kind of folder, a damaged file, a record error naming file:line.
  std::ofstream(dir_ / "set" / "train.s2s", std::ios::app) << "x";
  EXPECT_HAS(error_of([&] { data::Seq2SeqSet::open_split(dir_ / "set", "train"); }), "wrong size");
  fs::create_directories(dir_ / "lm");
  std::ofstream(dir_ / "lm" / "meta.json") << R"({"format": "DSTOKENS", "version": 1})";
  EXPECT_HAS(error_of([&] { data::Seq2SeqSet::open_split(dir_ / "lm", "train"); }),
             "is not a seq2seq set");
  write("bad.jsonl",
        "{\"source\": \"a\", \"target\": \"b\"}\n{\"source\": \"a\", \"target\": 1}\n");
  o.inputs = {dir_ / "bad.jsonl"};
  EXPECT_HAS(error_of([&] { data::prepare_seq2seq(o); }), "bad.jsonl:2: field 'target'");
}

// The GPT-2 byte-level BPE has no template: the source as is, the target with eos appended.
TEST_F(Seq2SeqData, TokenizerWithoutTemplateAppendsEosToTargets) {
  const auto tok = data::load_tokenizer(fs::path(DS_FIXTURE_DIR) / "tokenizers" / "gpt2_bpe");
  const int32_t eos = tok->config().eos_id;
  ASSERT_GE(eos, 0);
  const auto ids = tok->encode("one two three four");
  EXPECT_EQ(data::encode_seq2seq_text(*tok, "one two three four", 64).ids, ids);
  auto t = data::encode_seq2seq_text(*tok, "one two three four", 3, true, eos);
  EXPECT_TRUE(t.truncated);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{ids[0], ids[1], eos}));
}

// ---- BLEU against sacreBLEU ------------------------------------------------------------------

TEST(Bleu, Tokenize13aMatchesSacrebleu) {
  const json cases = json::parse(std::ifstream(fs::path(DS_FIXTURE_DIR) / "bleu" / "cases.json"));
  ASSERT_GE(cases["tokenize_13a"].size(), 10u);
  for (const json& c : cases["tokenize_13a"]) {
    std::string text = c["text"];
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.pop_back();
    EXPECT_EQ(train::tokenize_13a(text), c["tokens"].get<std::string>()) << text;
  }
}

TEST(Bleu, CorpusBleuMatchesSacrebleu) {
  const json cases = json::parse(std::ifstream(fs::path(DS_FIXTURE_DIR) / "bleu" / "cases.json"));
  ASSERT_GE(cases["corpus_bleu"].size(), 10u);
  for (const json& c : cases["corpus_bleu"]) {
    const std::string name = c["name"];
    const auto s = train::corpus_bleu(c["hypotheses"].get<std::vector<std::string>>(),
                                      c["references"].get<std::vector<std::vector<std::string>>>());
    EXPECT_NEAR(s.score, c["score"].get<double>(), 1e-9) << name;
    EXPECT_NEAR(s.brevity_penalty, c["bp"].get<double>(), 1e-12) << name;
    EXPECT_EQ(s.sys_len, c["sys_len"].get<int64_t>()) << name;
    EXPECT_EQ(s.ref_len, c["ref_len"].get<int64_t>()) << name;
    for (size_t n = 0; n < 4; ++n) {
      EXPECT_EQ(s.correct[n], c["counts"][n].get<int64_t>()) << name << " order " << n + 1;
      EXPECT_EQ(s.total[n], c["totals"][n].get<int64_t>()) << name << " order " << n + 1;
      EXPECT_NEAR(s.precisions[n], c["precisions"][n].get<double>(), 1e-9) << name;
    }
  }
  EXPECT_THROW(train::corpus_bleu({"a"}, {}), ds::Error);
}

// Issue 31, item 4: the lengths are bounded (1e7 once wrote a 4.9 GB temporary), and a split file
// whose header claims absurd lengths is "re-run ds_prepare", not a failed allocation.
TEST_F(Seq2SeqData, LengthsBoundedAndAbsurdHeaderRefused) {
  write("a.jsonl", "{\"source\": \"hi there\", \"target\": \"yo\"}\n"
                   "{\"source\": \"and you\", \"target\": \"me\"}\n");
  data::Seq2SeqPrepareOptions o;
  o.inputs = {dir_ / "a.jsonl"};
  o.tokenizer_dir = kTok;
  o.output_dir = dir_ / "set";
  o.val_fraction = 0.0;
  o.max_source_len = 10'000'000;
  EXPECT_HAS(error_of([&] { data::prepare_seq2seq(o); }), "--max_source_len 10000000 exceeds");
  o.max_source_len = 8;
  o.max_target_len = size_t{4'000'000'000};
  EXPECT_HAS(error_of([&] { data::prepare_seq2seq(o); }), "--max_target_len 4000000000 exceeds");
  EXPECT_FALSE(fs::exists(o.output_dir));
  o.max_target_len = 8;
  data::prepare_seq2seq(o);
  const fs::path split = o.output_dir / "train.s2s";
  std::string bytes;
  {
    std::ifstream in(split, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const uint32_t huge = 4'000'000'000u;  // S and T
  std::memcpy(bytes.data() + 12, &huge, 4);
  std::memcpy(bytes.data() + 16, &huge, 4);
  std::ofstream(split, std::ios::binary) << bytes;
  const std::string e = error_of([&] { data::Seq2SeqSet::open_split(o.output_dir, "train"); });
  EXPECT_HAS(e, "wrong size");
  EXPECT_HAS(e, "re-run ds_prepare");
}

}  // namespace
