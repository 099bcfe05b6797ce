// load_tokenizer: which files a Hugging Face folder holds, and what tokenizer_config.json says.
#include "ds/data/text_tokenizer.h"

#include <fstream>
#include <sstream>

#include "ds/core/error.h"
#include "hf_tokenizer_internal.h"

namespace ds::data {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace detail {

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), "[tokenizer] cannot open '{}'", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

ojson read_json_file(const fs::path& path) {
  return parse_json(read_text_file(path), path);
}

ojson parse_json(std::string_view text, const fs::path& path) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[tokenizer] '{}' is not valid JSON: {}", path.string(), e.what());
  }
}

void write_text_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  DS_CHECK(out.good(), "[tokenizer] cannot write '{}'", path.string());
}

void resolve_special_ids(const TextTokenizer& tok, TokenizerConfig& config,
                         const fs::path& source) {
  auto resolve = [&](const std::string& name, int32_t& id, const char* field) {
    if (name.empty()) return;
    id = tok.token_to_id(name);
    DS_CHECK(id >= 0,
             "[tokenizer] {} '{}' (from tokenizer_config.json next to '{}') is not in the "
             "vocabulary",
             field, name, source.string());
  };
  resolve(config.bos_token, config.bos_id, "bos_token");
  resolve(config.eos_token, config.eos_id, "eos_token");
  resolve(config.pad_token, config.pad_id, "pad_token");
  resolve(config.unk_token, config.unk_id, "unk_token");
  resolve(config.cls_token, config.cls_id, "cls_token");
  resolve(config.sep_token, config.sep_id, "sep_token");
  resolve(config.mask_token, config.mask_id, "mask_token");
}

}  // namespace detail

namespace {

// tokenizer_config.json (optional) and chat_template.jinja (transformers 5 writes the template
// there instead).
TokenizerConfig read_config(const fs::path& folder, bool sentencepiece) {
  TokenizerConfig c;
  c.add_bos_token = sentencepiece;  // LlamaTokenizer's default
  const fs::path file = folder / "tokenizer_config.json";
  if (fs::exists(file)) {
    const ojson j = detail::read_json_file(file);
    DS_CHECK(j.is_object(), "[tokenizer] '{}' must be a JSON object", file.string());
    // A token is a string or, in older files, {"content": ..., "__type": "AddedToken"}.
    auto token = [&](const char* key) -> std::string {
      if (!j.contains(key) || j[key].is_null()) return {};
      const ojson& v = j[key];
      if (v.is_string()) return v.get<std::string>();
      DS_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(),
               "[tokenizer] '{}': {} must be a string or an object with 'content'", file.string(),
               key);
      return v["content"].get<std::string>();
    };
    c.bos_token = token("bos_token");
    c.eos_token = token("eos_token");
    c.pad_token = token("pad_token");
    c.unk_token = token("unk_token");
    c.cls_token = token("cls_token");
    c.sep_token = token("sep_token");
    c.mask_token = token("mask_token");
    if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean())
      c.add_bos_token = j["add_bos_token"];
    if (j.contains("add_eos_token") && j["add_eos_token"].is_boolean())
      c.add_eos_token = j["add_eos_token"];
    if (j.contains("model_max_length") && j["model_max_length"].is_number()) {
      const double m = j["model_max_length"].get<double>();  // HF writes 1e30 for "no limit"
      c.model_max_length = m > 0 && m < 1e15 ? static_cast<int64_t>(m) : 0;
    }
    if (j.contains("chat_template")) {
      const ojson& t = j["chat_template"];
      if (t.is_string()) {
        c.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{name, template}, ...]: the one named "default"
        for (const auto& e : t)
          if (e.value("name", std::string()) == "default")
            c.chat_template = e.value("template", std::string());
        DS_CHECK(!c.chat_template.empty(),
                 "[tokenizer] '{}': chat_template is a list without a 'default' entry",
                 file.string());
      }
    }
  }
  if (fs::exists(folder / "chat_template.jinja"))
    c.chat_template = detail::read_text_file(folder / "chat_template.jinja");
  return c;
}

}  // namespace

PairEncoding TextTokenizer::encode_pair(std::string_view, std::string_view, bool) const {
  DS_THROW(
      "[tokenizer] encode_pair: this {} tokenizer has no pair template; encode the two texts "
      "separately and join them as the model expects",
      kind());
}

PairEncoding TextTokenizer::post_process(std::span<const int32_t>,
                                         const std::span<const int32_t>*) const {
  DS_THROW(
      "[tokenizer] post_process: this {} tokenizer has no pair template; sentence-pair "
      "classification needs a tokenizer.json whose post_processor is TemplateProcessing or "
      "BertProcessing (BERT's WordPiece)",
      kind());
}

bool has_tokenizer_files(const fs::path& dir) {
  std::error_code ec;
  auto has = [&](const char* name) { return fs::exists(dir / name, ec); };
  return has("tokenizer.json") || has("spm.model") || has("tokenizer.model") ||
         (has("vocab.json") && has("merges.txt")) || (has("encoder.json") && has("vocab.bpe"));
}

std::unique_ptr<TextTokenizer> load_tokenizer(const fs::path& folder) {
  DS_CHECK(fs::is_directory(folder), "[tokenizer] '{}' is not a folder", folder.string());
  if (fs::exists(folder / "tokenizer.json"))
    return detail::load_tokenizer_json(folder / "tokenizer.json", read_config(folder, false));
  if (fs::exists(folder / "spm.model"))  // DeBERTa-v2/v3 as the hub ships it
    return detail::load_deberta_spm(folder / "spm.model", read_config(folder, false));
  if (fs::exists(folder / "tokenizer.model"))
    return detail::load_sentencepiece(folder / "tokenizer.model", read_config(folder, true));
  for (auto [vocab, merges] :
       {std::pair{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}})
    if (fs::exists(folder / vocab) && fs::exists(folder / merges))
      return detail::load_bpe_vocab_merges(folder / vocab, folder / merges,
                                           read_config(folder, false));
  DS_THROW(
      "[tokenizer] '{}' holds no tokenizer: looked for tokenizer.json, spm.model, tokenizer.model, "
      "vocab.json + merges.txt and encoder.json + vocab.bpe",
      folder.string());
}

}  // namespace ds::data
