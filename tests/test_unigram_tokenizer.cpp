// Unigram tokenizer.json (DeBERTa-v2, T5 with a Precompiled normalizer, and a byte-fallback
// variant) against the ids, offsets, decodes and pair encodings that Hugging Face `tokenizers` gave
// for the same folders (tests/fixtures/tokenizers/{deberta_unigram,t5_unigram,
// unigram_bytefallback}, unigram_cases.json, written by tests/fixtures/generators/gen_unigram_fixtures.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "added_token_cases.h"
#include "ds/core/error.h"
#include "ds/data/dataset.h"
#include "ds/data/prepare.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer_export.h"
#include "ds/serve/text_tokenizer.h"

namespace fs = std::filesystem;
using ds::data::load_tokenizer;
using ds::data::TokenSpan;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "tokenizers";
const char* const kFolders[] = {"deberta_unigram", "t5_unigram", "unigram_bytefallback"};

const json& unigram_cases() {
  static const json j = [] {
    std::ifstream in(kFixtures / "unigram_cases.json");
    EXPECT_TRUE(in.good()) << "missing " << kFixtures / "unigram_cases.json";
    return json::parse(in);
  }();
  return j;
}

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           fmt::format("ds_test_unigram_{}_{}", getpid(), reinterpret_cast<uintptr_t>(this));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(Unigram, SingleTextsMatchTokenizers) {
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    EXPECT_EQ(tok->kind(), "unigram");
    const json& f = unigram_cases()[name];
    EXPECT_EQ(tok->vocab_size(), f["vocab_size"].get<int>()) << name;
    for (const json& c : f["singles"]) {
      const std::string text = c["text"];
      std::vector<int32_t> ids;
      std::vector<TokenSpan> spans;
      tok->encode(text, false, ids, &spans);
      EXPECT_EQ(ids, ids_of(c["ids"])) << name << ": '" << text << "'";
      // `tokenizers`' normalize_str runs over added tokens too; normalize() keeps them as they are.
      if (std::none_of(ids.begin(), ids.end(), [&](int32_t id) { return tok->is_special(id); }))
        EXPECT_EQ(tok->normalize(text), c["normalized"].get<std::string>())
            << name << ": '" << text << "'";
      std::vector<std::vector<uint32_t>> got;
      for (const TokenSpan& s : spans) got.push_back({s.begin, s.end});
      EXPECT_EQ(got, c["offsets"].get<std::vector<std::vector<uint32_t>>>())
          << name << ": '" << text << "'";
      const auto with = tok->encode(text, true);
      EXPECT_EQ(with, ids_of(c["ids_with_special"])) << name << ": '" << text << "'";
      EXPECT_EQ(tok->decode(with, false), c["decoded"].get<std::string>())
          << name << ": '" << text << "'";
      EXPECT_EQ(tok->decode(with, true), c["decoded_skip"].get<std::string>())
          << name << ": '" << text << "'";
    }
  }
}

TEST(Unigram, PairsMatchTokenizers) {
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    for (const json& c : unigram_cases()[name]["pairs"]) {
      const std::string a = c["a"], b = c["b"];
      const auto e = tok->encode_pair(a, b, true);
      EXPECT_EQ(e.ids, ids_of(c["ids"])) << name << ": '" << a << "' / '" << b << "'";
      EXPECT_EQ(e.type_ids, c["type_ids"].get<std::vector<uint32_t>>()) << name << ": " << a;
      const auto plain = tok->encode_pair(a, b, false);
      EXPECT_EQ(plain.ids, ids_of(c["ids_plain"])) << name << ": " << a;
      EXPECT_EQ(plain.type_ids, c["type_ids_plain"].get<std::vector<uint32_t>>()) << name;
    }
  }
}

TEST(Unigram, SpecialTokensAndConfig) {
  auto deb = load_tokenizer(kFixtures / "deberta_unigram");
  const auto& c = deb->config();
  EXPECT_EQ(c.cls_id, deb->token_to_id("[CLS]"));
  EXPECT_EQ(c.sep_id, deb->token_to_id("[SEP]"));
  EXPECT_EQ(c.pad_id, deb->token_to_id("[PAD]"));
  EXPECT_EQ(c.mask_id, deb->token_to_id("[MASK]"));
  EXPECT_EQ(c.unk_id, deb->token_to_id("[UNK]"));
  EXPECT_TRUE(deb->is_special(c.cls_id));
  EXPECT_FALSE(deb->is_special(deb->token_to_id("\xE2\x96\x81the")));
  // post_process is the pair template encode_pair uses (what classification.h truncates for).
  const std::vector<int32_t> a = {10, 11}, b = {12};
  const std::span<const int32_t> sb(b);
  const auto p = deb->post_process(a, &sb);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{c.cls_id, 10, 11, c.sep_id, 12, c.sep_id}));
  EXPECT_EQ(p.type_ids, (std::vector<uint32_t>{0, 0, 0, 0, 1, 1}));
  auto t5 = load_tokenizer(kFixtures / "t5_unigram");
  EXPECT_EQ(t5->config().eos_id, t5->token_to_id("</s>"));
  EXPECT_EQ(t5->encode("", true), std::vector<int32_t>{t5->config().eos_id});
}

TEST(Unigram, ExportReloadsIdentically) {
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    TempDir tmp;
    ds::data::export_tokenizer(*tok, tmp.path);
    auto back = load_tokenizer(tmp.path);
    EXPECT_EQ(back->kind(), "unigram");
    EXPECT_EQ(back->vocab_size(), tok->vocab_size());
    EXPECT_EQ(back->config().eos_id, tok->config().eos_id) << name;
    EXPECT_EQ(back->config().pad_id, tok->config().pad_id) << name;
    for (const json& c : unigram_cases()[name]["singles"]) {
      const std::string text = c["text"];
      EXPECT_EQ(back->encode(text, true), ids_of(c["ids_with_special"])) << name << ": " << text;
    }
  }
}

TEST(Unigram, UnsupportedComponentsAreNamed) {
  std::ifstream in(kFixtures / "deberta_unigram" / "tokenizer.json");
  const json base = json::parse(in);
  auto expect_error = [&](const std::function<void(json&)>& edit, const std::string& needle) {
    TempDir tmp;
    json j = base;
    edit(j);
    std::ofstream(tmp.path / "tokenizer.json") << j.dump();
    std::string what = "(no error)";
    try {
      load_tokenizer(tmp.path);
    } catch (const ds::Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("tokenizer.json"), std::string::npos) << what;
  };
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "BertNormalizer"}};
      },
      "normalizer.type 'BertNormalizer'");
  expect_error([](json& j) { j["normalizer"]["normalizers"][0]["pattern"]["Regex"] = "\\d+"; },
               "normalizer.normalizers[0].pattern.Regex '\\d+'");
  expect_error([](json& j) { j["normalizer"]["normalizers"][2]["strip_left"] = "no"; },
               "normalizer.normalizers[2].strip_left");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "ByteLevel"}};
      },
      "pre_tokenizer.type 'ByteLevel'");
  expect_error(
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["prepend_scheme"] = "sometimes"; },
      "prepend_scheme");
  expect_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder.type 'WordPiece'");
  expect_error([](json& j) { j["model"]["unk_id"] = 100000; }, "model.unk_id");
  expect_error([](json& j) { j["model"]["vocab"][5] = "x"; }, "model.vocab[5]");
  expect_error([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  expect_error([](json& j) { j["added_tokens"][0]["strip"] = true; },
               "added_tokens[0].strip is not supported by the Unigram loader");
  expect_error([](json& j) { j["added_tokens"][0]["rstrip"] = "no"; },
               "added_tokens[0].rstrip must be true or false");
  expect_error(
      [](json& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      "post_processor.type 'RobertaProcessing'");
}

TEST(Unigram, AddedTokenFlagsMatchTokenizers) {
  // lstrip, rstrip, single_word; normalized=true tokens met through the normalizer (T5's NFKC
  // charsmap, Lowercase), normalized=false ones only as written; DeBERTa's [MASK] with lstrip.
  // Ids and offsets of the `tokenizers` library (added_token_cases.json).
  const int n = ds::test::for_each_added_token_case(
      "unigram_", [](const json& c, const ds::data::TextTokenizer& tok) {
        for (const json& t : c["texts"]) {
          const std::string text = t["text"];
          std::vector<int32_t> ids;
          std::vector<TokenSpan> spans;
          tok.encode(text, false, ids, &spans);
          EXPECT_EQ(ids, ids_of(t["ids"])) << c["name"] << ": '" << text << "'";
          EXPECT_EQ(tok.encode(text, true), ids_of(t["ids_with_special"])) << text;
          std::vector<std::vector<uint32_t>> got;
          for (const TokenSpan& s : spans) got.push_back({s.begin, s.end});
          EXPECT_EQ(got, t["offsets"].get<std::vector<std::vector<uint32_t>>>())
              << c["name"] << ": '" << text << "'";
        }
      });
  EXPECT_EQ(n, 3);
}

TEST(Unigram, ViterbiUnkAndByteFallback) {
  // A hand-made vocabulary: the best segmentation by total score, ties to the shorter first
  // piece, unknown characters fused into one unk (or split into <0xNN> pieces with byte_fallback).
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "Unigram"}, {"unk_id", 0}, {"byte_fallback", false}, {"vocab", json::array()}}}};
  for (const auto& [piece, score] : std::vector<std::pair<std::string, double>>{{"<unk>", 0.0},
                                                                                {"a", -1.0},
                                                                                {"b", -1.0},
                                                                                {"c", -1.0},
                                                                                {"d", -1.0},
                                                                                {"cd", -1.0},
                                                                                {"ab", -2.0},
                                                                                {"abc", -5.0},
                                                                                {"abcd", -1.5},
                                                                                {"<0xC3>", -1.0},
                                                                                {"<0xA9>", -1.0}})
    j["model"]["vocab"].push_back(json::array({piece, score}));

  TempDir tmp;
  std::ofstream(tmp.path / "tokenizer.json") << j.dump();
  auto tok = load_tokenizer(tmp.path);
  EXPECT_EQ(tok->encode("abcd"), (std::vector<int32_t>{8}));        // abcd (-1.5)
  EXPECT_EQ(tok->encode("abcdab"), (std::vector<int32_t>{8, 6}));   // abcd ab
  EXPECT_EQ(tok->encode("acd"), (std::vector<int32_t>{1, 5}));      // a cd
  EXPECT_EQ(tok->encode("axyb"), (std::vector<int32_t>{1, 0, 2}));  // xy fused into one unk
  EXPECT_EQ(tok->encode("x\xC3\xA9"), (std::vector<int32_t>{0}));   // "xé": one unk
  j["model"]["byte_fallback"] = true;
  std::ofstream(tmp.path / "tokenizer.json") << j.dump();
  tok = load_tokenizer(tmp.path);
  EXPECT_EQ(tok->encode("a\xC3\xA9"), (std::vector<int32_t>{1, 9, 10}));  // é as its two bytes
  EXPECT_EQ(tok->decode(std::vector<int32_t>{1, 9, 10}), "a\xC3\xA9");
  EXPECT_EQ(tok->encode("ax"), (std::vector<int32_t>{1, 0}));       // no <0x78>: unk
  EXPECT_EQ(tok->decode(std::vector<int32_t>{9}), "\xEF\xBF\xBD");  // a lone byte: U+FFFD
  EXPECT_THROW(tok->decode(std::vector<int32_t>{tok->vocab_size()}), ds::Error);
}

// ds_generate / ds_serve load a model folder's tokenizer through serve::load_text_tokenizer: a T5
// folder encodes with its template ("... </s>"), decodes without special tokens, stops at </s>.
TEST(Unigram, ServeTokenizerTakesT5Folder) {
  auto tok = ds::serve::load_text_tokenizer(kFixtures / "t5_unigram");
  EXPECT_EQ(tok->name(), "unigram");
  const json& c = unigram_cases()["t5_unigram"]["singles"][2];  // "Hello world"
  ASSERT_EQ(c["text"], "Hello world");
  EXPECT_EQ(tok->encode("Hello world"), ids_of(c["ids_with_special"]));
  EXPECT_EQ(tok->decode(ids_of(c["ids_with_special"])), c["decoded_skip"].get<std::string>());
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{1});
}

// ds_prepare (language-model shards) with a Hugging Face folder: every document is its eos token
// then encode(file), in file order, whatever the thread count; meta.json names the tokenizer.
TEST(Unigram, PrepareCorpusWithT5Folder) {
  TempDir tmp;
  const std::vector<std::string> docs = {"The Congress shall make no law.\n\nSecond  paragraph.",
                                         "Café 你好 👋\tend", "x"};
  for (size_t k = 0; k < docs.size(); ++k)
    std::ofstream(tmp.path / fmt::format("doc{}.txt", k)) << docs[k];
  auto tok = load_tokenizer(kFixtures / "t5_unigram");
  ds::data::PrepareOptions o;
  o.inputs = {tmp.path};
  o.tokenizer_dir = kFixtures / "t5_unigram";
  o.output_dir = tmp.path / "out";
  o.val_fraction = 0.0;
  o.threads = 2;
  const auto r = ds::data::prepare_corpus(o);
  EXPECT_EQ(r.train.documents, docs.size());
  std::vector<int32_t> expected;
  for (const std::string& d : docs) {
    expected.push_back(tok->config().eos_id);
    const auto ids = tok->encode(d);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  const auto ds = ds::data::TokenDataset::open_split(o.output_dir, "train", /*verify=*/true);
  ASSERT_EQ(ds.num_tokens(), expected.size());
  std::vector<int32_t> got(expected.size());
  ds.read_tokens(0, got);
  EXPECT_EQ(got, expected);
  std::ifstream meta_in(o.output_dir / "meta.json");
  const json meta = json::parse(meta_in);
  EXPECT_EQ(meta["tokenizer"]["name"], "unigram");
  EXPECT_EQ(meta["tokenizer"]["eot_id"], tok->config().eos_id);
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], tok->vocab_size());

  // GPT-2's <|endoftext|> splitting is refused by name; so is a folder without an eos token.
  o.split_on_eot = true;
  o.output_dir = tmp.path / "out2";
  try {
    ds::data::prepare_corpus(o);
    ADD_FAILURE() << "split_on_eot accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split_on_eot"), std::string::npos) << e.what();
  }
  o.split_on_eot = false;
  fs::create_directories(tmp.path / "noeos");
  fs::copy_file(kFixtures / "t5_unigram" / "tokenizer.json", tmp.path / "noeos" / "tokenizer.json");
  o.tokenizer_dir = tmp.path / "noeos";
  try {
    ds::data::prepare_corpus(o);
    ADD_FAILURE() << "a folder without eos_token accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token"), std::string::npos) << e.what();
  }
}

TEST(Unigram, LongInputsStayFast) {
  // 256 kB of prose and a 100 kB run without spaces: linear in the length for each folder.
  std::string text;
  while (text.size() < (1u << 18)) text += "The Quick, brown fox jumps over the lazy dog! Café. ";
  const std::string run(100000, 'x');
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_GT(tok->encode(text).size(), text.size() / 8) << name;
    EXPECT_GT(tok->encode(run).size(), 1000u) << name;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 10.0) << name;
    std::printf("%s: %.2f s for 356 kB\n", name.c_str(), seconds);
  }
}

// A DeBERTa-v3 folder as the hub ships it (spm.model, tokenizer_config.json, no tokenizer.json)
// loads as the pipeline transformers 5 builds from it: the same ids, decodes and pairs as the
// tokenizer.json transformers saved from the same model; export writes that tokenizer.json.
TEST(Unigram, DebertaSpmModelFolder) {
  auto tok = load_tokenizer(kFixtures / "deberta_spm");
  EXPECT_EQ(tok->kind(), "unigram");
  const json& f = unigram_cases()["deberta_unigram"];
  EXPECT_EQ(tok->vocab_size(), f["vocab_size"].get<int>());
  for (const json& c : f["singles"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->encode(text, false), ids_of(c["ids"])) << text;
    const auto with = tok->encode(text, true);
    EXPECT_EQ(with, ids_of(c["ids_with_special"])) << text;
    EXPECT_EQ(tok->decode(with, true), c["decoded_skip"].get<std::string>()) << text;
  }
  for (const json& c : f["pairs"]) {
    const auto e = tok->encode_pair(c["a"].get<std::string>(), c["b"].get<std::string>(), true);
    EXPECT_EQ(e.ids, ids_of(c["ids"]));
    EXPECT_EQ(e.type_ids, c["type_ids"].get<std::vector<uint32_t>>());
  }
  EXPECT_EQ(tok->config().cls_id, tok->token_to_id("[CLS]"));
  EXPECT_EQ(tok->config().mask_id, tok->token_to_id("[MASK]"));
  TempDir tmp;
  ds::data::export_tokenizer(*tok, tmp.path);
  EXPECT_TRUE(fs::exists(tmp.path / "tokenizer.json"));
  auto back = load_tokenizer(tmp.path);
  EXPECT_EQ(back->encode("Hello  world", true), tok->encode("Hello  world", true));

  // DeBERTa-v3's [MASK] is not a piece of spm.model: added_tokens.json gives its id after them.
  TempDir v3;
  fs::copy_file(kFixtures / "deberta_spm" / "spm.model", v3.path / "spm.model");
  std::ofstream(v3.path / "tokenizer_config.json")
      << R"({"mask_token": "[MASK2]", "tokenizer_class": "DebertaV2Tokenizer"})";
  std::ofstream(v3.path / "added_tokens.json") << R"({"[MASK2]": 1000})";
  auto t3 = load_tokenizer(v3.path);
  EXPECT_EQ(t3->vocab_size(), 1001);
  EXPECT_EQ(t3->config().mask_id, 1000);
  // transformers 5.24 on this folder: [274, 1000, 408], with specials [2, 274, 1000, 408, 3].
  EXPECT_EQ(t3->encode("a [MASK2] b"), (std::vector<int32_t>{274, 1000, 408}));
  EXPECT_EQ(t3->encode("a [MASK2] b", true), (std::vector<int32_t>{2, 274, 1000, 408, 3}));
  std::ofstream(v3.path / "tokenizer_config.json") << R"({"split_by_punct": true})";
  try {
    load_tokenizer(v3.path);
    ADD_FAILURE() << "split_by_punct accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split_by_punct"), std::string::npos) << e.what();
  }
}
