// Unigram tokenizer.json (DeBERTa-v2, T5 with a Precompiled normalizer, and a byte-fallback
// variant) against the ids, offsets, decodes and pair encodings that Hugging Face `tokenizers` gave
// for the same folders (tests/fixtures/tokenizers/{deberta_unigram,t5_unigram,
// unigram_bytefallback}, unigram_cases.json, written by tools/gen_unigram_fixtures.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer_export.h"

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
