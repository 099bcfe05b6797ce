// WordPiece as Hugging Face `tokenizers` runs it for a BERT tokenizer.json, inside the shared
// pipeline (hf_pipeline.h: added tokens -> BertNormalizer -> BertPreTokenizer -> here ->
// TemplateProcessing / BertProcessing): greedy longest match, "##" continuations, [UNK] for a word
// that cannot be covered or is too long. Decoding is the WordPiece decoder (prefix removal, " "
// between words, cleanup).
#include <algorithm>
#include <climits>
#include <string>
#include <unordered_map>
#include <vector>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"
#include "hf_pipeline.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

constexpr std::string_view kLoader = "WordPiece";

const ModelSpec kSpec = {
    .kind = "wordpiece",
    .loader = kLoader,
    .normalizer = Normalizer::kBert,
    .pre_tokenizers = {"BertPreTokenizer"},
    .post_processors = {"TemplateProcessing", "BertProcessing"},
    .pairs_need_template = false,
    .vocab_gaps = true,
    .ignores_truncation = false,
};

class WordPieceModel final : public HfModel {
 public:
  const ModelSpec& spec() const override { return kSpec; }
  void load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
            HfVocab& vocab) override;
  void set_decoder(const ojson& j, const fs::path& file) override;
  void tokenize(const WordView& word, std::vector<int32_t>& ids,
                std::vector<TokenSpan>* spans) const override;
  std::string decode(std::span<const int32_t> ids, const HfVocab& vocab) const override;
  void save_files(const fs::path& dir, const HfVocab& vocab) const override;

 private:
  std::unordered_map<std::string, int32_t> model_vocab_;  // what WordPiece matches against
  std::string prefix_ = "##";
  int32_t unk_id_ = -1;
  size_t max_input_chars_per_word_ = 100;
  bool has_decoder_ = false;
  std::string decoder_prefix_ = "##";
  bool decoder_cleanup_ = true;
};

// ---- loading ------------------------------------------------------------------------------------

void WordPieceModel::load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
                          HfVocab& v) {
  check_keys(
      model,
      {"type", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"},
      "model", file, kLoader);
  const ojson& vocab = model.value("vocab", ojson());
  DS_CHECK(vocab.is_object() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty object token -> id", file.string());
  DS_CHECK(model.contains("unk_token") && model["unk_token"].is_string(),
           "[tokenizer] '{}': model.unk_token must be a string", file.string());
  if (model.contains("continuing_subword_prefix")) {
    DS_CHECK(model["continuing_subword_prefix"].is_string(),
             "[tokenizer] '{}': model.continuing_subword_prefix must be a string", file.string());
    prefix_ = model["continuing_subword_prefix"].get<std::string>();
  }
  if (model.contains("max_input_chars_per_word")) {
    const ojson& m = model["max_input_chars_per_word"];
    DS_CHECK(m.is_number_unsigned(),
             "[tokenizer] '{}': model.max_input_chars_per_word must be a non-negative integer",
             file.string());
    max_input_chars_per_word_ = m.get<size_t>();
  }
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    DS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
             "[tokenizer] '{}': model.vocab['{}'] is not a non-negative 32-bit id", file.string(),
             tok);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const AddedToken& a : added.tokens()) max_id = std::max(max_id, static_cast<int64_t>(a.id));
  v.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [tok, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    DS_CHECK(v.tokens[id].empty() && !tok.empty(),
             "[tokenizer] '{}': model.vocab gives id {} to both '{}' and '{}' (or to an empty "
             "token)",
             file.string(), id, v.tokens[id], tok);
    v.add_model_token(tok, id);
    model_vocab_[tok] = id;
  }
  const std::string unk = model["unk_token"];
  auto it = model_vocab_.find(unk);
  DS_CHECK(it != model_vocab_.end(),
           "[tokenizer] '{}': model.unk_token '{}' is not in model.vocab; WordPiece needs it for "
           "words it cannot split",
           file.string(), unk);
  unk_id_ = it->second;
}

void WordPieceModel::set_decoder(const ojson& j, const fs::path& file) {
  if (j.is_null()) return;
  DS_CHECK(json_type(j) == "WordPiece",
           "[tokenizer] '{}': decoder.type '{}' is not supported by the WordPiece loader "
           "(supported: none, WordPiece)",
           file.string(), json_type(j));
  check_keys(j, {"type", "prefix", "cleanup"}, "decoder", file, kLoader);
  has_decoder_ = true;
  if (j.contains("prefix")) {
    DS_CHECK(j["prefix"].is_string(), "[tokenizer] '{}': decoder.prefix must be a string",
             file.string());
    decoder_prefix_ = j["prefix"].get<std::string>();
  }
  decoder_cleanup_ = json_bool(j, "cleanup", true, "decoder", file);
}

// ---- encoding -----------------------------------------------------------------------------------

void WordPieceModel::tokenize(const WordView& w, std::vector<int32_t>& ids,
                              std::vector<TokenSpan>* spans) const {
  const std::string_view word = w.text;
  size_t chars = 0;
  for (size_t i = 0; i < word.size(); i += utf8_decode(word, i).len) ++chars;
  const size_t first = ids.size(), first_span = spans ? spans->size() : 0;
  bool bad = chars > max_input_chars_per_word_;
  // Greedy longest match from the left; a continuation is looked up with the prefix. Shrinking by
  // whole UTF-8 characters keeps every candidate valid text.
  std::string candidate;
  for (size_t start = 0; !bad && start < word.size();) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(word.substr(start, end - start));
      if (auto it = model_vocab_.find(candidate); it != model_vocab_.end()) {
        found = it->second;
        break;
      }
      do --end;
      while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {
      bad = true;
      break;
    }
    ids.push_back(found);
    if (spans) spans->push_back(w.span(start, end));
    start = end;
  }
  if (bad) {  // the whole word is [UNK]
    ids.resize(first);
    ids.push_back(unk_id_);
    if (spans) {
      spans->resize(first_span);
      spans->push_back(w.span(0, word.size()));
    }
  }
}

// ---- decoding -----------------------------------------------------------------------------------

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The WordPiece decoder's cleanup, applied to each token in this order.
void cleanup(std::string& s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) replace_all(s, from, to);
}

std::string WordPieceModel::decode(std::span<const int32_t> ids, const HfVocab& vocab) const {
  if (!has_decoder_) return join_tokens(ids, vocab);
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& tok = vocab.tokens[ids[k]];
    std::string piece;
    if (k == 0) {
      piece = tok;
    } else if (tok.starts_with(decoder_prefix_)) {
      piece = tok.substr(decoder_prefix_.size());
    } else {
      piece = " " + tok;
    }
    if (decoder_cleanup_) cleanup(piece);
    out += piece;
  }
  return out;
}

void WordPieceModel::save_files(const fs::path& dir, const HfVocab& vocab) const {
  // vocab.txt (one token per line, line = id) for BertTokenizer and tools that predate
  // tokenizer.json; ids not in model.vocab are added tokens, kept in tokenizer.json.
  std::string text;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (!vocab.in_model[id]) break;  // vocab.txt cannot express a gap
    text += vocab.tokens[id] + "\n";
  }
  write_text_file(dir / "vocab.txt", text);
}

}  // namespace

std::unique_ptr<HfModel> make_wordpiece_model() {
  return std::make_unique<WordPieceModel>();
}

}  // namespace ds::data::detail
