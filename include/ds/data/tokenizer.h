#pragma once
// GPT-2 byte-level BPE tokenizer (50,257 tokens), equivalent to OpenAI's encoder.py.
//
//   auto tok = ds::data::Tokenizer::load_gpt2("/path/to/gpt2");   // encoder.json + vocab.bpe
//   std::vector<int32_t> ids = tok.encode("Hello world");         // {15496, 995}
//   std::string text = tok.decode(ids);                            // "Hello world"
//
// Pipeline: the pre-tokenizer splits text into words exactly like GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (hand-written over the tables in unicode.h); each word's bytes start as one token per byte and
// the merge with the lowest rank in vocab.bpe is applied (all its occurrences, left to right)
// until none applies. Tokens are stored as raw bytes, so decode is concatenation and
// decode(encode(x)) == x for every byte string x, valid UTF-8 or not.
//
// Thread safety: a loaded Tokenizer is immutable; encode/decode are const and may run on many
// threads at once. Repeated words are memoised in a WordCache the caller owns (one per thread).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds::data {

// How the literal text "<|endoftext|>" inside the input is treated.
enum class SpecialTokens {
  kAsText,  // ordinary text (what encoder.py does): "<|endoftext|>" -> 7 ordinary tokens
  kAllow,   // the literal becomes the single special token eot_id() (50256)
};

// Memo of word -> token ids. Not thread-safe: give each thread its own. When it holds
// max_entries words it is cleared (cheap, and a corpus's frequent words come back quickly).
class WordCache {
 public:
  explicit WordCache(size_t max_entries = 1 << 18) : max_entries_(max_entries) {}
  const std::vector<int32_t>* find(std::string_view word) const;
  void insert(std::string_view word, std::vector<int32_t> ids);
  size_t size() const { return map_.size(); }
  void clear() { map_.clear(); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  size_t max_entries_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
};

class Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  // Load encoder.json and vocab.bpe (the files scripts/fetch_data.sh puts in <cache>/gpt2).
  // Throws ds::Error naming the file when one is missing or malformed.
  static Tokenizer load(const std::filesystem::path& encoder_json,
                        const std::filesystem::path& vocab_bpe);
  // Same, from a folder holding both files.
  static Tokenizer load_gpt2(const std::filesystem::path& dir);

  // Tokens of text. Uses a WordCache local to the call.
  std::vector<int32_t> encode(std::string_view text,
                              SpecialTokens special = SpecialTokens::kAsText) const;
  // Append the tokens of text to out, memoising words in cache.
  void encode(std::string_view text, std::vector<int32_t>& out, WordCache& cache,
              SpecialTokens special = SpecialTokens::kAsText) const;

  // Bytes of the tokens, concatenated. The result is the exact original bytes; it is not
  // necessarily valid UTF-8 when ids is a slice that cuts a character. Throws on an unknown id.
  std::string decode(std::span<const int32_t> ids) const;
  // Bytes of one token.
  std::string_view token_bytes(int32_t id) const;

  // Split text into pre-tokenizer words (views into text), as GPT-2's regex does. Exposed for
  // tests and tools.
  static std::vector<std::string_view> pretokenize(std::string_view text);

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t eot_id() const { return eot_id_; }
  size_t num_merges() const { return merges_.size(); }

 private:
  Tokenizer() = default;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out, WordCache& cache) const;

  struct Merge {
    int32_t rank;
    int32_t result;  // token id of left+right
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::vector<std::string> tokens_;             // id -> raw bytes
  int32_t byte_token_[256] = {};                // byte value -> id of the one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  int32_t eot_id_ = -1;
};

}  // namespace ds::data
