#pragma once
// ds_serve's HTTP server (cpp-httplib): the ChatGLM guide's POST /, OpenAI's /v1/completions and
// /v1/chat/completions (with stream: true as server-sent events), GET /v1/models, GET /health and
// GET /metrics (Prometheus text format, metrics.h).
// Request parsing lives in ds/serve/api.h; this file only routes, runs generations and writes
// replies. docs/serving.md documents the API.
//
// Concurrency: each connection gets a thread at once, up to max_connections (http_server.h: read
// deadlines, body limits, pipelining); httplib parses and routes; generations run on one scheduler
// thread that owns the model (ds/serve/scheduler.h: continuous batching): up to `max_batch`
// share each decode step, up to `max_queue` more wait for a place, admitted in arrival order, and
// the next is answered 503 (admission.h). Text comes back to the connection's thread, which writes
// it. A client that goes away, waiting or generating, streaming or not, is noticed within a token
// (connection.h): its generation stops and its slot is freed. drain() is the graceful stop of
// SIGTERM. Bad input never ends the server: every handler error is a JSON reply (400 for bad
// fields, 413 for a body over the size limit, 404 for an unknown route, 503 when busy or shutting
// down, 415 for a JSON route's body without Content-Type: application/json, 408/431/501 for
// requests refused while reading them (request_reader.h), 500 for an internal error).
//
//   ds::serve::Server s(ds::serve::load_model(dir), {.host = "127.0.0.1", .port = 0});
//   int port = s.bind();            // 0 = an ephemeral port
//   std::thread t([&] { s.run(); });
//   ...; s.stop(); t.join();
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "ds/serve/generate.h"

namespace ds::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0 = any free port (bind() returns it)
  size_t max_body_bytes = 1 << 20;  // larger request bodies answer 413 (chunked ones too)
  int http_threads = 8;             // idle connection threads kept ready (more start on demand)
  int max_connections = 256;        // open connections; one more answers 503 and is closed
  double header_timeout_seconds = 10.0;  // the request line and headers, from their first byte
  double body_timeout_seconds = 30.0;    // the body, from the end of the headers (408 after)
  double keep_alive_seconds = 5.0;       // idle time between requests on one connection
  int listen_backlog = 511;              // connections the kernel holds before accept() (nginx's)
  int max_batch = 8;                     // generations that share a decode step; 1 = one at a time
  int max_queue = 16;                    // generation requests that may wait; more answer 503
  double sse_ping_seconds = 15.0;        // ": ping" to a stream waiting for its turn; 0 = never
  bool log_requests = true;              // one line per request on stderr
};

class Server {
 public:
  Server(LoadedModel model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws "[ds_serve] ..." when it cannot.
  int bind();
  // Serves until stop(); call after bind().
  void run();
  // Stops at once: open streams are cut.
  void stop();
  // A graceful stop (ds_serve on SIGTERM/SIGINT): new generation requests answer 503
  // ("shutting_down") and /health 503 {"status": "draining"}; admitted ones, waiting or running,
  // finish; then stop(). After timeout_seconds, or as soon as force() returns true, the ones left
  // are cancelled at their next token. Blocks until stopped; call from a thread other than run()'s.
  void drain(double timeout_seconds, const std::function<bool()>& force = {});
  bool draining() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::serve
