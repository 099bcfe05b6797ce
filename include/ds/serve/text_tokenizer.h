#pragma once
// The tokenizer interface that generation and serving use: text <-> ids and the end-of-sequence
// ids. Today it has two implementations: the GPT-2 byte-level BPE of ds/data/tokenizer.h (read from
// a model folder's vocab.json + merges.txt, or encoder.json + vocab.bpe), and a byte tokenizer (id
// b is byte b, id 256 is the end of text) for tiny test models.
//
// TODO(tokenizers): HF tokenizer.json / SentencePiece and chat templates arrive in a parallel
// branch; wrap them here (one more TextTokenizer subclass and a branch in load_tokenizer).
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

namespace ds::serve {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Token ids of plain text (special-token literals such as "<|endoftext|>" are ordinary text).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of ids; may end in an incomplete UTF-8 character when ids stop inside one.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids that end a generation (GPT-2: <|endoftext|>); generation_config.json may add more.
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string name() const = 0;  // "gpt2-bpe", "bytes": for logs and /v1/models
};

// GPT-2 BPE from a folder holding vocab.json + merges.txt (Hugging Face names) or encoder.json +
// vocab.bpe (OpenAI's names). Throws "[tokenizer] ..." naming the files it looked for.
std::unique_ptr<TextTokenizer> load_gpt2_tokenizer(const std::filesystem::path& dir);
// Id b < 256 is byte b; 256 is the end of text. For models with vocab_size >= 257 built in tests.
std::unique_ptr<TextTokenizer> make_byte_tokenizer();

// Whether dir holds the files load_gpt2_tokenizer reads.
bool has_gpt2_tokenizer(const std::filesystem::path& dir);

}  // namespace ds::serve
