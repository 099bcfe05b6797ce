// WordPiece tokenizer.json (BERT style) against the ids, token type ids and decoded text that
// Hugging Face `tokenizers` gave for the same folders (tests/fixtures/tokenizers/bert_wordpiece*,
// wordpiece_cases.json, written by tests/fixtures/generators/gen_hf_tokenizer_fixtures.py --only wordpiece).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "added_token_cases.h"
#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer_export.h"

namespace fs = std::filesystem;
using ds::data::load_tokenizer;
using ds::data::TextTokenizer;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "tokenizers";
const char* const kFolders[] = {"bert_wordpiece", "bert_wordpiece_cased"};

const json& wordpiece_cases() {
  static const json j = [] {
    std::ifstream in(kFixtures / "wordpiece_cases.json");
    EXPECT_TRUE(in.good()) << "missing " << kFixtures / "wordpiece_cases.json";
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
           fmt::format("ds_test_wordpiece_{}_{}", getpid(), reinterpret_cast<uintptr_t>(this));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string error_of(const fs::path& folder) {
  try {
    load_tokenizer(folder);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(WordPiece, SingleTextsMatchTokenizers) {
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    EXPECT_EQ(tok->kind(), "wordpiece");
    const json& f = wordpiece_cases()["tokenizers"][name];
    EXPECT_EQ(tok->vocab_size(), f["info"]["vocab_size"].get<int>()) << name;
    EXPECT_EQ(tok->config().unk_id, f["info"]["unk"].get<int>()) << name;
    EXPECT_EQ(tok->config().pad_id, f["info"]["pad"].get<int>()) << name;
    EXPECT_EQ(tok->config().cls_id, f["info"]["cls"].get<int>()) << name;
    EXPECT_EQ(tok->config().sep_id, f["info"]["sep"].get<int>()) << name;
    EXPECT_EQ(tok->config().mask_id, tok->token_to_id("[MASK]")) << name;
    EXPECT_TRUE(tok->is_special(tok->token_to_id("[SEP]")));
    for (const json& c : f["cases"]) {
      const std::string text = c["text"];
      std::vector<int32_t> ids;
      std::vector<ds::data::TokenSpan> spans;
      tok->encode(text, false, ids, &spans);
      EXPECT_EQ(ids, ids_of(c["ids"])) << name << ": " << text;
      const std::vector<int32_t> with = tok->encode(text, true);
      EXPECT_EQ(with, ids_of(c["ids_with_special"])) << name << ": " << text;
      const std::string normalized = tok->normalize(text);
      // The fixture holds the normalizer alone; normalize() keeps added tokens ("[MASK]") as the
      // pipeline matches them before normalizing.
      const bool has_added =
          std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return tok->is_special(id); });
      if (!has_added)
        EXPECT_EQ(normalized, c["normalized"].get<std::string>()) << name << ": " << text;
      EXPECT_EQ(tok->decode(ids), c["decoded"].get<std::string>()) << name << ": " << text;
      EXPECT_EQ(tok->decode(with), c["decoded_with_special"].get<std::string>()) << name;
      EXPECT_EQ(tok->decode(with, /*skip_special_tokens=*/true),
                c["decoded_skip_special"].get<std::string>())
          << name << ": " << text;
      // Spans lie in the normalized text, in order; a "##" piece spells the vocabulary token
      // without its prefix.
      ASSERT_EQ(spans.size(), ids.size()) << text;
      for (size_t k = 0; k < ids.size(); ++k) {
        ASSERT_LE(spans[k].end, normalized.size()) << text;
        if (k > 0) EXPECT_LE(spans[k - 1].end, spans[k].begin) << text;
        if (ids[k] == tok->config().unk_id) continue;
        std::string piece = tok->id_to_token(ids[k]);
        if (piece.starts_with("##")) piece = piece.substr(2);
        EXPECT_EQ(normalized.substr(spans[k].begin, spans[k].end - spans[k].begin), piece) << text;
      }
    }
  }
}

TEST(WordPiece, PairsMatchTokenizers) {
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    for (const json& c : wordpiece_cases()["tokenizers"][name]["pairs"]) {
      const std::string a = c["a"], b = c["b"];
      const ds::data::PairEncoding plain = tok->encode_pair(a, b, false);
      EXPECT_EQ(plain.ids, ids_of(c["ids"])) << name << ": " << a << " | " << b;
      EXPECT_EQ(plain.type_ids, c["type_ids"].get<std::vector<uint32_t>>()) << name << ": " << a;
      const ds::data::PairEncoding full = tok->encode_pair(a, b);
      EXPECT_EQ(full.ids, ids_of(c["ids_with_special"])) << name << ": " << a << " | " << b;
      EXPECT_EQ(full.type_ids, c["type_ids_with_special"].get<std::vector<uint32_t>>())
          << name << ": " << a << " | " << b;
      EXPECT_EQ(tok->decode(full.ids), c["decoded_with_special"].get<std::string>()) << name;
    }
  }
  // Byte-level BPE has no pair template: a clear error, not a guess.
  auto bpe = load_tokenizer(kFixtures / "gpt2_bpe");
  try {
    bpe->encode_pair("a", "b");
    ADD_FAILURE() << "encode_pair on a BPE tokenizer did not throw";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[tokenizer] encode_pair"), std::string::npos);
  }
}

TEST(WordPiece, ExportReloadsIdentically) {
  // DS_TOKENIZER_EXPORT_DIR keeps the exports, to load them in transformers by hand.
  const char* keep = std::getenv("DS_TOKENIZER_EXPORT_DIR");
  TempDir tmp;
  const fs::path root = keep && *keep ? fs::path(keep) : tmp.path;
  for (const std::string name : kFolders) {
    auto tok = load_tokenizer(kFixtures / name);
    const fs::path out = root / name;
    fs::create_directories(out);
    ds::data::export_tokenizer(*tok, out);
    EXPECT_TRUE(fs::exists(out / "vocab.txt"));
    std::ifstream vocab(out / "vocab.txt");
    std::string line;
    for (int32_t id = 0; std::getline(vocab, line); ++id) EXPECT_EQ(line, tok->id_to_token(id));
    auto again = load_tokenizer(out);
    EXPECT_EQ(again->config().unk_id, tok->config().unk_id);
    EXPECT_EQ(again->config().cls_id, tok->config().cls_id);
    EXPECT_EQ(again->config().sep_id, tok->config().sep_id);
    EXPECT_EQ(again->config().mask_id, tok->config().mask_id);
    for (const json& c : wordpiece_cases()["tokenizers"][name]["cases"])
      EXPECT_EQ(again->encode(c["text"].get<std::string>(), true), ids_of(c["ids_with_special"]));
  }
}

TEST(WordPiece, UnsupportedFieldsAreErrorsNamingThem) {
  TempDir tmp;
  auto expect_error = [&](const std::function<void(json&)>& edit, const std::string& needle) {
    const fs::path dst = tmp.path / "edited";
    fs::create_directories(dst);
    std::ifstream in(kFixtures / "bert_wordpiece" / "tokenizer.json");
    json j = json::parse(in);
    edit(j);
    std::ofstream(dst / "tokenizer.json") << j.dump();
    const std::string msg = error_of(dst);
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("[tokenizer]", 0), 0u) << msg;
    fs::remove_all(dst);
  };
  expect_error([](json& j) { j["normalizer"]["unknown_option"] = true; },
               "normalizer.unknown_option");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Lowercase"}};
      },
      "normalizer.type 'Lowercase'");
  expect_error([](json& j) { j["normalizer"]["lowercase"] = "yes"; }, "normalizer.lowercase");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      "pre_tokenizer.type 'Whitespace'");
  expect_error([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer.type 'null'");
  expect_error([](json& j) { j["model"]["unk_token"] = "[NOPE]"; }, "model.unk_token '[NOPE]'");
  expect_error([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  expect_error([](json& j) { j["decoder"] = {{"type", "ByteLevel"}}; }, "decoder.type 'ByteLevel'");
  expect_error([](json& j) { j["decoder"]["strip"] = 1; }, "decoder.strip");
  expect_error(
      [](json& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      "post_processor.type 'RobertaProcessing'");
  expect_error([](json& j) { j["post_processor"]["pair"][3]["Sequence"]["id"] = "C"; },
               "post_processor.pair[3]");
  expect_error([](json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "[BOS]"; },
               "special token '[BOS]'");
  expect_error([](json& j) { j["added_tokens"][4]["left_strip"] = true; },
               "added_tokens[4].left_strip is not supported by the WordPiece loader");
  expect_error([](json& j) { j["added_tokens"][4]["normalized"] = 1; },
               "added_tokens[4].normalized must be true or false");
  expect_error([](json& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation is set");
  expect_error([](json& j) { j["model"]["type"] = "WordLevel"; }, "model.type 'WordLevel'");
}

TEST(WordPiece, AddedTokenFlagsMatchTokenizers) {
  // BertNormalizer lowercases: a normalized=true token ("Hello") matches "HELLO", a
  // normalized=false one ("World") only "World"; single_word on the normalized text; lstrip and
  // rstrip ([MASK] lstrip=true). Ids of the `tokenizers` library (added_token_cases.json).
  const int n = ds::test::for_each_added_token_case(
      "wordpiece_", [](const json& c, const TextTokenizer& tok) {
        for (const json& t : c["texts"]) {
          const std::string text = t["text"];
          std::vector<int32_t> ids;
          std::vector<ds::data::TokenSpan> spans;
          tok.encode(text, false, ids, &spans);
          EXPECT_EQ(ids, ids_of(t["ids"])) << c["name"] << ": '" << text << "'";
          EXPECT_EQ(tok.encode(text, true), ids_of(t["ids_with_special"])) << text;
          // Spans tile normalize(text) in order; an added token's covers the whitespace it strips.
          const std::string normalized = tok.normalize(text);
          ASSERT_EQ(spans.size(), ids.size()) << text;
          for (size_t k = 0; k < ids.size(); ++k) {
            ASSERT_LE(spans[k].end, normalized.size()) << text;
            if (k > 0) EXPECT_LE(spans[k - 1].end, spans[k].begin) << text;
          }
        }
      });
  EXPECT_EQ(n, 1);
  // normalize() keeps raw-matched tokens with their stripped spaces, and normalizes the rest.
  TempDir tmp;
  const json& c = ds::test::added_token_cases()["cases"];
  for (const json& one : c)
    if (one["name"] == "wordpiece_lower") ds::test::write_added_token_case(one, tmp.path);
  auto tok = load_tokenizer(tmp.path);
  EXPECT_EQ(tok->normalize("HeLLo  <x>  [MASK] World"), "hello  <x>  [MASK] World");
}

TEST(WordPiece, NoDecoderJoinsTokensWithSpaces) {
  // `tokenizers` without a decoder joins the tokens with " ", "##" pieces included.
  TempDir tmp;
  std::ifstream in(kFixtures / "bert_wordpiece" / "tokenizer.json");
  json j = json::parse(in);
  j["decoder"] = nullptr;
  std::ofstream(tmp.path / "tokenizer.json") << j.dump();
  auto tok = load_tokenizer(tmp.path);
  const std::vector<int32_t> ids = {tok->token_to_id("[CLS]"), tok->token_to_id("the"),
                                    tok->token_to_id("##e")};
  ASSERT_GE(ids[2], 0);
  EXPECT_EQ(tok->decode(ids), "[CLS] the ##e");
}

TEST(WordPiece, LongInputsStayFast) {
  auto tok = load_tokenizer(kFixtures / "bert_wordpiece");
  // A 300 kB word is one [UNK] (longer than max_input_chars_per_word) without being searched.
  const std::string word(300000, 'x');
  EXPECT_EQ(tok->encode(word), std::vector<int32_t>{tok->config().unk_id});
  // 1 MB of ordinary text: linear in its length.
  std::string text;
  while (text.size() < (1u << 20)) text += "The Quick, brown fox jumps over the lazy dog! ";
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_LT(seconds, 30.0);
  EXPECT_THROW(tok->decode(std::vector<int32_t>{tok->vocab_size()}), ds::Error);
}
