#pragma once
// Next-token choice from logits, with Hugging Face's semantics and order:
//   repetition penalty (CTRL: for every token already in the sequence, prompt included, a positive
//   logit is divided by the penalty, a negative one multiplied) -> presence/frequency penalties
//   (OpenAI: logit -= presence * [count > 0] + frequency * count, over generated tokens)
//   -> temperature (logits / T; T == 0 is greedy: the argmax, lowest id on ties)
//   -> top_k (the k largest; 0 = off) -> top_p (the smallest set, most likely first, whose
//   probability reaches top_p; 1 = off) -> one draw.
// The draw is rng::uniform01(hash3(seed, step, 0)): a given seed and step always pick the same
// token, on any machine and thread.
//
// GenerationDefaults reads a model folder's generation_config.json (transformers' file): the
// defaults that request values override. Precedence: request > generation_config.json > the
// built-in values below (temperature 1, top_k 0, top_p 1, repetition_penalty 1).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds::serve {

struct SamplingParams {
  int64_t max_tokens = 16;          // new tokens at most; finish_reason "length" when reached
  float temperature = 1.0f;         // 0 = greedy
  int64_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // (0, 1]; 1 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float presence_penalty = 0.0f;    // OpenAI, over generated tokens
  float frequency_penalty = 0.0f;   // OpenAI, over generated tokens
  uint64_t seed = 0;
  std::vector<std::string> stop;  // text that ends the generation; excluded from the output

  // Throws "[sampling] <field> ..." naming the first bad value.
  void validate() const;
};

// Values of generation_config.json that set sampling defaults (absent = not set there), and the
// end-of-sequence ids it lists (eos_token_id: an int or a list).
struct GenerationDefaults {
  std::optional<float> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::optional<bool> do_sample;  // false: greedy unless the request sets a temperature
  std::vector<int32_t> eos_token_ids;

  // Reads dir/generation_config.json; all unset when the file is absent. Throws
  // "[generation_config] <file>: <field> ..." for a value of the wrong type.
  static GenerationDefaults load(const std::filesystem::path& dir);
  static GenerationDefaults from_json(const nlohmann::json& j, const std::string& source);
  // params with every value the file sets (temperature 0 when do_sample is false).
  SamplingParams apply(SamplingParams params) const;
};

// The next token. logits (V) is modified in place (penalties, temperature). history: every token
// of the sequence so far (prompt + generated); n_prompt of them are the prompt. step numbers the
// draws (0 for the first new token).
int32_t sample_next(std::span<float> logits, std::span<const int32_t> history, int64_t n_prompt,
                    const SamplingParams& params, uint64_t step);

// The earliest occurrence of any stop string in text at or after `from`; npos when none.
size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from = 0);
// How many bytes at the end of text could begin a stop string (held back while streaming).
size_t stop_prefix_len(const std::string& text, const std::vector<std::string>& stop);

}  // namespace ds::serve
