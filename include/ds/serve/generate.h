#pragma once
// One generation: prompt ids -> prefill -> decode steps until max_tokens, an end-of-sequence id or
// a stop string; and the loading of a model folder with its tokenizer and generation defaults.
//
//   auto m = serve::load_model("path/to/hf_folder");
//   serve::KVDecoder dec(m.model);
//   auto r = serve::generate(dec, *m.tokenizer, m.tokenizer->encode("Hello"), params, m.eos_ids);
//   r.text, r.finish_reason ("stop" | "length"), r.prefill_seconds, r.decode_seconds
//
// Threading: generate() uses the decoder and the model exclusively; callers serialise (ds_serve
// holds one lock around it, tools/serve/fifo_lock.h).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/data/chat_template.h"
#include "ds/models/gpt.h"
#include "ds/serve/kv_decoder.h"
#include "ds/serve/sampling.h"
#include "ds/serve/text_tokenizer.h"

namespace ds::serve {

struct GenerationResult {
  std::string text;             // the completion, stop string and end-of-sequence excluded
  std::vector<int32_t> tokens;  // generated ids (the end-of-sequence id excluded)
  std::string finish_reason;    // "stop" (eos or stop string), "length", "cancelled"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // decode steps that produced a token (eos included)
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  double first_token_seconds = -1.0;  // from the call to the first new token; < 0 when none
  int64_t decode_steps = 0;  // one-token forwards after the prefill (decode_seconds' count)
};

// Called with each new piece of text that is final: pieces never split a UTF-8 character, and text
// that could be the start of a stop string is held back until it is known not to be one. Return
// false to cancel (a client that went away); the result then has finish_reason "cancelled".
using TextCallback = std::function<bool(std::string_view piece)>;
// Asked before the prefill and before every decode step: true stops the generation there with
// finish_reason "cancelled" (ds_serve: the client disconnected, or a drain ran out of time).
using CancelCheck = std::function<bool()>;

// Resets the decoder, prefills prompt (one forward), then decodes. Throws "[generate] ..." when
// the prompt is empty or prompt + max_tokens exceeds the model's context (block_size).
GenerationResult generate(KVDecoder& decoder, const TextTokenizer& tokenizer,
                          std::span<const int32_t> prompt, const SamplingParams& params,
                          const std::vector<int32_t>& eos_ids, const TextCallback& on_text = {},
                          const CancelCheck& cancelled = {});

struct LoadedModel {
  std::shared_ptr<models::GPT> model;
  std::unique_ptr<TextTokenizer> tokenizer;
  GenerationDefaults defaults;   // generation_config.json
  std::vector<int32_t> eos_ids;  // the tokenizer's, plus generation_config.json's
  // The chat format: the tokenizer's chat_template when ds::data::ChatTemplate recognises it, else
  // ChatML; chat_template_note says why it was not used. chat_eos_ids: eos_ids plus the turn-end
  // tokens the vocabulary has (<|im_end|>, <|eot_id|>, <|endoftext|>).
  std::optional<data::ChatTemplate> chat_template;
  std::string chat_template_note;
  std::vector<int32_t> chat_eos_ids;
  std::string id;                // the folder's name: /v1/models and "model" in replies
  std::filesystem::path folder;  // the Hugging Face folder the weights came from
};

// path: a Hugging Face folder (config.json + safetensors) or a ds_train --output_dir (its hf_model/
// export). The tokenizer comes from the folder, else from tokenizer_dir, else the byte tokenizer
// when the vocabulary has exactly 257 ids (tiny test models). Throws naming what is missing.
LoadedModel load_model(const std::filesystem::path& path,
                       const std::filesystem::path& tokenizer_dir = {});

// Whether s ends inside a UTF-8 character: the number of bytes to hold back (0-3).
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace ds::serve
