#pragma once
// The tokenizer interface generation and serving use: text <-> ids, the end-of-sequence ids, and
// (for chat) the Hugging Face tokenizer underneath. Two implementations:
//   - any tokenizer of a Hugging Face folder through ds::data::load_tokenizer (tokenizer.json,
//     tokenizer.model, vocab.json + merges.txt, encoder.json + vocab.bpe; see
//     ds/data/text_tokenizer.h), encoding as transformers' tokenizer(text) does (with the
//     model's BOS when it adds one) and decoding without special tokens;
//   - a byte tokenizer (id b is byte b, id 256 is the end of text) for tiny test models.
//
// Thread safety: implementations are immutable after construction; encode/decode may run on many
// threads at once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/data/text_tokenizer.h"

namespace ds::serve {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Token ids of a prompt.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of generated ids; may end in an incomplete UTF-8 character when ids stop inside one.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids that end a generation (the eos token); generation_config.json may add more.
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string name() const = 0;  // "bpe", "sentencepiece", "bytes": for logs
  // The Hugging Face tokenizer underneath (chat templates need it); nullptr for the byte one.
  virtual const data::TextTokenizer* hf() const { return nullptr; }
};

// Whether folder holds a tokenizer file data::load_tokenizer reads.
bool has_tokenizer_files(const std::filesystem::path& folder);
// The tokenizer of a folder (data::load_tokenizer); throws naming the files it looked for.
std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::filesystem::path& folder);
// Id b < 256 is byte b; 256 is the end of text. For models with vocab_size 257 built in tests.
std::unique_ptr<TextTokenizer> make_byte_tokenizer();

}  // namespace ds::serve
