#pragma once
// One generation: prompt ids -> prefill -> decode steps until max_tokens, an end-of-sequence id or
// a stop string; and the loading of a model folder with its tokenizer and generation defaults.
//
//   auto m = serve::load_model("path/to/hf_folder");
//   auto dec = models::make_decoder(m.model);  // the family's decoder (ds/models/family.h)
//   auto r = serve::generate(*dec, *m.tokenizer, m.tokenizer->encode("Hello"), params, m.eos_ids);
//   r.text, r.finish_reason ("stop" | "length"), r.prefill_seconds, r.decode_seconds
//
// Sequence is the token loop of one generation without the forwards: generate() drives one with
// one decoder; serve::Scheduler (scheduler.h) drives many, one batched decode step for all.
//
// Threading: generate() uses the decoder exclusively; a Sequence belongs to one thread at a time.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/device.h"
#include "ds/data/chat_template.h"
#include "ds/models/gpt.h"
#include "ds/models/incremental_decoder.h"
#include "ds/models/seq2seq.h"
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
  int64_t decode_steps = 0;    // one-token forwards after the prefill (decode_seconds' count)
  double queue_seconds = 0.0;  // Scheduler: submitted to admitted into the batch (0: generate())
};

// Called with each new piece of text that is final: pieces never split a UTF-8 character, and text
// that could be the start of a stop string is held back until it is known not to be one. Return
// false to cancel (a client that went away); the result then has finish_reason "cancelled".
using TextCallback = std::function<bool(std::string_view piece)>;
// Asked before the prefill and before every decode step: true stops the generation there with
// finish_reason "cancelled" (ds_serve: the client disconnected, or a drain ran out of time).
using CancelCheck = std::function<bool()>;

// Changes one step's logits (V) in place before sampling (banned tokens -> -inf): encoder-decoders'
// transformers processors (models::Seq2SeqProcessors). source: the prompt; sequence: what the
// decoder has seen (decoder-only: prompt + generated; encoder-decoders: the decoder start +
// generated).
using LogitsProcessor = std::function<void(
    std::span<const int32_t> source, std::span<const int32_t> sequence, std::span<float> logits)>;

// The room a decoder gives one generation. Decoder-only (decoder_start < 0): the prompt and the
// generated tokens share `context` positions. Encoder-decoders: the prompt is a source of at most
// prompt_limit tokens; the target (decoder_start + the generated tokens but the last) has at most
// `context` positions: max_tokens + 1 <= context (transformers' max_length counts the start).
struct ContextBudget {
  int64_t context = 0;
  int64_t prompt_limit = 0;
  int32_t decoder_start = -1;
  ContextBudget(int64_t decoder_only_context)  // NOLINT: a context length reads as a budget
      : context(decoder_only_context), prompt_limit(decoder_only_context) {}
  ContextBudget(int64_t context, int64_t prompt_limit, int32_t decoder_start)
      : context(context), prompt_limit(prompt_limit), decoder_start(decoder_start) {}
  static ContextBudget of(const models::IncrementalDecoder& decoder);
  bool encoder_decoder() const { return decoder_start >= 0; }
};

// One generation's state between forwards: sampling with its own params and seed, end-of-sequence,
// stop strings, max_tokens, and the streaming of final text. Its driver runs the prefill, calls
// prefilled(), then hands the logits of each last position to advance() and feeds next_token()
// back until advance() returns false; cancel() ends it early.
//
//   Sequence s(tok, prompt, params, eos_ids, on_text, decoder.capacity_limit());
//   Tensor logits = decoder.forward(s.prompt());  s.prefilled();
//   while (s.advance(row_of(logits))) logits = decoder.forward({s.next_token()});
//   GenerationResult r = std::move(s.result());
class Sequence {
 public:
  // Validates params and the budget: throws "[generate] ..." when the prompt is empty or prompt +
  // max_tokens exceeds context (encoder-decoders: the source exceeds prompt_limit, or max_tokens +
  // 1 the target's context). Starts the clock of first_token_seconds and prefill_seconds. The
  // repetition penalty counts the prompt (decoder-only) or the decoder start (encoder-decoders,
  // as transformers: the source is not the decoder's input).
  Sequence(const TextTokenizer& tokenizer, std::span<const int32_t> prompt, SamplingParams params,
           std::vector<int32_t> eos_ids, TextCallback on_text, ContextBudget context);
  const std::vector<int32_t>& prompt() const { return prompt_; }
  // Applied to every step's logits before sampling (encoder-decoders' generation settings).
  void set_logits_processor(LogitsProcessor p) { processor_ = std::move(p); }
  void prefilled();  // the prefill's forward is done
  // logits (V) of the last position (modified in place): samples the next token, streams text.
  // true: feed next_token() to the next decode step; false: finished (eos, stop, length, or the
  // callback asked to cancel).
  bool advance(std::span<float> logits);
  int32_t next_token() const { return next_; }
  void cancel();  // finish_reason "cancelled"
  bool done() const { return done_; }
  GenerationResult& result() { return r_; }

 private:
  void finish(const char* reason);

  const TextTokenizer* tokenizer_;
  SamplingParams params_;
  std::vector<int32_t> eos_ids_;
  TextCallback on_text_;
  LogitsProcessor processor_;
  // the prompt; the decoder's input so far: prompt (decoder start) + generated
  std::vector<int32_t> prompt_, history_;
  int64_t history_prompt_ = 0;  // the prompt's (decoder start's) part of history_
  GenerationResult r_;
  size_t emitted_ = 0;  // bytes of r_.text handed to on_text
  int64_t step_ = 0;
  int32_t next_ = -1;
  bool done_ = false, prefilled_ = false;
  std::chrono::steady_clock::time_point t0_, t1_;  // construction; end of the prefill
};

// Resets the decoder, prefills prompt (one forward), then decodes. Throws "[generate] ..." when
// the prompt is empty or prompt + max_tokens exceeds the model's context (block_size).
GenerationResult generate(models::IncrementalDecoder& decoder, const TextTokenizer& tokenizer,
                          std::span<const int32_t> prompt, const SamplingParams& params,
                          const std::vector<int32_t>& eos_ids, const TextCallback& on_text = {},
                          const CancelCheck& cancelled = {});

struct LoadedModel {
  std::shared_ptr<models::GPT> model;  // decoder-only; null for an encoder-decoder
  // Encoder-decoders (config.json model_type bart, blenderbot or t5): the model, and its
  // generation settings (models::read_hf_generation_options: the logits processors ds_serve
  // applies; max_new_tokens the default max_tokens).
  std::shared_ptr<models::Seq2Seq> seq2seq;
  models::BeamOptions seq2seq_options;
  // A decoder of the model (models::make_decoder, or a models::Seq2SeqDecoder).
  std::unique_ptr<models::IncrementalDecoder> make_decoder() const;
  int64_t vocab_size() const;
  std::unique_ptr<TextTokenizer> tokenizer;
  GenerationDefaults defaults;   // generation_config.json
  std::vector<int32_t> eos_ids;  // the tokenizer's, plus generation_config.json's
  // The chat format: the tokenizer's chat_template when ds::data::ChatTemplate recognises it, else
  // ChatML (encoder-decoders: none, ds_serve then joins the turns as BlenderBot does);
  // chat_template_note says why it was not used. chat_eos_ids: eos_ids plus the turn-end
  // tokens the vocabulary has (<|im_end|>, <|eot_id|>, <|endoftext|>).
  std::optional<data::ChatTemplate> chat_template;
  std::string chat_template_note;
  std::vector<int32_t> chat_eos_ids;
  DType dtype = DType::f32;      // the weights' and KV caches' (load_model's dtype)
  std::string id;                // the folder's name: /v1/models and "model" in replies
  std::filesystem::path folder;  // the Hugging Face folder the weights came from
};

// path: a Hugging Face folder (config.json + safetensors) or a ds_train --output_dir (its hf_model/
// export); decoder-only or encoder-decoder (LoadedModel::seq2seq; generation_config.json's
// do_sample defaults to false there, as transformers': greedy unless a request sets a
// temperature). The tokenizer comes from the folder, else from tokenizer_dir, else the byte
// tokenizer when the vocabulary has exactly 257 ids (tiny test models). Throws naming what is
// missing. device: where the weights go once loaded (Module::to; its backend is initialised here):
// the decoders run there and hand their logits back in host memory (ds_serve / ds_generate
// --device). dtype: the weights' and so the KV caches' (ds_serve / ds_generate --dtype): fp32, or
// bf16 for decoder-only models (a bf16 checkpoint's values as they are, an fp32 one's rounded;
// the CPU's decode kernels read them without fp32 copies; encoder-decoders refuse it).
LoadedModel load_model(const std::filesystem::path& path,
                       const std::filesystem::path& tokenizer_dir = {}, Device device = kCPU,
                       DType dtype = DType::f32);

// --dtype's value for the model at path: "fp32" (float32), "bf16" (bfloat16), or "auto": the
// checkpoint's, as transformers' from_pretrained(dtype="auto") - config.json's dtype (or
// torch_dtype) bfloat16 gives bf16, anything else (float32, float16, none) fp32, and an
// encoder-decoder fp32. Throws "[serve] --dtype ..." for another name.
DType decode_dtype(const std::string& name, const std::filesystem::path& path);

// The folder load_model reads for path: path itself when it holds config.json, else its
// hf_model/ (a ds_train --output_dir's export). Throws "[serve] ..." with the reason when there is
// none, before any option is looked at: a PEFT adapter folder (adapter_config.json: merge it,
// ds_train --merge_lora), a ds_train run folder without an export (its --export_hf, or
// ds_to_fp32), no config.json at all; or config.json's model_type is no family we generate with
// (mt5, umt5, an encoder classifier, ...: named, with the supported ones).
std::filesystem::path model_folder(const std::filesystem::path& path);

// Whether s ends inside a UTF-8 character: the number of bytes to hold back (0-3).
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace ds::serve
