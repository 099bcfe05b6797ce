#pragma once
// Reads HTTP/1.x requests off one connection with deadlines and size limits, before cpp-httplib
// sees them (http_server.h hands httplib each request from memory).
//
// cpp-httplib 0.11.4 (Debian 12's, a compiled library) reads a request with a per-recv() timeout
// only, so a client that sends a header line every few seconds holds its connection thread
// forever (slowloris); it reads chunked bodies whole, whatever the payload limit; it takes the
// first of two differing Content-Length headers; and it reads each request of a connection
// through a fresh buffered stream, dropping the bytes of pipelined requests that the previous
// read had buffered. This reader closes those holes:
//
//   - the request line and headers must arrive within `header_seconds` of their first byte, the
//     body within `body_seconds` of the headers' end (408 otherwise), and a kept-alive connection
//     may sit idle `idle_seconds` between requests;
//   - a body over `max_body_bytes` is refused (413) as soon as its size is known: at once for a
//     Content-Length, while decoding for a chunked body (which is never buffered past the limit);
//   - differing Content-Length values, Content-Length with Transfer-Encoding, a malformed chunk
//     (400), a transfer coding other than chunked (501), a head over `max_head_bytes` (431) and
//     an Expect other than 100-continue (417) are refused; 100-continue is answered when the
//     body is acceptable;
//   - bytes after a request stay buffered for the next one (pipelining: answered in order).
//
// A request it accepts is rewritten for httplib: CRLF line ends, one Content-Length, the body
// de-chunked, no Expect, and `Connection: close` for HTTP/1.0 (whose streaming replies are then
// close-delimited, never chunked). A refusal always ends the connection.
//
//   RequestReader r(fd, limits, [&] { return stopping; });
//   for (bool first = true;; first = false) {
//     ReadResult q = r.next(first);
//     if (q.kind != ReadResult::kRequest) break;   // kReject: answer q.status, then close
//     ... serve q.request
//   }
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace ds::serve {

struct ReadLimits {
  size_t max_body_bytes = 1 << 20;
  size_t max_head_bytes = 64 << 10;  // request line + headers
  double header_seconds = 10.0;      // the head, from its first byte
  double body_seconds = 30.0;        // the body, from the end of the head
  double idle_seconds = 5.0;         // between requests of a kept-alive connection
};

struct ReadResult {
  enum Kind { kRequest, kClosed, kReject };
  Kind kind = kClosed;
  std::string request;                // kRequest: the request as httplib is given it
  std::string method, path, version;  // as far as they were read (for the log and metrics)
  int status = 0;                     // kReject: the status to answer
  std::string message, param;         // kReject: the error's message and field
};

class RequestReader {
 public:
  // fd: a connected socket (not owned). stopping: polled while waiting; true ends the wait.
  RequestReader(int fd, ReadLimits limits, std::function<bool()> stopping);
  // The next request. first: the connection's first (it may wait header_seconds for its first
  // byte, a later one idle_seconds). kClosed: the peer closed, stayed idle, or stopping().
  ReadResult next(bool first);

 private:
  using Clock = std::chrono::steady_clock;
  enum class Fill { kOk, kTimeout, kEof, kStop };
  // Appends what the socket has to buf_, waiting until `deadline` for at least one byte.
  Fill fill(Clock::time_point deadline);
  // The next request's head (request line and headers, through the empty line) taken off buf_;
  // nullopt with r set when there is none: the connection went idle or closed (r.kind stays
  // kNone), or the head is late or too large (a rejection).
  std::optional<std::string> read_head(ReadResult& r, bool first);
  ReadResult read_body(ReadResult& r, size_t content_length, bool chunked, bool expect_continue,
                       std::string& body);

  int fd_;
  ReadLimits limits_;
  std::function<bool()> stopping_;
  std::string buf_;  // read, not yet consumed (the start of the next request)
};

// "HTTP/1.1 <status> <reason>\r\n..." with a JSON body and Connection: close, for the refusals
// answered outside httplib (Retry-After: 1 with 503).
std::string raw_json_response(int status, const std::string& json_body);

}  // namespace ds::serve
