#pragma once
// ds_serve's connection handling around cpp-httplib 0.11.4: who gets a thread, and how requests
// are read off a connection. httplib still parses each request, routes it and writes the reply.
//
// httplib's default serves connections from a fixed pool (--http_threads): one more connection
// than threads waits in an unbounded, uncounted queue, unadmitted, so a few idle or dripping
// connections (slowloris) or long streams stall everything, /health included, and the admission
// limit (max_batch + max_queue, admission.h) is never reached. Here instead:
//
//   - every connection gets a thread at once (ConnectionPool: `keep_threads` kept ready, more
//     started on demand), up to `max_connections` open; one beyond that is answered 503 at once
//     and closed. So a request is never queued behind idle connections or running generations;
//   - each request is read by a RequestReader (request_reader.h): deadlines for the head, the
//     body and keep-alive idling, the body limit enforced for chunked bodies too, conflicting
//     framing refused, pipelined requests answered in order; its refusals are answered here;
//   - the request is then handed to httplib's process_request from memory (RequestStream); the
//     reply goes straight to the socket.
//
// open() and queued() are /metrics' connection gauges (queued: accepted, waiting for a thread,
// which happens only beyond max_connections plus a few threads kept for answering 503s).
//
// Thread-safe as httplib::Server: configure, bind, then listen_after_bind() on one thread; stop()
// from any.
#include <atomic>
#include <functional>
#include <string>

#include <httplib.h>

#include "request_reader.h"

namespace ds::serve {

class HttpServer : public httplib::Server {
 public:
  struct Options {
    int keep_threads = 8;       // idle connection threads kept ready
    int max_connections = 256;  // open connections; more are answered 503
    ReadLimits read;
  };
  // A request refused before httplib saw it (over the connection limit, or by the reader): the
  // JSON body of its reply. Also where it is counted and logged.
  using RejectHandler = std::function<std::string(const ReadResult&)>;

  HttpServer(Options o, RejectHandler on_reject);

  // httplib 0.11.4 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library). Many clients connecting at once overflow it, and with SYN cookies (Linux's default)
  // some of those connections are then dropped without a reply. listen() again on the bound
  // socket sets the backlog we want; the socket is httplib's protected svr_sock_.
  bool set_backlog(int backlog);

  int open() const { return open_.load(); }
  int queued() const { return queued_.load(); }
  int max_connections() const { return opt_.max_connections; }

 private:
  bool process_and_close_socket(socket_t sock) override;
  void refuse(int sock, const ReadResult& r);

  Options opt_;
  RejectHandler on_reject_;
  std::atomic<int> open_{0}, queued_{0};
};

}  // namespace ds::serve
