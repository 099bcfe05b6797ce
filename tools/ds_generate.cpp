// ds_generate: load a model and its tokenizer, generate one completion, print it.
//
//   ds_generate --model out/hf_model --prompt "Once upon a time" --max_tokens 64 --temperature 0
//
// The completion goes to stdout; the load time and the prefill and decode speeds to stderr.
// --model is a Hugging Face folder (config.json + safetensors) or a ds_train --output_dir.
// docs/serving.md has the sampling parameters and their defaults.
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/parallel.h"
#include "ds/models/family.h"
#include "ds/serve/api.h"
#include "ds/serve/generate.h"

int main(int argc, char** argv) {
  CLI::App app{"ds_generate: one completion from a model (KV-cache decoding)"};
  std::string model, prompt, tokenizer;
  ds::serve::RequestSampling s;
  float temperature = 0, top_p = 0, rep = 0;
  int64_t max_tokens = 0, top_k = 0;
  uint64_t seed = 0;
  int threads = 0;
  bool ignore_eos = false;
  app.add_option("--model", model, "Hugging Face folder or ds_train --output_dir")->required();
  app.add_option("--prompt", prompt, "the prompt text")->required();
  app.add_option("--tokenizer", tokenizer,
                 "folder with vocab.json + merges.txt (or encoder.json + vocab.bpe) when the model "
                 "folder has none");
  auto* o_max = app.add_option("--max_tokens", max_tokens,
                               "new tokens at most (default: generation_config.json's "
                               "max_new_tokens, else 64)")
                    ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  auto* o_t = app.add_option("--temperature", temperature, "0 = greedy (default 1)")
                  ->check(CLI::Range(0.0, 100.0));
  auto* o_k = app.add_option("--top_k", top_k, "keep the k most likely tokens (0 = off)")
                  ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  auto* o_p = app.add_option("--top_p", top_p, "nucleus sampling, (0, 1] (1 = off)")
                  ->check(CLI::Range(1e-9, 1.0));
  auto* o_r =
      app.add_option("--repetition_penalty", rep, "> 0 (1 = off)")->check(CLI::Range(1e-9, 100.0));
  app.add_option("--seed", seed, "sampling seed (default 0)");
  app.add_option("--stop", s.stop, "stop string (repeat for several)");
  app.add_option("--threads", threads, "compute threads (default: all cores)")
      ->check(CLI::Range(1, 1 << 12));
  app.add_flag("--ignore_eos", ignore_eos,
               "generate max_tokens even past the end-of-sequence token (benchmarks)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (threads > 0) ds::set_num_threads(threads);
    const auto t0 = std::chrono::steady_clock::now();
    ds::serve::LoadedModel m = ds::serve::load_model(model, tokenizer);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (*o_t) s.temperature = temperature;
    if (*o_k) s.top_k = top_k;
    if (*o_p) s.top_p = top_p;
    if (*o_r) s.repetition_penalty = rep;
    if (*o_max) s.max_tokens = max_tokens;
    s.seed = seed;
    ds::serve::SamplingParams p = s.resolve(m.defaults, 64);
    const std::vector<int32_t> ids = m.tokenizer->encode(prompt);
    if (ignore_eos) m.eos_ids.clear();
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
                 fmt::format("ds_generate: {} ({} layout, {:.1f}M parameters, tokenizer {}) "
                             "loaded in {:.2f}s; {} threads\n",
                             m.id, ds::nn::layout_name(c.layout),
                             static_cast<double>(c.num_parameters()) / 1e6, m.tokenizer->name(),
                             load_s, ds::num_threads())
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds_generate: error: %s\n", e.what());
    return 1;
  }
}
