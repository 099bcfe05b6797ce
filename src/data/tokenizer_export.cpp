#include "ds/data/tokenizer_export.h"

#include "ds/core/error.h"
#include "hf_tokenizer_internal.h"

namespace ds::data {

void export_tokenizer(const TextTokenizer& tok, const std::filesystem::path& dir,
                      const TokenizerExportOptions& options) {
  DS_CHECK(std::filesystem::is_directory(dir),
           "[tokenizer] export folder '{}' does not exist; create it first", dir.string());
  tok.save_model_files(dir);
  const TokenizerConfig& c = tok.config();
  const bool sp = tok.kind() == "sentencepiece";
  nlohmann::ordered_json j;  // a few keys: order kept for readers
  j["tokenizer_class"] = sp ? "LlamaTokenizer" : "PreTrainedTokenizerFast";
  auto put = [&](const char* key, const std::string& v) {
    if (!v.empty()) j[key] = v;
  };
  put("bos_token", c.bos_token);
  put("eos_token", c.eos_token);
  put("pad_token", c.pad_token);
  put("unk_token", c.unk_token);
  put("cls_token", c.cls_token);
  put("sep_token", c.sep_token);
  put("mask_token", c.mask_token);
  if (sp) {
    j["add_bos_token"] = c.add_bos_token;
    j["add_eos_token"] = c.add_eos_token;
  }
  j["clean_up_tokenization_spaces"] = false;
  if (c.model_max_length > 0) j["model_max_length"] = c.model_max_length;
  const std::string& tmpl = options.chat_template.empty() ? c.chat_template : options.chat_template;
  put("chat_template", tmpl);
  detail::write_text_file(dir / "tokenizer_config.json", j.dump(2) + "\n");
}

}  // namespace ds::data
