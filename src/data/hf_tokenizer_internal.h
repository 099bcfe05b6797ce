#pragma once
// Internal to src/data: the concrete tokenizers behind load_tokenizer (text_tokenizer.h) and the
// helpers they share.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ds/data/text_tokenizer.h"

namespace ds::data::detail {

// A tokenizer.json, by model.type: BPE, WordPiece or Unigram (the others are a ds::Error naming the
// type), through the pipeline of hf_pipeline.h.
std::unique_ptr<TextTokenizer> load_tokenizer_json(const std::filesystem::path& file,
                                                   const TokenizerConfig& config);
// The same from the file's bytes (what export writes back) and their parse.
std::unique_ptr<TextTokenizer> load_tokenizer_json(const std::filesystem::path& file,
                                                   std::string json_text, const nlohmann::json& j,
                                                   const TokenizerConfig& config);
// Byte-level BPE with GPT-2's pre-tokenizer from vocab.json + merges.txt (or encoder.json +
// vocab.bpe); "<|endoftext|>" is a special token when the vocabulary has it.
std::unique_ptr<TextTokenizer> load_bpe_vocab_merges(const std::filesystem::path& vocab_json,
                                                     const std::filesystem::path& merges_txt,
                                                     const TokenizerConfig& config);
// DeBERTa-v2/v3's spm.model (+ tokenizer_config.json, added_tokens.json): the Unigram pipeline
// transformers 5's DebertaV2Tokenizer builds from it (deberta_spm.cpp).
std::unique_ptr<TextTokenizer> load_deberta_spm(const std::filesystem::path& file,
                                                TokenizerConfig config);
// SentencePiece tokenizer.model (sp_tokenizer.cpp).
std::unique_ptr<TextTokenizer> load_sentencepiece(const std::filesystem::path& file,
                                                  const TokenizerConfig& config);

// The whole file, or ds::Error naming it.
std::string read_text_file(const std::filesystem::path& path);
// Parsed JSON, or ds::Error naming the file and the parse error.
nlohmann::json parse_json(std::string_view text, const std::filesystem::path& path);
nlohmann::json read_json_file(const std::filesystem::path& path);
// Write text to path (replacing it), or ds::Error naming it.
void write_text_file(const std::filesystem::path& path, std::string_view text);

// Fill config's *_id fields from its token names, via tok.token_to_id. A named token missing from
// the vocabulary is an error naming the field.
void resolve_special_ids(const TextTokenizer& tok, TokenizerConfig& config,
                         const std::filesystem::path& source);

}  // namespace ds::data::detail
