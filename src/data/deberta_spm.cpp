// DeBERTa-v2/v3 folders as the hub ships them: spm.model (a SentencePiece unigram model) and a
// tokenizer_config.json, no tokenizer.json. The pipeline is built exactly as transformers 5's
// DebertaV2Tokenizer builds it (Lowercase if do_lower_case, Replace(\s{2,}|[\n\r\t] -> " "), NFC,
// Strip(right); Metaspace(always, or first without add_prefix_space); Unigram over the model's
// pieces and scores; [CLS] $A [SEP] / [CLS] $A [SEP] $B [SEP]; Metaspace decoder), then loaded by
// the Unigram loader; export writes that tokenizer.json.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

// DebertaV2Tokenizer's options, from tokenizer_config.json next to spm.model.
struct SpmOptions {
  bool lower = false, prefix_space = true;
};

SpmOptions read_options(const fs::path& cfg_file) {
  SpmOptions o;
  bool split_by_punct = false;
  if (fs::exists(cfg_file)) {
    const ojson j = read_json_file(cfg_file);
    auto flag = [&](const char* key, bool& out) {
      if (!j.contains(key) || j[key].is_null()) return;
      DS_CHECK(j[key].is_boolean(), "[tokenizer] '{}': {} must be true or false", cfg_file.string(),
               key);
      out = j[key].get<bool>();
    };
    flag("do_lower_case", o.lower);
    flag("split_by_punct", split_by_punct);
    flag("add_prefix_space", o.prefix_space);
  }
  DS_CHECK(!split_by_punct,
           "[tokenizer] '{}': split_by_punct=true (a Punctuation pre-tokenizer) is not supported; "
           "set it to false or convert the folder with transformers "
           "(DebertaV2Tokenizer.from_pretrained(dir).save_pretrained(dir) writes tokenizer.json)",
           cfg_file.string());
  return o;
}

// DebertaV2Tokenizer's default token names for those the config leaves empty.
void default_token_names(TokenizerConfig& config) {
  auto or_default = [](std::string& name, const char* fallback) {
    if (name.empty()) name = fallback;
  };
  or_default(config.bos_token, "[CLS]");
  or_default(config.eos_token, "[SEP]");
  or_default(config.unk_token, "[UNK]");
  or_default(config.sep_token, "[SEP]");
  or_default(config.pad_token, "[PAD]");
  or_default(config.cls_token, "[CLS]");
  or_default(config.mask_token, "[MASK]");
}

// The special tokens as tokenizer.json's added_tokens, and their ids: pieces of the model, or
// (DeBERTa-v3's [MASK]) tokens added after it, with the ids added_tokens.json gives; without that
// file a single missing token takes the next id, as transformers appends it.
ojson special_tokens(const sentencepiece::SentencePieceProcessor& sp, const fs::path& file,
                     const TokenizerConfig& config, std::map<std::string, int>& ids) {
  const fs::path added_file = file.parent_path() / "added_tokens.json";
  ojson extra = ojson::object();
  if (fs::exists(added_file)) {
    extra = read_json_file(added_file);
    DS_CHECK(extra.is_object(), "[tokenizer] '{}' must be an object token -> id",
             added_file.string());
  }
  const int n = sp.GetPieceSize();
  int next_id = n;
  for (const auto& [tok, id] : extra.items()) {
    DS_CHECK(id.is_number_integer() && id.get<int64_t>() >= n && id.get<int64_t>() < n + 1000,
             "[tokenizer] '{}': id of '{}' must follow the model's {} pieces", added_file.string(),
             tok, n);
    next_id = std::max(next_id, id.get<int>() + 1);
  }
  std::vector<std::string> missing;
  ojson added = ojson::array();
  for (const std::string* name :
       {&config.pad_token, &config.unk_token, &config.cls_token, &config.sep_token,
        &config.mask_token, &config.bos_token, &config.eos_token}) {
    if (ids.count(*name)) continue;
    int id = sp.PieceToId(*name);
    if (id < 0 || id >= n || sp.IdToPiece(id) != *name) {
      if (extra.contains(*name)) {
        id = extra[*name].get<int>();
      } else {
        missing.push_back(*name);
        id = next_id++;
      }
    }
    ids[*name] = id;
    added.push_back({{"id", id},
                     {"content", *name},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  DS_CHECK(missing.size() <= 1,
           "[tokenizer] '{}': the special tokens {} are not pieces of the model and "
           "added_tokens.json does not give their ids; convert the folder with transformers "
           "(DebertaV2Tokenizer.from_pretrained(dir).save_pretrained(dir) writes tokenizer.json)",
           file.string(), fmt::join(missing, ", "));
  std::set<int> used;
  for (const auto& [name, id] : ids) used.insert(id);
  for (int id = n; id < next_id; ++id)
    DS_CHECK(used.count(id),
             "[tokenizer] '{}': added_tokens.json leaves id {} unused; only the special tokens "
             "(pad, unk, cls, sep, mask, bos, eos) may follow the model's pieces",
             file.string(), id);
  return added;
}

// [CLS] $A [SEP] / [CLS] $A [SEP] $B [SEP].
ojson post_processor(const TokenizerConfig& config, int cls, int sep) {
  auto piece = [](const char* kind, const std::string& id, unsigned type_id) {
    return ojson{{kind, {{"id", id}, {"type_id", type_id}}}};
  };
  return {{"type", "TemplateProcessing"},
          {"single",
           {piece("SpecialToken", config.cls_token, 0), piece("Sequence", "A", 0),
            piece("SpecialToken", config.sep_token, 0)}},
          {"pair",
           {piece("SpecialToken", config.cls_token, 0), piece("Sequence", "A", 0),
            piece("SpecialToken", config.sep_token, 0), piece("Sequence", "B", 1),
            piece("SpecialToken", config.sep_token, 1)}},
          {"special_tokens",
           {{config.cls_token,
             {{"id", config.cls_token}, {"ids", {cls}}, {"tokens", {config.cls_token}}}},
            {config.sep_token,
             {{"id", config.sep_token}, {"ids", {sep}}, {"tokens", {config.sep_token}}}}}}};
}

}  // namespace

std::unique_ptr<TextTokenizer> load_deberta_spm(const fs::path& file, TokenizerConfig config) {
  sentencepiece::SentencePieceProcessor sp;
  const std::string proto = read_text_file(file);
  const auto status = sp.LoadFromSerializedProto(proto);
  DS_CHECK(status.ok(), "[tokenizer] '{}' is not a SentencePiece model: {}", file.string(),
           status.ToString());
  const SpmOptions opt = read_options(file.parent_path() / "tokenizer_config.json");
  default_token_names(config);
  ojson vocab = ojson::array();
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    vocab.push_back(ojson::array({sp.IdToPiece(id), static_cast<double>(sp.GetScore(id))}));
  std::map<std::string, int> ids;
  const ojson added = special_tokens(sp, file, config, ids);
  ojson norms = ojson::array();
  if (opt.lower) norms.push_back({{"type", "Lowercase"}});
  norms.push_back(
      {{"type", "Replace"}, {"pattern", {{"Regex", R"(\s{2,}|[\n\r\t])"}}}, {"content", " "}});
  norms.push_back({{"type", "NFC"}});
  norms.push_back({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}});
  const ojson metaspace = {{"type", "Metaspace"},
                           {"replacement", "\xE2\x96\x81"},
                           {"prepend_scheme", opt.prefix_space ? "always" : "first"},
                           {"split", true}};
  const ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", norms}}},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {metaspace}}}},
      {"model",
       {{"type", "Unigram"},
        {"unk_id", ids.at(config.unk_token)},
        {"vocab", vocab},
        {"byte_fallback", false}}},
      {"post_processor", post_processor(config, ids.at(config.cls_token),
                                        ids.at(config.sep_token))},
      {"decoder", metaspace}};
  std::string text = j.dump();
  return load_tokenizer_json(file, std::move(text), j, config);
}

}  // namespace ds::data::detail
