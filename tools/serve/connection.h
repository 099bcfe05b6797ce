#pragma once
// Whether the client of a request has gone away, asked without writing to it.
//
// A streaming reply notices a departed client when a write fails, but a request that is waiting
// in the queue, in its prefill, or not streaming writes nothing until its end. cpp-httplib 0.11.4
// (Debian 12) gives handlers neither the socket nor Request::is_connection_closed (0.14+), so the
// connection is found by its addresses: the descriptor of this process whose local and peer
// addresses are the request's (getsockname/getpeername over /proc/self/fd). The four-tuple names
// one open TCP connection, and httplib keeps the socket open until the handler and its content
// provider have returned, so the descriptor cannot be reused under us while they run. closed()
// polls it for the peer's FIN or RST (POLLRDHUP/POLLHUP/POLLERR) without reading.
//
//   auto conn = ClientConnection::of(req);   // once, in the handler
//   if (conn.closed()) ... stop generating, free the slot
//
// A client that half-closes its side (shutdown(SHUT_WR)) after sending the request looks gone;
// HTTP clients do not do that. When no descriptor matches (not expected on Linux), closed() is
// always false and only a failed write cancels.
//
// Thread-safe: closed() is a poll() on a descriptor owned by httplib's connection thread; it may
// be called from any thread while the request is being served.
#include <string>

namespace httplib {
struct Request;
}

namespace ds::serve {

class ClientConnection {
 public:
  ClientConnection() = default;
  static ClientConnection of(const httplib::Request& req);
  bool closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace ds::serve
