// ds_generate: load a model and its tokenizer, generate one completion, print it.
//
//   ds_generate --model out/hf_model --prompt "Once upon a time" --max_tokens 64 --temperature 0
//
// The completion goes to stdout; the load time and the prefill and decode speeds to stderr.
// --model is a Hugging Face folder (config.json + safetensors) or a ds_train --output_dir.
// --dtype bf16 (or auto on a bfloat16 checkpoint) keeps the weights and the KV cache in bf16
// (decoder-only models and encoder-decoders alike).
// docs/serving.md has the sampling parameters and their defaults.
//
// An encoder-decoder folder (config.json model_type bart, blenderbot or t5, e.g. ds_train's export
// of a seq2seq run) takes the source text and prints the generated target: greedy or beam search
// (transformers' generate(do_sample=False)), the defaults from the folder's
// generation_config.json, else its config.json's generation keys, else transformers 5's
// (models::read_hf_generation_options), overridden by --num_beams, --max_new_tokens,
// --min_length, --no_repeat_ngram_size and --length_penalty. Float options must be finite numbers
// (nan and inf are refused by name).
//
//   ds_generate --model out/chat/hf_model --prompt "How are you?" --num_beams 4
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/data/seq2seq_set.h"
#include "ds/data/text_tokenizer.h"
#include "ds/models/family.h"
#include "ds/models/recorded_model.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/flat.h"
#include "ds/serve/api.h"
#include "ds/serve/generate.h"
#include "ds/train/plan.h"

namespace {

namespace fs = std::filesystem;
using namespace ds;

// The seq2seq options as given (nullopt: the folder's generation_config.json decides).
struct Seq2SeqFlags {
  std::optional<int64_t> num_beams, max_new_tokens, min_length, no_repeat_ngram_size;
  std::optional<float> length_penalty;
};

int generate_seq2seq(const fs::path& dir, const std::string& source, const std::string& tok_dir,
                     const Seq2SeqFlags& f, Device device, DType dtype) {
  const auto t0 = std::chrono::steady_clock::now();
  const models::Seq2SeqConfig cfg = *models::read_hf_seq2seq_config(dir);
  models::Seq2Seq model(cfg, /*init=*/false);
  // bf16: the parameters one bf16 buffer before the weights are read (serve::load_model's way);
  // the encoder, both attention caches and the decoder then run in bf16, the logits widened.
  if (dtype != DType::f32)
    nn::flatten_parameters(model, dtype, DType::f32, 1, /*with_grads=*/false);
  models::load_hf_seq2seq_weights(model, dir);
  model.train(false);
  if (!device.is_cpu()) {
    backend::get(device);  // registers it (a build without CUDA, or no GPU, says so here)
    model.to(device);
  }
  const fs::path tdir = data::has_tokenizer_files(dir) ? dir : fs::path(tok_dir);
  DS_CHECK(!tdir.empty(),
           "[ds_generate] {} holds no tokenizer (tokenizer.json, vocab.json + merges.txt, ...); "
           "give --tokenizer",
           dir.string());
  const auto tok = data::load_tokenizer(tdir);
  models::BeamOptions opt = models::read_hf_generation_options(dir, cfg);
  if (f.num_beams) opt.num_beams = *f.num_beams;
  if (f.max_new_tokens) opt.max_new_tokens = *f.max_new_tokens;
  if (f.min_length) opt.min_length = *f.min_length;
  if (f.no_repeat_ngram_size) opt.no_repeat_ngram_size = *f.no_repeat_ngram_size;
  if (f.length_penalty) opt.length_penalty = *f.length_penalty;
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The source as the tokenizer encodes it for the model: the template (<s> x </s>), cut to the
  // model's positions.
  const std::vector<int32_t> src =
      data::encode_seq2seq_text(*tok, source, static_cast<size_t>(cfg.max_positions)).ids;
  const int64_t S = static_cast<int64_t>(src.size());
  const Tensor ids = Tensor::from_ints(std::vector<int64_t>(src.begin(), src.end()), {1, S});
  const Tensor mask = Tensor::from_ints(std::vector<int64_t>(static_cast<size_t>(S), 1), {1, S});
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<int64_t> out = model.generate(ids, mask, opt).to_int_vector();
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::vector<int32_t> tokens;
  for (size_t k = 1; k < out.size(); ++k) {
    if (out[k] == cfg.eos_token_id) break;
    if (out[k] != cfg.pad_token_id) tokens.push_back(static_cast<int32_t>(out[k]));
  }
  const std::string text = tok->decode(tokens, true);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fprintf(
      stderr, "%s",
      fmt::format("ds_generate: {} ({} encoder-decoder, {:.1f}M parameters in {}, tokenizer "
                  "{}) loaded in {:.2f}s on {}; {} threads\n",
                  dir.string(), cfg.family, static_cast<double>(cfg.num_parameters()) / 1e6,
                  dtype_name(dtype), tdir.string(), load_s, device.str(), ds::num_threads())
          .c_str());
  std::fprintf(stderr, "%s",
               fmt::format("ds_generate: source {} tokens; {} ({} beams, max_new_tokens {}, "
                           "min_length {}, no_repeat_ngram_size {}, length_penalty {}): {} "
                           "tokens in {:.3f}s\n",
                           S, opt.num_beams > 1 ? "beam search" : "greedy", opt.num_beams,
                           opt.max_new_tokens, opt.min_length, opt.no_repeat_ngram_size,
                           opt.length_penalty, out.empty() ? 0 : out.size() - 1, gen_s)
                   .c_str());
  return 0;
}

// Every option's value, and the options whose presence matters.
struct Args {
  std::string model, prompt, tokenizer, device_name = "cpu", dtype_opt = "fp32";
  ds::serve::RequestSampling s;
  float temperature = 0, top_p = 0, rep = 0, length_penalty = 1.0f;
  int64_t max_tokens = 0, top_k = 0, beams = 0, max_new = 0, min_len = 0, no_repeat = 0;
  uint64_t seed = 0;
  int threads = 0;
  bool ignore_eos = false;
  CLI::Option *beams_opt = nullptr, *new_opt = nullptr, *min_opt = nullptr, *nr_opt = nullptr,
              *lp_opt = nullptr, *max_opt = nullptr, *t_opt = nullptr, *k_opt = nullptr,
              *p_opt = nullptr, *r_opt = nullptr;
};

void add_common_options(CLI::App& app, Args& a) {
  app.add_option("--model", a.model, "Hugging Face folder or ds_train --output_dir")->required();
  app.add_option("--device", a.device_name,
                 "where the model runs: cpu, cuda (a -DDS_WITH_CUDA=ON build) or sim (the device "
                 "emulator, for tests)")
      ->capture_default_str();
  app.add_option("--dtype", a.dtype_opt,
                 "the weights' and KV cache's dtype: fp32, bf16 or auto (the "
                 "checkpoint's: config.json's dtype bfloat16 gives bf16, else fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}));
  app.add_option("--prompt,--source", a.prompt,
                 "the prompt text (encoder-decoders: the source text)")
      ->required();
  app.add_option("--tokenizer", a.tokenizer,
                 "folder with vocab.json + merges.txt (or encoder.json + vocab.bpe) when the model "
                 "folder has none");
  app.add_option("--threads", a.threads, "compute threads (default: all cores)")
      ->check(CLI::Range(1, 1 << 12));
}

// Greedy and beam search of encoder-decoders.
void add_seq2seq_options(CLI::App& app, Args& a) {
  a.beams_opt = app.add_option("--num_beams", a.beams,
                               "encoder-decoders: beams (1 = greedy; default: "
                               "generation_config.json's)")
                    ->check(CLI::Range(int64_t{1}, int64_t{256}));
  a.new_opt = app.add_option("--max_new_tokens", a.max_new,
                             "encoder-decoders: new tokens at most (default: the folder's "
                             "max_new_tokens, else max_length - 1, else 20 as transformers)")
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  a.min_opt = app.add_option("--min_length", a.min_len,
                             "encoder-decoders: eos banned before this length (the decoder "
                             "start token counts)")
                  ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  a.nr_opt = app.add_option("--no_repeat_ngram_size", a.no_repeat,
                            "encoder-decoders: no n-gram of this size twice (0 = off)")
                 ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  a.lp_opt = app.add_option("--length_penalty", a.length_penalty,
                            "encoder-decoders, beam search: score = log p / length^this")
                 ->check(ds::tools::finite_number())
                 ->check(CLI::Range(-100.0, 100.0));
}

// Sampling of decoder models.
void add_sampling_options(CLI::App& app, Args& a) {
  a.max_opt = app.add_option("--max_tokens", a.max_tokens,
                             "new tokens at most (default: generation_config.json's "
                             "max_new_tokens, else 64)")
                  ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  a.t_opt = app.add_option("--temperature", a.temperature, "0 = greedy (default 1)")
                ->check(ds::tools::finite_number())
                ->check(CLI::Range(0.0, 100.0));
  a.k_opt = app.add_option("--top_k", a.top_k, "keep the k most likely tokens (0 = off)")
                ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  a.p_opt = app.add_option("--top_p", a.top_p, "nucleus sampling, (0, 1] (1 = off)")
                ->check(ds::tools::finite_number())
                ->check(CLI::Range(1e-9, 1.0));
  a.r_opt = app.add_option("--repetition_penalty", a.rep, "> 0 (1 = off)")
                ->check(ds::tools::finite_number())
                ->check(CLI::Range(1e-9, 100.0));
  app.add_option("--seed", a.seed, "sampling seed (default 0)");
  app.add_option("--stop", a.s.stop, "stop string (repeat for several)");
  app.add_flag("--ignore_eos", a.ignore_eos,
               "generate max_tokens even past the end-of-sequence token (benchmarks)");
}

// The encoder-decoder in `dir`: sampling is not implemented for them, so its options are refused
// by name; the search options given override the folder's.
int run_seq2seq(const Args& a, const fs::path& dir, Device device) {
  for (CLI::Option* op : {a.t_opt, a.k_opt, a.p_opt, a.r_opt, a.max_opt})
    DS_CHECK(op->count() == 0,
             "[ds_generate] {} does not apply to the encoder-decoder in {} (greedy or beam "
             "search: --num_beams, --max_new_tokens, --min_length, --no_repeat_ngram_size, "
             "--length_penalty)",
             op->get_name(), dir.string());
  DS_CHECK(a.s.stop.empty() && !a.ignore_eos,
           "[ds_generate] --stop / --ignore_eos do not apply to the encoder-decoder in {}",
           dir.string());
  Seq2SeqFlags f;
  if (*a.beams_opt) f.num_beams = a.beams;
  if (*a.new_opt) f.max_new_tokens = a.max_new;
  if (*a.min_opt) f.min_length = a.min_len;
  if (*a.nr_opt) f.no_repeat_ngram_size = a.no_repeat;
  if (*a.lp_opt) f.length_penalty = a.length_penalty;
  return generate_seq2seq(dir, a.prompt, a.tokenizer, f, device,
                          ds::serve::decode_dtype(a.dtype_opt, dir));
}

// A decoder model: the prompt's completion streamed to stdout, the speeds to stderr.
int run_decoder(const Args& a, Device device) {
  for (CLI::Option* op : {a.beams_opt, a.new_opt, a.min_opt, a.nr_opt, a.lp_opt})
    DS_CHECK(op->count() == 0,
             "[ds_generate] {} applies to encoder-decoders (BART, BlenderBot, T5) only; {} is a "
             "decoder model (use --max_tokens, --temperature, --top_k, --top_p)",
             op->get_name(), a.model);
  const auto t0 = std::chrono::steady_clock::now();
  const ds::DType dtype = ds::serve::decode_dtype(a.dtype_opt, a.model);
  ds::serve::LoadedModel m = ds::serve::load_model(a.model, a.tokenizer, device, dtype);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ds::serve::RequestSampling s = a.s;
  if (*a.t_opt) s.temperature = a.temperature;
  if (*a.k_opt) s.top_k = a.top_k;
  if (*a.p_opt) s.top_p = a.top_p;
  if (*a.r_opt) s.repetition_penalty = a.rep;
  if (*a.max_opt) s.max_tokens = a.max_tokens;
  s.seed = a.seed;
  const ds::serve::SamplingParams p = s.resolve(m.defaults, 64);
  const std::vector<int32_t> ids = m.tokenizer->encode(a.prompt);
  if (a.ignore_eos) m.eos_ids.clear();
  const auto dec = ds::models::make_decoder(m.model);
  const auto r =
      ds::serve::generate(*dec, *m.tokenizer, ids, p, m.eos_ids, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
  std::fputc('\n', stdout);
  const auto& c = m.model->config();
  std::fprintf(stderr, "%s",
               fmt::format("ds_generate: {} ({} layout, {:.1f}M parameters in {}, tokenizer "
                           "{}) loaded in {:.2f}s on {}; {} threads\n",
                           m.id, ds::nn::layout_name(c.layout),
                           static_cast<double>(c.num_parameters()) / 1e6, ds::dtype_name(m.dtype),
                           m.tokenizer->name(), load_s, device.str(), ds::num_threads())
                   .c_str());
  std::fprintf(
      stderr, "%s",
      fmt::format("ds_generate: prefill {} tokens in {:.3f}s = {:.1f} tokens/s; decode {} "
                  "tokens in {:.3f}s = {:.1f} tokens/s; finish_reason {}\n",
                  r.prompt_tokens, r.prefill_seconds,
                  static_cast<double>(r.prompt_tokens) / std::max(r.prefill_seconds, 1e-9),
                  r.decode_steps, r.decode_seconds,
                  static_cast<double>(r.decode_steps) / std::max(r.decode_seconds, 1e-9),
                  r.finish_reason)
          .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ds_generate: one completion from a model (KV-cache decoding)"};
  Args a;
  add_common_options(app, a);
  add_seq2seq_options(app, a);
  add_sampling_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (a.threads > 0) ds::set_num_threads(a.threads);
    const Device device = train::parse_device(a.device_name);
    // The model's folder first: an adapter, a run folder without export or a family we do not
    // generate with is refused for what it is, before any option is judged against it.
    const fs::path dir = ds::serve::model_folder(a.model);
    if (const ds::models::Family* f = ds::models::hf_folder_family(dir);
        f && f->kind == ds::models::ModelKind::seq2seq)
      return run_seq2seq(a, dir, device);
    return run_decoder(a, device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds_generate: error: %s\n", e.what());
    return 1;
  }
}
