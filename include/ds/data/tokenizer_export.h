#pragma once
// Write a tokenizer into a Hugging Face model folder so that transformers'
// AutoTokenizer.from_pretrained(folder) loads it and encodes exactly as load_tokenizer does.
//
//   auto tok = ds::data::load_tokenizer(src);                // or the GPT-2 files ds_prepare used
//   ds::data::export_tokenizer(*tok, out_dir);               // out_dir must exist
//
// Files written (reference: finetune-serve.md §2.3):
//   byte-level BPE: tokenizer.json, vocab.json, merges.txt, tokenizer_config.json with
//                   "tokenizer_class": "PreTrainedTokenizerFast" (valid in transformers 4.x
//                   and 5.x; a named class such as GPT2Tokenizer would make v5 rebuild the pipeline
//                   with that class's own pre-tokenizer and silently change ids)
//   SentencePiece:  tokenizer.model (unchanged) and tokenizer_config.json with "LlamaTokenizer".
//                   transformers builds its own pipeline from it, which agrees with sentencepiece
//                   except on text that starts with whitespace (docs/tokenizers.md)
// tokenizer_config.json also carries bos/eos/pad/unk/cls/sep/mask_token, model_max_length,
// add_bos_token / add_eos_token (SentencePiece) and chat_template.
#include <filesystem>
#include <string>

#include "ds/data/text_tokenizer.h"

namespace ds::data {

struct TokenizerExportOptions {
  // Jinja chat template to write; empty keeps the tokenizer's own (config().chat_template).
  // ChatTemplate::jinja() (chat_template.h) gives the source of a built-in format.
  std::string chat_template;
};

// Throws ds::Error naming the file that could not be written.
void export_tokenizer(const TextTokenizer& tok, const std::filesystem::path& dir,
                      const TokenizerExportOptions& options = {});

}  // namespace ds::data
