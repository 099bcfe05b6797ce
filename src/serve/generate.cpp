#include "ds/serve/generate.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "ds/core/error.h"
#include "ds/models/hf_io.h"

namespace ds::serve {
namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

size_t incomplete_utf8_tail(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the lead byte of the last character.
  size_t back = 0;
  while (back < 3 && back < s.size() &&
         (static_cast<unsigned char>(s[s.size() - 1 - back]) & 0xC0) == 0x80)
    ++back;
  if (back == s.size()) return 0;  // only continuation bytes (not UTF-8): nothing to wait for
  const unsigned char lead = static_cast<unsigned char>(s[s.size() - 1 - back]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return back + 1 < need ? back + 1 : 0;
}

GenerationResult generate(KVDecoder& decoder, const TextTokenizer& tokenizer,
                          std::span<const int32_t> prompt, const SamplingParams& params,
                          const std::vector<int32_t>& eos_ids, const TextCallback& on_text,
                          const CancelCheck& cancelled) {
  params.validate();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t context = decoder.capacity_limit();
  DS_CHECK(n_prompt > 0, "[generate] the prompt is empty (no tokens)");
  DS_CHECK(n_prompt + params.max_tokens <= context,
           "[generate] the prompt ({} tokens) + max_tokens ({}) exceed the model's context length "
           "of {} tokens; shorten the prompt or lower max_tokens",
           n_prompt, params.max_tokens, context);
  GenerationResult r;
  r.prompt_tokens = n_prompt;
  r.finish_reason = "length";
  if (cancelled && cancelled()) {
    r.finish_reason = "cancelled";
    return r;
  }
  decoder.reset();
  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = decoder.forward(prompt);  // (1, V)
  r.prefill_seconds = seconds_since(t0);
  if (params.max_tokens == 0) return r;

  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> row;
  size_t emitted = 0;  // bytes of r.text handed to on_text
  auto t1 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < params.max_tokens; ++step) {
    row = logits.to_vector();
    const int32_t next = sample_next(row, history, n_prompt, params, static_cast<uint64_t>(step));
    if (step == 0) r.first_token_seconds = seconds_since(t0);
    ++r.completion_tokens;
    if (std::find(eos_ids.begin(), eos_ids.end(), next) != eos_ids.end()) {
      r.finish_reason = "stop";
      break;
    }
    r.tokens.push_back(next);
    history.push_back(next);
    r.text = tokenizer.decode(r.tokens);
    if (!params.stop.empty()) {
      // A stop string cannot start inside text already handed out (its possible starts are held
      // back), so the search starts there.
      if (size_t at = find_stop(r.text, params.stop, emitted); at != std::string::npos) {
        r.text.resize(at);
        r.finish_reason = "stop";
        break;
      }
    }
    if (on_text) {
      const size_t hold =
          std::max(stop_prefix_len(r.text, params.stop), incomplete_utf8_tail(r.text));
      const size_t safe = r.text.size() - std::min(hold, r.text.size());
      if (safe > emitted) {
        if (!on_text(std::string_view(r.text).substr(emitted, safe - emitted))) {
          r.finish_reason = "cancelled";
          r.decode_seconds = seconds_since(t1);
          return r;
        }
        emitted = safe;
      }
    }
    if (step + 1 == params.max_tokens) break;
    if (cancelled && cancelled()) {
      r.finish_reason = "cancelled";
      r.decode_seconds = seconds_since(t1);
      return r;
    }
    logits = decoder.forward(std::span<const int32_t>(&next, 1));
    ++r.decode_steps;
  }
  r.decode_seconds = seconds_since(t1);
  if (on_text && r.text.size() > emitted) {
    if (!on_text(std::string_view(r.text).substr(emitted))) r.finish_reason = "cancelled";
  }
  return r;
}

LoadedModel load_model(const fs::path& path, const fs::path& tokenizer_dir) {
  LoadedModel m;
  fs::path folder = path;
  if (!fs::exists(path / "config.json") && fs::exists(path / "hf_model" / "config.json"))
    folder = path / "hf_model";  // a ds_train --output_dir: its Hugging Face export
  auto cfg = models::read_hf_config(folder);
  DS_CHECK(cfg.has_value(),
           "[serve] {} holds no config.json (nor hf_model/config.json): give a Hugging Face model "
           "folder or a ds_train --output_dir",
           path.string());
  m.model = std::make_shared<models::GPT>(*cfg, /*init=*/false);
  models::load_hf_weights(*m.model, folder);
  m.model->train(false);
  if (has_tokenizer_files(folder))
    m.tokenizer = load_text_tokenizer(folder);
  else if (!tokenizer_dir.empty())
    m.tokenizer = load_text_tokenizer(tokenizer_dir);
  else if (cfg->vocab_size == 257)
    m.tokenizer = make_byte_tokenizer();
  else
    DS_THROW(
        "[serve] {} holds no tokenizer (tokenizer.json, tokenizer.model, vocab.json + merges.txt "
        "or encoder.json + vocab.bpe); pass --tokenizer <folder>",
        folder.string());
  DS_CHECK(m.tokenizer->vocab_size() <= cfg->vocab_size,
           "[serve] the tokenizer has {} ids but the model's vocabulary only {}: wrong tokenizer?",
           m.tokenizer->vocab_size(), cfg->vocab_size);
  m.defaults = GenerationDefaults::load(folder);
  m.eos_ids = m.tokenizer->eos_ids();
  for (int32_t id : m.defaults.eos_token_ids)
    if (std::find(m.eos_ids.begin(), m.eos_ids.end(), id) == m.eos_ids.end())
      m.eos_ids.push_back(id);
  // The chat format: the folder's template when it is one we implement, else ChatML.
  if (const data::TextTokenizer* hf = m.tokenizer->hf()) {
    const std::string& jinja = hf->config().chat_template;
    if (!jinja.empty()) {
      try {
        m.chat_template = data::ChatTemplate::from_jinja(jinja);
      } catch (const Error& e) {
        m.chat_template_note =
            fmt::format("chat template not recognised, using chatml: {}", e.what());
      }
    }
    // Turn-end tokens of the chat formats end a chat answer (they are special: decode hides them).
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"})
      if (int32_t id = hf->token_to_id(t); id >= 0) m.chat_eos_ids.push_back(id);
  }
  if (!m.chat_template) m.chat_template = data::ChatTemplate::by_name("chatml");
  for (int32_t id : m.eos_ids)
    if (std::find(m.chat_eos_ids.begin(), m.chat_eos_ids.end(), id) == m.chat_eos_ids.end())
      m.chat_eos_ids.push_back(id);
  fs::path norm = fs::absolute(path).lexically_normal();
  m.id = norm.has_filename() ? norm.filename().string() : norm.parent_path().filename().string();
  m.folder = folder;
  return m;
}

}  // namespace ds::serve
