#pragma once
// Tiny models for the serve tests: built and exported in the test, never downloaded. Vocabulary
// 257 so that load_model picks the byte tokenizer (id b = byte b, 256 = end of text).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/seq2seq.h"
#include "ds/ops/ops.h"

namespace serve_test {

// A tiny BART (2 + 2 layers of width 32, 4 heads, FFN 64, pad 1, bos 0) for the serving tests; the
// caller sets the end and start tokens of its tokenizer and the seed.
inline ds::models::Seq2SeqConfig tiny_bart_config(int64_t vocab, int64_t positions) {
  ds::models::Seq2SeqConfig c;
  c.family = "bart";
  c.set_family_architecture();
  c.vocab_size = vocab;
  c.max_positions = positions;
  c.d_model = 32;
  c.encoder_layers = c.decoder_layers = 2;
  c.encoder_heads = c.decoder_heads = 4;
  c.encoder_ffn = c.decoder_ffn = 64;
  c.pad_token_id = 1;
  c.bos_token_id = 0;
  return c;
}

namespace fs = std::filesystem;

inline ds::models::GPTConfig tiny_gpt2(int64_t block = 64) {
  ds::models::GPTConfig c = ds::models::GPTConfig::defaults(ds::nn::Layout::gpt2);
  c.vocab_size = 257;
  c.block_size = block;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.seed = 7;
  return c;
}

// LLaMA layout with grouped-query attention (4 query heads, 2 KV heads) and a head size other
// than C / NH; family picks qwen2 (q/k/v biases), qwen3 (q/k norm), glm (partial interleaved
// rotary), glm4 (+ sandwich norms) or phi3 (LongRoPE's short table on half of each head: the
// original context is the block, so every sequence here stays within it) variants.
inline ds::models::GPTConfig tiny_llama(const std::string& family = "llama", int64_t block = 64) {
  ds::models::GPTConfig c = ds::models::GPTConfig::defaults(ds::nn::Layout::llama);
  c.vocab_size = 257;
  c.block_size = block;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.head_size = 16;
  c.ffn_hidden = 64;
  c.seed = 11;
  c.family = family;
  if (family == "qwen2") c.qkv_bias = true;
  if (family == "qwen3") c.qk_norm = true;
  if (family == "glm" || family == "glm4") {  // half of each head rotating, pairs (2i, 2i+1)
    c.qkv_bias = true;
    c.partial_rotary_factor = 0.5f;
    c.rope_interleaved = true;
    c.sandwich_norm = family == "glm4";
  }
  if (family == "phi3") {
    c.partial_rotary_factor = 0.5f;
    c.rope_scaling.type = "longrope";
    c.rope_scaling.original_max_position = block;
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.short_factor = {1.1, 1.9, 3.7, 6.2};
    c.rope_scaling.long_factor = {1.5, 2.8, 7.4, 13.0};
  }
  if (family == "llama") {
    c.rope_theta = 500000.0f;
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.original_max_position = 16;
  }
  return c;
}

// A fresh folder, removed afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> n{0};
    path_ = fs::temp_directory_path() / fmt::format("ds_test_serve_{}_{}_{}", ::getpid(), tag, n++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace serve_test

namespace serve_test {
// Random init gives nearly uniform logits (std 0.02); scaling the matrices spreads them so that
// greedy choices are far from ties and tests do not hinge on the last bit.
inline std::shared_ptr<ds::models::GPT> make_model(const ds::models::GPTConfig& c) {
  auto m = std::make_shared<ds::models::GPT>(c);
  for (auto& [name, p] : m->named_parameters())
    if (p.dim() == 2) ds::ops::mul_(p, 8.0f);
  m->train(false);
  return m;
}
}  // namespace serve_test

namespace serve_test {
// A model whose generations take seconds: GPT-2 layout, C 256, 4 layers, 4096 positions (about
// 1 ms a token on 2 cores), for tests that must act while a generation runs. The end-of-text row
// of the (tied) embedding is zero, so its logit is 0 while the largest of the others is several
// units above: greedy generation never stops before max_tokens.
inline std::shared_ptr<ds::models::GPT> make_slow_model() {
  ds::models::GPTConfig c = tiny_gpt2(4096);
  c.n_layer = 4;
  c.n_embd = 256;
  auto m = make_model(c);
  for (auto& [name, p] : m->named_parameters())
    if (name == "wte.weight") {
      float* row = p.data<float>() + 256 * c.n_embd;
      std::fill(row, row + c.n_embd, 0.0f);
    }
  return m;
}
}  // namespace serve_test
