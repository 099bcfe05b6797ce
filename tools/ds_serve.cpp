// ds_serve: an HTTP server for a model: the ChatGLM guide's POST / and an OpenAI-compatible API.
//
//   ds_serve --model out/hf_model --port 8000
//   curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
//        -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32}'
//
// docs/serving.md documents the routes, fields, errors and limits.
#include <csignal>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/parallel.h"
#include "serve/server.h"

namespace {
ds::serve::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ds_serve: serve a model over HTTP (ChatGLM guide API + OpenAI API)"};
  std::string model, tokenizer;
  ds::serve::ServerOptions o;
  int threads = 0;
  app.add_option("--model", model, "Hugging Face folder or ds_train --output_dir")->required();
  app.add_option("--tokenizer", tokenizer,
                 "folder with vocab.json + merges.txt (or encoder.json + vocab.bpe) when the model "
                 "folder has none");
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--threads", threads, "compute threads (default: all cores)")
      ->check(CLI::Range(1, 1 << 12));
  app.add_option("--http_threads", o.http_threads, "connection threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--max_queue", o.max_queue,
                 "generation requests that may wait while one runs; more answer 503 with "
                 "Retry-After")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_body_bytes", o.max_body_bytes, "larger request bodies answer 413")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (threads > 0) ds::set_num_threads(threads);
    ds::serve::LoadedModel m = ds::serve::load_model(model, tokenizer);
    const auto& c = m.model->config();
    const std::string desc =
        fmt::format("{} ({} layout, {:.1f}M parameters, context {}, tokenizer {})", m.id,
                    ds::nn::layout_name(c.layout), static_cast<double>(c.num_parameters()) / 1e6,
                    c.block_size, m.tokenizer->name());
    const std::string chat_note =
        fmt::format("chat format {}{}", m.chat_template->name(),
                    m.chat_template_note.empty() ? "" : " (" + m.chat_template_note + ")");
    ds::serve::Server server(std::move(m), o);
    const int port = server.bind();
    g_server = &server;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::fprintf(stderr,
                 "ds_serve: %s on http://%s:%d (%d compute threads; one generation at a "
                 "time)\n",
                 desc.c_str(), o.host.c_str(), port, ds::num_threads());
    server.run();
    g_server = nullptr;
    std::fprintf(stderr, "ds_serve: stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds_serve: error: %s\n", e.what());
    return 1;
  }
}
