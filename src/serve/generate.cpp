#include "ds/serve/generate.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/memory_info.h"
#include "ds/models/family.h"
#include "ds/models/hf_io.h"
#include "ds/models/seq2seq_decoder.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/flat.h"

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

ContextBudget ContextBudget::of(const models::IncrementalDecoder& decoder) {
  if (!decoder.encoder_decoder()) return ContextBudget(decoder.capacity_limit());
  return ContextBudget(decoder.capacity_limit(), decoder.prompt_limit(),
                       decoder.decoder_start_token());
}

Sequence::Sequence(const TextTokenizer& tokenizer, std::span<const int32_t> prompt,
                   SamplingParams params, std::vector<int32_t> eos_ids, TextCallback on_text,
                   ContextBudget context)
    : tokenizer_(&tokenizer),
      params_(std::move(params)),
      eos_ids_(std::move(eos_ids)),
      on_text_(std::move(on_text)),
      prompt_(prompt.begin(), prompt.end()),
      history_(prompt_),
      t0_(std::chrono::steady_clock::now()) {
  params_.validate();
  const int64_t n_prompt = static_cast<int64_t>(prompt_.size());
  DS_CHECK(n_prompt > 0, "[generate] the prompt is empty (no tokens)");
  if (context.encoder_decoder()) {
    DS_CHECK(n_prompt <= context.prompt_limit,
             "[generate] the source ({} tokens) exceeds the model's longest source of {} tokens; "
             "shorten the prompt",
             n_prompt, context.prompt_limit);
    DS_CHECK(params_.max_tokens + 1 <= context.context,
             "[generate] max_tokens ({}) + the decoder start token exceed the model's longest "
             "target of {} positions; lower max_tokens to at most {}",
             params_.max_tokens, context.context, context.context - 1);
    history_ = {context.decoder_start};
  } else {
    DS_CHECK(n_prompt + params_.max_tokens <= context.context,
             "[generate] the prompt ({} tokens) + max_tokens ({}) exceed the model's context "
             "length of {} tokens; shorten the prompt or lower max_tokens",
             n_prompt, params_.max_tokens, context.context);
  }
  history_prompt_ = static_cast<int64_t>(history_.size());
  r_.prompt_tokens = n_prompt;
  r_.finish_reason = "length";
}

void Sequence::prefilled() {
  r_.prefill_seconds = seconds_since(t0_);
  t1_ = std::chrono::steady_clock::now();
  prefilled_ = true;
}

void Sequence::finish(const char* reason) {
  r_.finish_reason = reason;
  if (prefilled_) r_.decode_seconds = seconds_since(t1_);
  done_ = true;
  // What was held back (a possible stop string's start, a UTF-8 tail) is final now.
  if (r_.finish_reason != "cancelled" && on_text_ && r_.text.size() > emitted_) {
    if (!on_text_(std::string_view(r_.text).substr(emitted_))) r_.finish_reason = "cancelled";
    emitted_ = r_.text.size();
  }
}

void Sequence::cancel() {
  if (!done_) finish("cancelled");
}

bool Sequence::advance(std::span<float> logits) {
  if (done_) return false;
  if (params_.max_tokens == 0) {
    finish("length");
    return false;
  }
  if (step_ > 0) ++r_.decode_steps;
  if (processor_) processor_(prompt_, history_, logits);
  const int32_t next =
      sample_next(logits, history_, history_prompt_, params_, static_cast<uint64_t>(step_));
  if (step_ == 0) r_.first_token_seconds = seconds_since(t0_);
  ++r_.completion_tokens;
  if (std::find(eos_ids_.begin(), eos_ids_.end(), next) != eos_ids_.end()) {
    finish("stop");
    return false;
  }
  r_.tokens.push_back(next);
  history_.push_back(next);
  r_.text = tokenizer_->decode(r_.tokens);
  if (!params_.stop.empty()) {
    // A stop string cannot start inside text already handed out (its possible starts are held
    // back), so the search starts there.
    if (size_t at = find_stop(r_.text, params_.stop, emitted_); at != std::string::npos) {
      r_.text.resize(at);
      finish("stop");
      return false;
    }
  }
  if (on_text_) {
    const size_t hold =
        std::max(stop_prefix_len(r_.text, params_.stop), incomplete_utf8_tail(r_.text));
    const size_t safe = r_.text.size() - std::min(hold, r_.text.size());
    if (safe > emitted_) {
      if (!on_text_(std::string_view(r_.text).substr(emitted_, safe - emitted_))) {
        finish("cancelled");
        return false;
      }
      emitted_ = safe;
    }
  }
  if (++step_ == params_.max_tokens) {
    finish("length");
    return false;
  }
  next_ = next;
  return true;
}

GenerationResult generate(models::IncrementalDecoder& decoder, const TextTokenizer& tokenizer,
                          std::span<const int32_t> prompt, const SamplingParams& params,
                          const std::vector<int32_t>& eos_ids, const TextCallback& on_text,
                          const CancelCheck& cancelled) {
  Sequence s(tokenizer, prompt, params, eos_ids, on_text, ContextBudget::of(decoder));
  if (cancelled && cancelled()) {
    s.cancel();
    return std::move(s.result());
  }
  decoder.reset();
  Tensor logits = decoder.forward(prompt);  // (1, V)
  s.prefilled();
  std::vector<float> row = logits.to_vector();
  while (s.advance(row)) {
    if (cancelled && cancelled()) {
      s.cancel();
      break;
    }
    const int32_t next = s.next_token();
    row = decoder.forward(std::span<const int32_t>(&next, 1)).to_vector();
  }
  return std::move(s.result());
}

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// A ds_train --output_dir: checkpoints (the `latest` file, global_step<N> folders) or its metrics.
bool is_run_folder(const fs::path& dir) {
  std::error_code ec;
  if (is_file(dir / "latest")) return true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("global_step", 0) == 0)
      return true;
  return false;
}

// config.json's model_type when it is one neither loader reads: refused by name, with what is
// supported (the decoder reader's own message would list the decoders only).
void check_model_type(const fs::path& folder) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::ifstream(folder / "config.json"));
  } catch (const nlohmann::json::exception&) {
    return;  // the readers say what is wrong with the file
  }
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return;
  const std::string type = j["model_type"].get<std::string>();
  const models::Family* f = models::find_family(type);
  if (f && f->kind != models::ModelKind::encoder_classifier) return;
  std::string why;
  if (type == "mt5" || type == "umt5")
    why = " (mT5 and UMT5 are not implemented yet; T5 is)";
  else if (f)
    why = " (an encoder classifier: it labels text, it does not generate any)";
  DS_THROW(
      "[serve] {}: model_type \"{}\" is not a family we generate with{}; supported: "
      "decoders {}; encoder-decoders {}",
      (folder / "config.json").string(), type, why, models::supported_model_types(),
      models::supported_model_types(models::ModelKind::seq2seq));
}

}  // namespace

fs::path model_folder(const fs::path& path) {
  std::error_code ec;
  DS_CHECK(fs::is_directory(path, ec),
           "[serve] {} is not a folder: give a Hugging Face model "
           "folder (config.json + model.safetensors) or a ds_train --output_dir",
           path.string());
  fs::path folder;
  if (is_file(path / "config.json"))
    folder = path;
  else if (is_file(path / "hf_model" / "config.json"))
    folder = path / "hf_model";  // a ds_train --output_dir: its Hugging Face export
  if (folder.empty()) {
    // A PEFT adapter (ds_train --only_optimize_lora's export): LoRA matrices without the base.
    for (const fs::path& d : {path, path / "hf_model"}) {
      if (!is_file(d / "adapter_config.json")) continue;
      std::string base = "its base model";
      try {
        const auto j = nlohmann::json::parse(std::ifstream(d / "adapter_config.json"));
        if (j.is_object() && j.contains("base_model_name_or_path") &&
            j["base_model_name_or_path"].is_string())
          base = "its base model " + j["base_model_name_or_path"].get<std::string>();
      } catch (const nlohmann::json::exception&) {
      }
      DS_THROW(
          "[serve] {} is a PEFT LoRA adapter (adapter_config.json + "
          "adapter_model.safetensors: the low-rank matrices over {}), not a whole model; "
          "ds_generate and ds_serve load whole models: export the merged model with ds_train "
          "--merge_lora (rerun the run's ds_train command with --resume_from_checkpoint "
          "latest --merge_lora: a complete run exports at once; docs/finetuning.md, "
          "\"Export\"), or merge with PEFT (merge_and_unload) and give that folder",
          d.string(), base);
    }
    DS_CHECK(!is_run_folder(path),
             "[serve] {} is a ds_train run folder (checkpoints) without an export in {}: give "
             "--model the folder the run exported to (its --export_hf, which the run's last "
             "lines name), or export the checkpoint: ds_to_fp32 {} {} (docs/checkpoints.md)",
             path.string(), (path / "hf_model").string(), path.string(),
             (path / "hf_model").string());
    DS_THROW(
        "[serve] {} holds no config.json (nor hf_model/config.json): give a Hugging Face "
        "model folder or a ds_train --output_dir",
        path.string());
  }
  check_model_type(folder);
  return folder;
}

DType decode_dtype(const std::string& name, const fs::path& path) {
  if (name == "fp32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  DS_CHECK(name == "auto", "[serve] --dtype {}: use fp32, bf16 or auto (the checkpoint's)", name);
  const fs::path folder = model_folder(path);
  std::ifstream in(folder / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  for (const char* key : {"dtype", "torch_dtype"})
    if (j.is_object() && j.contains(key) && j[key].is_string())
      return j[key].get<std::string>() == "bfloat16" ? DType::bf16 : DType::f32;
  return DType::f32;
}

LoadedModel load_model(const fs::path& path, const fs::path& tokenizer_dir, Device device,
                       DType dtype) {
  LoadedModel m;
  const fs::path folder = model_folder(path);
  DS_CHECK(dtype == DType::f32 || dtype == DType::bf16,
           "[serve] models decode in fp32 or bf16, not {}", dtype_name(dtype));
  m.dtype = dtype;
  if (auto s2s = models::read_hf_seq2seq_config(folder)) {
    m.seq2seq = std::make_shared<models::Seq2Seq>(*s2s, /*init=*/false);
    // bf16 as below: the parameters one bf16 buffer before the weights are read (final_logits_bias,
    // a buffer, stays fp32 and is rounded where the logits are added).
    if (dtype != DType::f32)
      nn::flatten_parameters(*m.seq2seq, dtype, DType::f32, 1, /*with_grads=*/false);
    models::load_hf_seq2seq_weights(*m.seq2seq, folder);
    m.seq2seq->train(false);
    m.seq2seq_options = models::read_hf_generation_options(folder, *s2s);
  }
  const std::optional<models::GPTConfig> cfg =
      m.seq2seq ? std::nullopt : models::read_hf_config(folder);
  if (cfg) {
    models::check_model_fits(*cfg, DType::f32, available_memory_bytes(),
                             (folder / "config.json").string());
    m.model = std::make_shared<models::GPT>(*cfg, /*init=*/false);
    // bf16: every parameter a view of one bf16 buffer before the weights are read, so that a bf16
    // checkpoint's values arrive as they are (an fp32 one's rounded to nearest even).
    if (dtype != DType::f32)
      nn::flatten_parameters(*m.model, dtype, DType::f32, 1, /*with_grads=*/false);
    models::load_hf_weights(*m.model, folder);
    m.model->train(false);
  }
  if (!device.is_cpu()) {
    backend::get(device);  // registers it (a build without CUDA, or no GPU, says so here)
    if (m.seq2seq) m.seq2seq->to(device);
    if (m.model) m.model->to(device);
  }
  const int64_t vocab = m.vocab_size();
  if (has_tokenizer_files(folder))
    m.tokenizer = load_text_tokenizer(folder);
  else if (!tokenizer_dir.empty())
    m.tokenizer = load_text_tokenizer(tokenizer_dir);
  else if (vocab == 257)
    m.tokenizer = make_byte_tokenizer();
  else
    DS_THROW(
        "[serve] {} holds no tokenizer (tokenizer.json, tokenizer.model, vocab.json + merges.txt "
        "or encoder.json + vocab.bpe); pass --tokenizer <folder>",
        folder.string());
  DS_CHECK(m.tokenizer->vocab_size() <= vocab,
           "[serve] the tokenizer has {} ids but the model's vocabulary only {}: wrong tokenizer?",
           m.tokenizer->vocab_size(), vocab);
  m.defaults = GenerationDefaults::load(folder);
  m.eos_ids = m.tokenizer->eos_ids();
  if (m.seq2seq) {
    // transformers' GenerationConfig: do_sample false unless set (ds_generate decodes greedily).
    if (!m.defaults.do_sample) m.defaults.do_sample = false;
    const int64_t eos = m.seq2seq_options.eos_token_id == -2 ? m.seq2seq->config().eos_token_id
                                                             : m.seq2seq_options.eos_token_id;
    if (eos >= 0) m.defaults.eos_token_ids.push_back(static_cast<int32_t>(eos));
  }
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
            fmt::format("chat template not recognised, using {}: {}",
                        m.seq2seq ? "the turns joined as BlenderBot does" : "chatml", e.what());
      }
    }
    // Turn-end tokens of the chat formats end a chat answer (they are special: decode hides them).
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"})
      if (int32_t id = hf->token_to_id(t); id >= 0) m.chat_eos_ids.push_back(id);
  }
  // Encoder-decoders without a template of their own: ds_serve joins the turns (BlenderBot's way).
  if (!m.chat_template && !m.seq2seq) m.chat_template = data::ChatTemplate::by_name("chatml");
  for (int32_t id : m.eos_ids)
    if (std::find(m.chat_eos_ids.begin(), m.chat_eos_ids.end(), id) == m.chat_eos_ids.end())
      m.chat_eos_ids.push_back(id);
  fs::path norm = fs::absolute(path).lexically_normal();
  m.id = norm.has_filename() ? norm.filename().string() : norm.parent_path().filename().string();
  m.folder = folder;
  return m;
}

std::unique_ptr<models::IncrementalDecoder> LoadedModel::make_decoder() const {
  if (seq2seq) return models::make_decoder(seq2seq);
  DS_CHECK(model != nullptr, "[serve] no model loaded");
  return models::make_decoder(model);
}

int64_t LoadedModel::vocab_size() const {
  if (seq2seq) return seq2seq->config().vocab_size;
  DS_CHECK(model != nullptr, "[serve] no model loaded");
  return model->config().vocab_size;
}

}  // namespace ds::serve
