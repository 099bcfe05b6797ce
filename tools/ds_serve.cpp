// ds_serve: an HTTP server for a model: the ChatGLM guide's POST / and an OpenAI-compatible API.
//
//   ds_serve --model out/hf_model --port 8000
//   curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
//        -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32}'
//
// docs/serving.md documents the routes, fields, errors and limits.
#include <atomic>
#include <chrono>
#include <csignal>
#include <limits>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "ds/core/parallel.h"
#include "ds/models/seq2seq_decoder.h"
#include "ds/train/plan.h"
#include "serve/server.h"

namespace {
// SIGINT/SIGTERM only count here (a signal handler may do little else); a watcher thread drains.
std::atomic<int> g_signals{0};
void on_signal(int) {
  g_signals.fetch_add(1);
}
// The options as given.
struct Args {
  std::string model, tokenizer, device_name = "cpu", dtype_opt = "fp32";
  ds::serve::ServerOptions o;
  int threads = 0;
  double drain_timeout = 60.0;
};

// The model, where it runs and in which dtype.
void add_model_options(CLI::App& app, Args& a) {
  app.add_option("--model", a.model, "Hugging Face folder or ds_train --output_dir")->required();
  app.add_option("--device", a.device_name,
                 "where the model runs: cpu, cuda (a -DDS_WITH_CUDA=ON build) or sim (the device "
                 "emulator, for tests)")
      ->capture_default_str();
  app.add_option("--dtype", a.dtype_opt,
                 "the weights' and KV caches' dtype: fp32, bf16 or auto (the "
                 "checkpoint's: config.json's dtype bfloat16 gives bf16, else fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}));
  app.add_option("--tokenizer", a.tokenizer,
                 "folder with vocab.json + merges.txt (or encoder.json + vocab.bpe) when the model "
                 "folder has none");
  app.add_option("--threads", a.threads, "compute threads (default: all cores)")
      ->check(CLI::Range(1, 1 << 12));
  app.add_option("--max_batch", a.o.max_batch,
                 "generations that share each decode step (continuous batching); 1 = one at a time")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--max_queue", a.o.max_queue,
                 "generation requests that may wait for a place in the batch; more answer 503 "
                 "with Retry-After")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// Seconds, with the finite-number and range checks every timeout shares.
CLI::Option* add_seconds(CLI::App& app, const std::string& name, double& var,
                         const std::string& help, double lo, double hi) {
  return app.add_option(name, var, help)
      ->check(ds::tools::finite_number())
      ->capture_default_str()
      ->check(CLI::Range(lo, hi));
}

// The HTTP side: address, connections, limits and timeouts.
void add_http_options(CLI::App& app, Args& a) {
  app.add_option("--host", a.o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", a.o.port, "port (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--http_threads", a.o.http_threads,
                 "connection threads kept ready (more start on demand, one per connection, up to "
                 "--max_connections)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--max_connections", a.o.max_connections,
                 "open connections served at once; one more is answered 503 and closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 900));
  add_seconds(app, "--header_timeout", a.o.header_timeout_seconds,
              "seconds a request's line and headers may take to arrive (408 after)", 0.1, 3600.0);
  add_seconds(app, "--body_timeout", a.o.body_timeout_seconds,
              "seconds a request's body may take to arrive after its headers (408 after)", 0.1,
              3600.0);
  app.add_option("--max_body_bytes", a.o.max_body_bytes,
                 "larger request bodies answer 413 (chunked ones too, while reading)")
      ->capture_default_str();
  constexpr double kNoLimit = std::numeric_limits<double>::max();
  add_seconds(app, "--sse_ping_seconds", a.o.sse_ping_seconds,
              "a streaming request waiting for its turn gets an SSE comment (: ping) this often, "
              "so that clients and proxies do not time it out (0 = never)",
              0.0, kNoLimit);
  add_seconds(app, "--drain_timeout", a.drain_timeout,
              "seconds that requests in flight may take to finish after SIGTERM/SIGINT before "
              "they are cancelled (a second signal cancels them at once)",
              0.0, kNoLimit);
}

// The start-up lines: the model; its KV-cache budget and chat format.
std::pair<std::string, std::string> describe(const ds::serve::LoadedModel& m, int max_batch) {
  std::string desc;
  double kv_mib = 0.0;  // the KV caches: one per running sequence, each at its longest
  if (m.seq2seq) {
    // The target's self-attention (its positions) and the source's cross-attention (as many).
    const auto& c = m.seq2seq->config();
    const ds::models::Seq2SeqDecoder probe(m.seq2seq);
    kv_mib = static_cast<double>(probe.cache_bytes_limit()) / (1 << 20);
    desc = fmt::format(
        "{} ({} encoder-decoder, {:.1f}M parameters in {}, source and target up to {} tokens, "
        "tokenizer {})",
        m.id, c.family, static_cast<double>(c.num_parameters()) / 1e6, ds::dtype_name(m.dtype),
        probe.capacity_limit(), m.tokenizer->name());
  } else {
    const auto& c = m.model->config();
    desc = fmt::format("{} ({} layout, {:.1f}M parameters in {}, context {}, tokenizer {})", m.id,
                       ds::nn::layout_name(c.layout),
                       static_cast<double>(c.num_parameters()) / 1e6, ds::dtype_name(m.dtype),
                       c.block_size, m.tokenizer->name());
    kv_mib = 2.0 *
             static_cast<double>(c.n_layer * c.block_size * c.kv_heads() * c.head_dim() *
                                 static_cast<int64_t>(ds::dtype_size(m.dtype))) /
             (1 << 20);
  }
  return {desc, fmt::format(
      "KV cache up to {:.1f} MiB per sequence, {:.1f} MiB for --max_batch {}; chat format {}{}",
      kv_mib, kv_mib * max_batch, max_batch,
      m.chat_template ? m.chat_template->name() : "turns joined as BlenderBot does",
      m.chat_template_note.empty() ? "" : " (" + m.chat_template_note + ")")};
}

// Serves until a signal drains the server: the first SIGINT/SIGTERM lets requests in flight finish
// (at most drain_timeout seconds), a second cancels them.
void serve(ds::serve::Server& server, double drain_timeout) {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::atomic<bool> stopped{false};
  std::thread watcher([&] {
    while (!stopped) {
      if (g_signals > 0) {
        std::fprintf(stderr,
                     "ds_serve: draining: new requests answer 503, the ones in flight finish "
                     "(at most %.0f s; signal again to cancel them)\n",
                     drain_timeout);
        server.drain(drain_timeout, [] { return g_signals > 1; });
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server.run();
  stopped = true;
  watcher.join();
}

int run(const Args& a) {
  if (a.threads > 0) ds::set_num_threads(a.threads);
  const ds::Device device = ds::train::parse_device(a.device_name);
  const ds::DType dtype = ds::serve::decode_dtype(a.dtype_opt, a.model);
  ds::serve::LoadedModel m = ds::serve::load_model(a.model, a.tokenizer, device, dtype);
  const auto [desc, budget] = describe(m, a.o.max_batch);
  ds::serve::Server server(std::move(m), a.o);
  const int port = server.bind();
  std::fprintf(stderr,
               "ds_serve: %s on http://%s:%d (%s, %d compute threads; up to %d generations per "
               "decode step)\nds_serve: %s\n",
               desc.c_str(), a.o.host.c_str(), port, device.str().c_str(), ds::num_threads(),
               a.o.max_batch, budget.c_str());
  serve(server, a.drain_timeout);
  std::fprintf(stderr, "ds_serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ds_serve: serve a model over HTTP (ChatGLM guide API + OpenAI API)"};
  Args a;
  add_model_options(app, a);
  add_http_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds_serve: error: %s\n", e.what());
    return 1;
  }
}
