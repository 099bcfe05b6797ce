// The tokenizer.json pipeline every model shares (hf_pipeline.h), and load_tokenizer_json.
#include "hf_pipeline.h"

#include <climits>

#include "ds/core/error.h"
#include "hf_json.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

void HfVocab::resize(size_t n) {
  tokens.resize(n);
  in_model.resize(n, 0);
  special.resize(n, 0);
  present.resize(n, 0);
}

void HfVocab::add_model_token(const std::string& token, int32_t id) {
  tokens[id] = token;
  in_model[id] = present[id] = 1;
  by_token[token] = id;
}

std::string join_tokens(std::span<const int32_t> ids, const HfVocab& vocab) {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ' ';
    out += vocab.tokens[ids[k]];
  }
  return out;
}

// ---- loading ------------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(std::unique_ptr<HfModel> model, const fs::path& file,
                         std::string json_text, const ojson& j, const TokenizerConfig& config)
    : model_(std::move(model)) {
  const ModelSpec& spec = model_->spec();
  check_keys(j,
             {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
              "model", "post_processor", "decoder"},
             "(top level)", file, spec.loader);
  for (const char* key : {"truncation", "padding"})
    DS_CHECK(spec.ignores_truncation || !j.contains(key) || j[key].is_null(),
             "[tokenizer] '{}': {} is set; truncation and padding belong to the data pipeline "
             "here, set {} to null",
             file.string(), key, key);
  added_ = AddedVocabulary(j.value("added_tokens", ojson::array()), file, spec.loader);
  model_->load(j["model"], added_, file, vocab_);
  set_added_tokens(file);
  model_->link(j["model"], vocab_, file);
  normalizer_ = Normalizer(j.value("normalizer", ojson()), spec.normalizer, file, spec.loader);
  added_.set_normalizer(file, [this](std::string_view s) { return normalizer_.text(s); });
  pre_tokenizer_ =
      PreTokenizer(j.value("pre_tokenizer", ojson()), spec.pre_tokenizers, file, spec.loader);
  model_->check(pre_tokenizer_, file);
  template_ = parse_post_processor(j.value("post_processor", ojson()), vocab_size(), file,
                                   spec.loader, spec.post_processors);
  model_->set_decoder(j.value("decoder", ojson()), file);
  config_ = config;
  resolve_special_ids(*this, config_, file);
  json_text_ = std::move(json_text);
}

void HfTokenizer::set_added_tokens(const fs::path& file) {
  for (const AddedToken& a : added_.tokens()) {
    DS_CHECK(!vocab_.in_model[a.id] || vocab_.tokens[a.id] == a.content,
             "[tokenizer] '{}': added token '{}' has id {}, which model.vocab gives to '{}'",
             file.string(), a.content, a.id, vocab_.tokens[a.id]);
    vocab_.tokens[a.id] = a.content;
    vocab_.by_token[a.content] = a.id;
    vocab_.special[a.id] = a.special ? 1 : 0;
    vocab_.present[a.id] = 1;
  }
  if (model_->spec().vocab_gaps) return;
  for (size_t id = 0; id < vocab_.present.size(); ++id)
    DS_CHECK(vocab_.present[id],
             "[tokenizer] '{}': id {} is neither in model.vocab nor an added token", file.string(),
             id);
}

// ---- vocabulary ---------------------------------------------------------------------------------

int32_t HfTokenizer::checked(int32_t id) const {
  DS_CHECK(id >= 0 && id < vocab_size() && vocab_.present[id],
           "[tokenizer] token id {} is not in the vocabulary (size {})", id, vocab_size());
  return id;
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  auto it = vocab_.by_token.find(std::string(token));
  return it == vocab_.by_token.end() ? -1 : it->second;
}

// ---- encoding -----------------------------------------------------------------------------------

void HfTokenizer::encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                                  std::vector<TokenSpan>* spans) const {
  DS_CHECK(text.size() < UINT32_MAX / 4,
           "[tokenizer] text of {} bytes is too long to encode at once", text.size());
  auto added = [&](const AddedToken& a, TokenSpan s) {
    ids.push_back(a.id);
    if (spans) spans->push_back(s);
  };
  auto word = [&](const WordView& w) { model_->tokenize(w, ids, spans); };
  // Spans: input offsets, or (BertNormalizer) offsets into the normalized text, where out is the
  // normalized length so far (hf_normalizer.h).
  const bool input = normalizer_.input_offsets();
  uint32_t out = 0;
  std::vector<AddedSplit> raw, norm;
  added_.split(text, AddedVocabulary::kRaw, raw);
  for (const AddedSplit& p : raw) {
    const auto begin = static_cast<uint32_t>(p.begin), len = static_cast<uint32_t>(p.end - p.begin);
    if (p.token) {
      added(*p.token, input ? TokenSpan{begin, begin + len} : TokenSpan{out, out + len});
      out += len;
      continue;
    }
    const NormalizedText t = normalizer_.run(text.substr(p.begin, len), begin, out);
    added_.split(t.text, AddedVocabulary::kNormalized, norm);
    for (const AddedSplit& q : norm) {
      if (q.token) {
        added(*q.token, t.span(q.begin, q.end));
      } else {
        pre_tokenizer_.run(WordView::of(t, q.begin, q.end), word);
      }
    }
    out += static_cast<uint32_t>(t.text.size());
  }
}

void HfTokenizer::encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
                         std::vector<TokenSpan>* spans) const {
  auto sequence = [&](std::vector<int32_t>& out, std::vector<TokenSpan>* sp) {
    encode_sequence(text, out, sp);
  };
  if (!add_special_tokens)
    sequence(ids, spans);
  else
    template_.encode_single(sequence, ids, spans);
}

PairEncoding HfTokenizer::encode_pair(std::string_view a, std::string_view b,
                                      bool add_special_tokens) const {
  if (!has_pairs()) return TextTokenizer::encode_pair(a, b, add_special_tokens);  // throws
  std::vector<int32_t> ids_a, ids_b;
  encode_sequence(a, ids_a, nullptr);
  encode_sequence(b, ids_b, nullptr);
  const std::span<const int32_t> sb(ids_b);
  return template_.apply(ids_a, &sb, add_special_tokens);
}

PairEncoding HfTokenizer::post_process(std::span<const int32_t> a,
                                       const std::span<const int32_t>* b) const {
  if (b && !has_pairs()) return TextTokenizer::post_process(a, b);  // throws
  return template_.apply(a, b);
}

std::string HfTokenizer::normalize(std::string_view text) const {
  // Added tokens as they stand in the text (normalized=true ones: as normalized).
  std::string out;
  std::vector<AddedSplit> raw;
  added_.split(text, AddedVocabulary::kRaw, raw);
  for (const AddedSplit& p : raw) {
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    out += p.token ? std::string(piece) : normalizer_.text(piece);
  }
  return out;
}

// ---- decoding and saving ------------------------------------------------------------------------

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (!(vocab_.special[checked(id)] && skip_special_tokens)) kept.push_back(id);
  return model_->decode(kept, vocab_);
}

void HfTokenizer::save_model_files(const fs::path& dir) const {
  write_text_file(dir / "tokenizer.json", json_text_);
  model_->save_files(dir, vocab_);
}

std::unique_ptr<TextTokenizer> load_tokenizer_json(const fs::path& file, std::string json_text,
                                                   const ojson& j, const TokenizerConfig& config) {
  DS_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
           "[tokenizer] '{}' has no 'model' object; is it a Hugging Face tokenizer.json?",
           file.string());
  const std::string type = json_type(j["model"]);
  std::unique_ptr<HfModel> model;
  if (type == "BPE") {
    model = make_bpe_model();
  } else if (type == "WordPiece") {
    model = make_wordpiece_model();
  } else {
    DS_CHECK(type == "Unigram",
             "[tokenizer] '{}': model.type '{}' is not supported; tokenizer.json files with a "
             "byte-level BPE, a WordPiece or a Unigram model are (SentencePiece models load from "
             "tokenizer.model)",
             file.string(), type);
    model = make_unigram_model();
  }
  return std::make_unique<HfTokenizer>(std::move(model), file, std::move(json_text), j, config);
}

std::unique_ptr<TextTokenizer> load_tokenizer_json(const fs::path& file,
                                                   const TokenizerConfig& config) {
  std::string text = read_text_file(file);
  const ojson j = parse_json(text, file);
  return load_tokenizer_json(file, std::move(text), j, config);
}

}  // namespace ds::data::detail
