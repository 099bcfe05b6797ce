// Hugging Face tokenizers (text_tokenizer.h, tokenizer_export.h) against ids that transformers 5 /
// tokenizers / sentencepiece gave for the same folders (tests/fixtures/tokenizers, written by
// tests/fixtures/generators/gen_hf_tokenizer_fixtures.py). The real GPT-2 vocabulary comes from scripts/fetch_data.sh.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "added_token_cases.h"
#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer_export.h"
#include "ds/data/unicode.h"

namespace fs = std::filesystem;
using ds::data::load_tokenizer;
using ds::data::TextTokenizer;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "tokenizers";

const json& cases() {
  static const json j = [] {
    std::ifstream in(kFixtures / "cases.json");
    EXPECT_TRUE(in.good()) << "missing " << kFixtures / "cases.json";
    return json::parse(in);
  }();
  return j;
}

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

// A scratch folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           fmt::format("ds_test_hf_tok_{}_{}", getpid(), reinterpret_cast<uintptr_t>(this));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Every case of a fixture folder: ids without and with special tokens, decode, spans.
void check_folder(const TextTokenizer& tok, const std::string& name, bool nfc) {
  const json& f = cases()["tokenizers"][name];
  const json& info = f["info"];
  if (info.contains("vocab_size"))
    EXPECT_EQ(tok.vocab_size(), info["vocab_size"].get<int>()) << name;
  for (const char* key : {"bos", "eos", "pad"}) {
    if (!info.contains(key)) continue;
    const int32_t want = info[key].is_null() ? -1 : info[key].get<int32_t>();
    const auto& c = tok.config();
    const int32_t got = std::string(key) == "bos"   ? c.bos_id
                        : std::string(key) == "eos" ? c.eos_id
                                                    : c.pad_id;
    EXPECT_EQ(got, want) << name << " " << key;
  }
  for (const json& c : f["cases"]) {
    const std::string text = c["text"];
    std::vector<int32_t> ids;
    std::vector<ds::data::TokenSpan> spans;
    tok.encode(text, false, ids, &spans);
    EXPECT_EQ(ids, ids_of(c["ids"])) << name << ": " << text;
    if (c.contains("ids_with_special"))
      EXPECT_EQ(tok.encode(text, true), ids_of(c["ids_with_special"])) << name << ": " << text;
    if (c.contains("decoded")) EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << name;
    ASSERT_EQ(spans.size(), ids.size());
    if (!nfc) {  // spans tile the text
      std::string joined;
      for (const auto& s : spans) joined += text.substr(s.begin, s.end - s.begin);
      EXPECT_EQ(joined, text) << name;
    }
  }
}

const fs::path& gpt2_dir() {
  static const fs::path dir = [] {
    const char* env = std::getenv("DS_CACHE_DIR");
    const fs::path c = (env && *env) ? fs::path(env) : fs::path(DS_SOURCE_DIR) / ".cache" / "data";
    if (!fs::exists(c / "gpt2" / "vocab.bpe"))
      (void)std::system(fmt::format("'{}/scripts/fetch_data.sh' 1>&2", DS_SOURCE_DIR).c_str());
    return c / "gpt2";
  }();
  return dir;
}

// Copy a fixture folder, letting edit change its tokenizer.json.
fs::path edited_copy(const TempDir& tmp, const std::string& name,
                     const std::function<void(json&)>& edit) {
  const fs::path dst = tmp.path / name;
  fs::create_directories(dst);
  std::ifstream in(kFixtures / name / "tokenizer.json");
  json j = json::parse(in);
  edit(j);
  std::ofstream(dst / "tokenizer.json") << j.dump();
  return dst;
}

std::string error_of(const fs::path& folder) {
  try {
    load_tokenizer(folder);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(HfTokenizer, Gpt2StyleTokenizerJsonWithLegacyMerges) {
  auto tok = load_tokenizer(kFixtures / "gpt2_bpe");
  EXPECT_EQ(tok->kind(), "bpe");
  check_folder(*tok, "gpt2_bpe", false);
}

TEST(HfTokenizer, VocabJsonMergesTxtPair) {
  auto tok = load_tokenizer(kFixtures / "gpt2_bpe" / "vocab_merges");
  check_folder(*tok, "gpt2_bpe/vocab_merges", false);
}

TEST(HfTokenizer, Llama3SplitIgnoreMergesAndBos) {
  auto tok = load_tokenizer(kFixtures / "llama3_bpe");
  check_folder(*tok, "llama3_bpe", false);
  EXPECT_EQ(tok->encode("Hi", true).front(), tok->config().bos_id);
  EXPECT_TRUE(tok->is_special(tok->token_to_id("<|eot_id|>")));
  EXPECT_EQ(tok->decode(tok->encode("<|eot_id|>Hi"), /*skip_special_tokens=*/true), "Hi");
}

TEST(HfTokenizer, Qwen2SplitAndNfc) {
  auto tok = load_tokenizer(kFixtures / "qwen2_bpe");
  check_folder(*tok, "qwen2_bpe", true);
  EXPECT_EQ(tok->normalize("e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> U+00E9
}

TEST(HfTokenizer, SentencePiece) {
  auto tok = load_tokenizer(kFixtures / "spm");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  const json& f = cases()["tokenizers"]["spm"];
  EXPECT_EQ(tok->config().bos_id, 1);
  EXPECT_EQ(tok->config().eos_id, 2);
  EXPECT_EQ(tok->config().unk_id, 0);
  const json& sp_ids = f["sentencepiece_ids"];
  for (size_t k = 0; k < f["cases"].size(); ++k) {
    const json& c = f["cases"][k];
    const std::string text = c["text"];
    const std::vector<int32_t> ids = tok->encode(text);
    // The sentencepiece library itself: always.
    EXPECT_EQ(ids, ids_of(sp_ids[k])) << text;
    std::vector<int32_t> with = ids;
    with.insert(with.begin(), 1);
    EXPECT_EQ(tok->encode(text, true), with) << text;
    // transformers' LlamaTokenizer: the same except where its Metaspace pre-tokenizer differs from
    // sentencepiece (text starting with whitespace) or it matches special tokens inside the text.
    const bool hf_differs = (!text.empty() && (text[0] == ' ' || text[0] == '\n')) ||
                            text.find("<s>") != std::string::npos ||
                            text.find("</s>") != std::string::npos;
    if (!hf_differs) {
      EXPECT_EQ(ids, ids_of(c["ids"])) << text;
      EXPECT_EQ(tok->decode(ids), c["decoded"].get<std::string>()) << text;
    }
  }
}

TEST(HfTokenizer, RealGpt2Vocabulary) {
  ASSERT_TRUE(fs::exists(gpt2_dir() / "encoder.json"))
      << "GPT-2 files missing in " << gpt2_dir() << "; run scripts/fetch_data.sh";
  auto tok = load_tokenizer(gpt2_dir());  // encoder.json + vocab.bpe
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->config().eos_id, 50256);
  for (const json& c : cases()["tokenizers"]["gpt2_real"]["cases"])
    EXPECT_EQ(tok->encode(c["text"].get<std::string>()), ids_of(c["ids"])) << c["text"];
}

TEST(HfTokenizer, ExportReloadsIdentically) {
  // DS_TOKENIZER_EXPORT_DIR keeps the exports for tests/fixtures/generators/check_tokenizer_export.py.
  const char* keep = std::getenv("DS_TOKENIZER_EXPORT_DIR");
  TempDir tmp;
  const fs::path root = keep && *keep ? fs::path(keep) : tmp.path;
  for (const std::string name :
       {"gpt2_bpe", "gpt2_bpe/vocab_merges", "llama3_bpe", "qwen2_bpe", "spm"}) {
    auto tok = load_tokenizer(kFixtures / name);
    const fs::path out = root / (name == "gpt2_bpe/vocab_merges" ? "vocab_merges" : name);
    fs::create_directories(out);
    ds::data::export_tokenizer(*tok, out);
    EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
    std::ifstream cin(out / "tokenizer_config.json");
    const json cfg = json::parse(cin);
    EXPECT_EQ(cfg["tokenizer_class"],
              tok->kind() == "bpe" ? "PreTrainedTokenizerFast" : "LlamaTokenizer");
    auto again = load_tokenizer(out);
    EXPECT_EQ(again->config().bos_id, tok->config().bos_id) << name;
    EXPECT_EQ(again->config().eos_id, tok->config().eos_id) << name;
    EXPECT_EQ(again->config().chat_template, tok->config().chat_template) << name;
    for (const json& c : cases()["tokenizers"][name]["cases"]) {
      const std::string text = c["text"];
      EXPECT_EQ(again->encode(text, true), tok->encode(text, true)) << name << ": " << text;
    }
    if (tok->kind() == "bpe") {  // the file pair written beside tokenizer.json loads alone too
      const fs::path pair = tmp.path / "pair";
      fs::create_directories(pair);
      fs::copy_file(out / "vocab.json", pair / "vocab.json", fs::copy_options::overwrite_existing);
      fs::copy_file(out / "merges.txt", pair / "merges.txt", fs::copy_options::overwrite_existing);
      if (name.starts_with("gpt2")) {  // GPT-2's regex is the only one a file pair implies
        auto from_pair = load_tokenizer(pair);
        for (const json& c : cases()["tokenizers"][name]["cases"])
          EXPECT_EQ(from_pair->encode(c["text"].get<std::string>()), ids_of(c["ids"])) << name;
      }
    }
  }
  // The real GPT-2 files (what ds_prepare trains on) export as tokenizer.json too.
  if (fs::exists(gpt2_dir() / "encoder.json")) {
    auto tok = load_tokenizer(gpt2_dir());
    const fs::path out = root / "gpt2_real";
    fs::create_directories(out);
    ds::data::export_tokenizer(*tok, out);
    auto again = load_tokenizer(out);
    EXPECT_EQ(again->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
    EXPECT_EQ(again->config().eos_id, 50256);
  }
}

TEST(HfTokenizer, UnsupportedFieldsAreErrorsNamingThem) {
  TempDir tmp;
  auto expect_error = [&](const std::string& fixture, const std::function<void(json&)>& edit,
                          const std::string& needle) {
    const std::string msg = error_of(edited_copy(tmp, fixture, edit));
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
    fs::remove_all(tmp.path / fixture);
  };
  expect_error(
      "gpt2_bpe", [](json& j) { j["model"]["type"] = "WordLevel"; }, "model.type 'WordLevel'");
  expect_error(
      "gpt2_bpe",
      [](json& j) {
        j["normalizer"] = {{"type", "Lowercase"}};
      },
      "normalizer.type 'Lowercase'");
  expect_error(
      "gpt2_bpe",
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      "pre_tokenizer.type 'Whitespace'");
  expect_error(
      "llama3_bpe",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
      "pre_tokenizer.pretokenizers[0].pattern.Regex");
  expect_error(
      "llama3_bpe", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
      "behavior 'Isolated'");
  expect_error(
      "gpt2_bpe", [](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback");
  expect_error(
      "gpt2_bpe",
      [](json& j) {
        j["decoder"] = {{"type", "Metaspace"}};
      },
      "decoder.type 'Metaspace'");
  expect_error(
      "gpt2_bpe",
      [](json& j) {
        j["post_processor"] = {{"type", "BertProcessing"}};
      },
      "post_processor.type 'BertProcessing'");
  expect_error(
      "gpt2_bpe", [](json& j) { j["model"]["merges"].push_back("Ġ zzzzq"); }, "merge");
  // An added-token option we do not know is refused, not ignored (`tokenizers` ignores it).
  expect_error(
      "gpt2_bpe", [](json& j) { j["added_tokens"][0]["strip_all"] = true; },
      "added_tokens[0].strip_all is not supported by the BPE loader (supported keys: id, content, "
      "single_word, lstrip, rstrip, normalized, special)");
  expect_error(
      "gpt2_bpe", [](json& j) { j["added_tokens"][0]["lstrip"] = "yes"; },
      "added_tokens[0].lstrip must be true or false");
  // A named special token missing from the vocabulary.
  const fs::path f = edited_copy(tmp, "qwen2_bpe", [](json&) {});
  std::ofstream(f / "tokenizer_config.json") << R"({"eos_token": "<|nope|>"})";
  EXPECT_NE(error_of(f).find("eos_token '<|nope|>'"), std::string::npos) << error_of(f);
  EXPECT_NE(error_of(tmp.path / "empty_missing").find("is not a folder"), std::string::npos);
  fs::create_directories(tmp.path / "empty");
  EXPECT_NE(error_of(tmp.path / "empty").find("looked for tokenizer.json"), std::string::npos);
}

TEST(HfTokenizer, AddedTokenFlagsMatchTokenizers) {
  // lstrip (BlenderBot's <mask>), rstrip, single_word and normalized on byte-level BPE: the ids of
  // the `tokenizers` library (added_token_cases.json, tests/fixtures/generators/gen_added_token_fixtures.py).
  const int n =
      ds::test::for_each_added_token_case("bpe_", [](const json& c, const TextTokenizer& tok) {
        const std::string name = c["name"];
        for (const json& t : c["texts"]) {
          const std::string text = t["text"];
          std::vector<int32_t> ids;
          std::vector<ds::data::TokenSpan> spans;
          tok.encode(text, false, ids, &spans);
          EXPECT_EQ(ids, ids_of(t["ids"])) << name << ": '" << text << "'";
          EXPECT_EQ(tok.encode(text, true), ids_of(t["ids_with_special"])) << name << ": '" << text;
          ASSERT_EQ(spans.size(), ids.size()) << name << ": '" << text << "'";
          // An added token's span covers the whitespace it strips, as its offsets there (the other
          // cases' ByteLevel post-processor trims offsets; ours are untrimmed).
          if (name != "bpe_blenderbot") continue;
          for (size_t k = 0; k < ids.size(); ++k)
            if (ids[k] >= 700)
              EXPECT_EQ((std::vector<uint32_t>{spans[k].begin, spans[k].end}),
                        t["offsets"][k].get<std::vector<uint32_t>>())
                  << name << ": '" << text << "' token " << k;
        }
      });
  EXPECT_EQ(n, 3);
}

TEST(HfTokenizer, AddedTokenFlagsSurviveExport) {
  // Every kind: the exported tokenizer.json keeps the flags as read and encodes the same.
  TempDir tmp;
  for (const json& c : ds::test::added_token_cases()["cases"]) {
    const std::string name = c["name"];
    const json written = ds::test::write_added_token_case(c, tmp.path / name / "in");
    auto tok = load_tokenizer(tmp.path / name / "in");
    fs::create_directories(tmp.path / name / "out");
    ds::data::export_tokenizer(*tok, tmp.path / name / "out");
    std::ifstream in(tmp.path / name / "out" / "tokenizer.json");
    EXPECT_EQ(json::parse(in)["added_tokens"], written["added_tokens"]) << name;
    auto again = load_tokenizer(tmp.path / name / "out");
    for (const json& t : c["texts"])
      EXPECT_EQ(again->encode(t["text"].get<std::string>(), true), ids_of(t["ids_with_special"]))
          << name << ": '" << t["text"].get<std::string>() << "'";
  }
}

TEST(HfTokenizer, OnigurumaUnicodeClasses) {
  // HF tokenizers' regex engine predates Unicode 17: its letters U+11DB0.. are "other" there.
  using ds::data::CharClass;
  EXPECT_EQ(ds::data::classify(0x11DB0), CharClass::kLetter);
  EXPECT_EQ(ds::data::classify_onig(0x11DB0), CharClass::kOther);
  for (char32_t cp : {U'a', U'é', U'你', U'٣', U'\u3000', U'!'})
    EXPECT_EQ(ds::data::classify_onig(cp), ds::data::classify(cp));
}

TEST(HfTokenizer, LongWordsAreNotQuadratic) {
  // One pre-token of 300 kB (a letter run, then a whitespace run): BPE must stay O(n log n).
  auto tok = load_tokenizer(kFixtures / "llama3_bpe");
  std::string text(300000, 'e');
  for (size_t i = 0; i < text.size(); i += 7) text[i] = 't';
  text += std::string(300000, ' ') + "x";
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_LT(seconds, 30.0) << "(quadratic BPE takes hours here)";
}
