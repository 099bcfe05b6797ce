#include "ds/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "merges_text.h"
#include "pretokenize.h"

namespace ds::data {

namespace fs = std::filesystem;

// ---- WordCache ----------------------------------------------------------------------------------

const std::vector<int32_t>* WordCache::find(std::string_view word) const {
  auto it = map_.find(word);
  return it == map_.end() ? nullptr : &it->second;
}

void WordCache::insert(std::string_view word, std::vector<int32_t> ids) {
  if (map_.size() >= max_entries_) map_.clear();
  map_.emplace(std::string(word), std::move(ids));
}

// ---- pre-tokenizer ------------------------------------------------------------------------------

namespace {

// Words longer than this are not memoised: they are rarely repeated and would bloat the cache.
constexpr size_t kMaxCachedWordBytes = 128;

// Calls emit(word) for each match of GPT-2's regex (src/data/pretokenize.h), left to right.
template <class Emit>
void pretokenize_into(std::string_view s, Emit&& emit) {
  detail::split_words(detail::SplitPattern::kGpt2, s, /*onig=*/false, std::forward<Emit>(emit));
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to U+0100.. in order.
// vocab files spell token bytes through this table.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

std::string read_file(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(),
           "[tokenizer] cannot open {} '{}'; run scripts/fetch_data.sh to fetch the GPT-2 "
           "tokenizer files (or point to the folder holding encoder.json and vocab.bpe)",
           what, path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

}  // namespace

std::vector<std::string_view> Tokenizer::pretokenize(std::string_view text) {
  std::vector<std::string_view> words;
  pretokenize_into(text, [&](std::string_view w) { words.push_back(w); });
  return words;
}

// ---- loading ------------------------------------------------------------------------------------

Tokenizer Tokenizer::load_gpt2(const fs::path& dir) {
  return load(dir / "encoder.json", dir / "vocab.bpe");
}

Tokenizer Tokenizer::load(const fs::path& encoder_json, const fs::path& vocab_bpe) {
  const auto b2u = bytes_to_unicode();
  std::array<int, 324> u2b;  // code point -> byte; the table's image lies below U+0144
  u2b.fill(-1);
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;

  // Spelled token (UTF-8 of mapped code points) -> raw bytes.
  auto to_bytes = [&](std::string_view spelled, const fs::path& file) {
    std::string raw;
    raw.reserve(spelled.size());
    for (size_t i = 0; i < spelled.size();) {
      const Utf8Char c = utf8_decode(spelled, i);
      DS_CHECK(c.valid && c.cp < u2b.size() && u2b[c.cp] >= 0,
               "[tokenizer] '{}' holds token '{}' with a character outside GPT-2's byte alphabet; "
               "is this a GPT-2 byte-level BPE file? Re-run scripts/fetch_data.sh",
               file.string(), spelled);
      raw.push_back(static_cast<char>(u2b[c.cp]));
      i += c.len;
    }
    return raw;
  };

  Tokenizer tok;
  std::unordered_map<std::string, int32_t> ids;  // raw bytes -> id
  {
    nlohmann::json enc;
    try {
      enc = nlohmann::json::parse(read_file(encoder_json, "encoder.json"));
    } catch (const nlohmann::json::exception& e) {
      DS_THROW("[tokenizer] '{}' is not valid JSON ({}); re-run scripts/fetch_data.sh",
               encoder_json.string(), e.what());
    }
    DS_CHECK(enc.is_object() && !enc.empty(),
             "[tokenizer] '{}' must be a JSON object mapping token -> id", encoder_json.string());
    tok.tokens_.resize(enc.size());
    std::vector<bool> seen(enc.size(), false);
    for (const auto& [key, value] : enc.items()) {
      DS_CHECK(value.is_number_integer(), "[tokenizer] '{}': id of '{}' is not an integer",
               encoder_json.string(), key);
      const auto id = value.get<int64_t>();
      DS_CHECK(id >= 0 && id < static_cast<int64_t>(enc.size()) && !seen[id],
               "[tokenizer] '{}': ids must be 0..{} with no repeats, found {} for '{}'",
               encoder_json.string(), enc.size() - 1, id, key);
      seen[id] = true;
      std::string raw = key == kEndOfText ? std::string(key) : to_bytes(key, encoder_json);
      if (key == kEndOfText) tok.eot_id_ = static_cast<int32_t>(id);
      ids.emplace(raw, static_cast<int32_t>(id));
      tok.tokens_[id] = std::move(raw);
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(std::string(1, static_cast<char>(b)));
    DS_CHECK(it != ids.end(), "[tokenizer] '{}' lacks the one-byte token for byte {}",
             encoder_json.string(), b);
    tok.byte_token_[b] = it->second;
  }

  int32_t rank = 0;
  detail::for_each_merge_line(
      read_file(vocab_bpe, "vocab.bpe"), vocab_bpe,
      [&](size_t line_no, std::string_view ta, std::string_view tb) {
        const std::string a = to_bytes(ta, vocab_bpe), b = to_bytes(tb, vocab_bpe);
        auto ia = ids.find(a), ib = ids.find(b), iab = ids.find(a + b);
        DS_CHECK(ia != ids.end() && ib != ids.end() && iab != ids.end(),
                 "[tokenizer] '{}' line {}: merge '{} {}' uses or makes a token missing from '{}'; "
                 "the two files do not belong together",
                 vocab_bpe.string(), line_no, ta, tb, encoder_json.string());
        // encoder.py builds a dict, so a repeated pair keeps its last rank; do the same.
        tok.merges_.insert_or_assign(pair_key(ia->second, ib->second), Merge{rank, iab->second});
        ++rank;
      });
  DS_CHECK(rank > 0, "[tokenizer] '{}' holds no merges; re-run scripts/fetch_data.sh",
           vocab_bpe.string());
  return tok;
}

// ---- encoding -----------------------------------------------------------------------------------

void Tokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  // syms: current tokens of the word; ranks[i]: rank of the pair (syms[i], syms[i+1]).
  // Each pass finds the lowest rank and merges all its occurrences left to right, as encoder.py
  // does; only ranks next to a merge are looked up again. Quadratic in the word length at worst,
  // which GPT-2's short words never approach.
  std::vector<int32_t> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i) syms[i] = byte_token_[static_cast<uint8_t>(word[i])];
  auto rank_of = [&](int32_t a, int32_t b) {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? INT32_MAX : it->second.rank;
  };
  std::vector<int32_t> ranks(syms.size());
  for (size_t i = 0; i + 1 < syms.size(); ++i) ranks[i] = rank_of(syms[i], syms[i + 1]);
  while (syms.size() > 1) {
    const auto best_it = std::min_element(ranks.begin(), ranks.end() - 1);
    if (*best_it == INT32_MAX) break;
    const size_t first = best_it - ranks.begin();
    const int32_t a = syms[first], b = syms[first + 1];
    const int32_t merged = merges_.find(pair_key(a, b))->second.result;
    // Compact in place: w is the write index. Positions before `first` are unchanged.
    size_t w = first;
    for (size_t r = first; r < syms.size();) {
      if (r + 1 < syms.size() && syms[r] == a && syms[r + 1] == b) {
        syms[w++] = merged;
        r += 2;
      } else {
        syms[w++] = syms[r++];
      }
    }
    syms.resize(w);
    ranks.resize(w);
    // Recompute ranks from just before the first merge; cheaper bookkeeping of exactly which
    // pairs changed is not worth it for words this short.
    for (size_t i = first > 0 ? first - 1 : 0; i + 1 < syms.size(); ++i)
      ranks[i] = rank_of(syms[i], syms[i + 1]);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out,
                             WordCache& cache) const {
  pretokenize_into(text, [&](std::string_view word) {
    if (word.size() == 1) {
      out.push_back(byte_token_[static_cast<uint8_t>(word[0])]);
      return;
    }
    if (word.size() > kMaxCachedWordBytes) {
      bpe(word, out);
      return;
    }
    if (const auto* hit = cache.find(word)) {
      out.insert(out.end(), hit->begin(), hit->end());
      return;
    }
    const size_t start = out.size();
    bpe(word, out);
    cache.insert(word, std::vector<int32_t>(out.begin() + start, out.end()));
  });
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, WordCache& cache,
                       SpecialTokens special) const {
  if (special == SpecialTokens::kAsText) {
    encode_plain(text, out, cache);
    return;
  }
  DS_CHECK(eot_id_ >= 0,
           "[tokenizer] this vocabulary has no '{}' token; encode with "
           "SpecialTokens::kAsText",
           kEndOfText);
  for (;;) {
    const size_t at = text.find(kEndOfText);
    encode_plain(text.substr(0, at), out, cache);
    if (at == std::string_view::npos) break;
    out.push_back(eot_id_);
    text.remove_prefix(at + kEndOfText.size());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  WordCache cache;
  encode(text, out, cache, special);
  return out;
}

// ---- decoding -----------------------------------------------------------------------------------

std::string_view Tokenizer::token_bytes(int32_t id) const {
  DS_CHECK(id >= 0 && id < vocab_size(),
           "[tokenizer] token id {} is outside the vocabulary [0, {})", id, vocab_size());
  return tokens_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

}  // namespace ds::data
