// Reading requests off a connection with deadlines and limits (request_reader.h).
#include "request_reader.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "ds/core/text.h"

namespace ds::serve {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

ReadResult reject(ReadResult r, int status, std::string message, std::string param = {}) {
  r.kind = ReadResult::kReject;
  r.status = status;
  r.message = std::move(message);
  r.param = std::move(param);
  return r;
}

// The end of the head in `s` (the index after its empty line), or npos.
size_t head_end(const std::string& s) {
  for (size_t pos = s.find('\n'); pos != std::string::npos; pos = s.find('\n', pos + 1)) {
    if (pos + 1 < s.size() && s[pos + 1] == '\n') return pos + 2;
    if (pos + 2 < s.size() && s[pos + 1] == '\r' && s[pos + 2] == '\n') return pos + 3;
  }
  return std::string::npos;
}

// One line of s from `pos` (without its \r\n or \n), or nullopt while it has no end yet.
std::optional<std::string_view> line_at(const std::string& s, size_t pos, size_t& next) {
  const size_t nl = s.find('\n', pos);
  if (nl == std::string::npos) return std::nullopt;
  next = nl + 1;
  size_t end = nl;
  if (end > pos && s[end - 1] == '\r') --end;
  return std::string_view(s).substr(pos, end - pos);
}

const char* reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace

std::string raw_json_response(int status, const std::string& json_body) {
  return fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n{}\r\n{}",
      status, reason(status), json_body.size(), status == 503 ? "Retry-After: 1\r\n" : "",
      json_body);
}

RequestReader::RequestReader(int fd, ReadLimits limits, std::function<bool()> stopping)
    : fd_(fd), limits_(limits), stopping_(std::move(stopping)) {}

RequestReader::Fill RequestReader::fill(Clock::time_point deadline) {
  char tmp[16384];
  for (;;) {
    if (stopping_ && stopping_()) return Fill::kStop;
    const auto now = Clock::now();
    if (now >= deadline) return Fill::kTimeout;
    // Wake every 100 ms to notice a stopping server.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 1, 100)));
    if (ready < 0 && errno != EINTR) return Fill::kEof;
    if (ready <= 0) continue;
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return Fill::kEof;
    buf_.append(tmp, static_cast<size_t>(n));
    return Fill::kOk;
  }
}

namespace {

std::chrono::steady_clock::time_point after(double seconds) {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, seconds)));
}

// METHOD /path HTTP/1.x into r (the path without its query); false when malformed.
bool parse_request_line(std::string_view line, ReadResult& r) {
  std::vector<std::string_view> parts;
  size_t a = 0;
  while (a <= line.size()) {
    size_t b = line.find(' ', a);
    if (b == std::string_view::npos) b = line.size();
    parts.push_back(line.substr(a, b - a));
    a = b + 1;
  }
  if (parts.size() == 3) {
    r.method = parts[0];
    r.path = std::string(parts[1].substr(0, parts[1].find('?')));
    r.version = parts[2];
  }
  return parts.size() == 3 && (r.version == "HTTP/1.1" || r.version == "HTTP/1.0");
}

// How the body is framed, from the headers.
struct Framing {
  std::optional<std::string> content_length;
  bool chunked = false, expect_continue = false;
};

// A Content-Length value: "5, 5" and repeated equal values are one length (RFC 9110 8.6);
// differing ones are a request that proxies may frame differently: refused. Returns the error.
std::optional<std::string> add_content_length(std::string_view value, Framing& f) {
  size_t a = 0;
  while (a <= value.size()) {
    size_t b = value.find(',', a);
    if (b == std::string_view::npos) b = value.size();
    const std::string_view v = trim(value.substr(a, b - a));
    if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos)
      return fmt::format("invalid Content-Length {}", ds::quoted_excerpt(value, 60));
    if (f.content_length && *f.content_length != v)
      return fmt::format("conflicting Content-Length headers ({} and {})", *f.content_length, v);
    f.content_length = std::string(v);
    a = b + 1;
  }
  return std::nullopt;
}

// The header lines after the request line (from `pos` of head): the framing headers into f, the
// others copied to out (HTTP/1.0's Connection dropped: replaced by the caller). A rejection, or
// nullopt.
std::optional<ReadResult> parse_headers(const std::string& head, size_t pos, bool http10,
                                        ReadResult& r, std::string& out, Framing& f) {
  for (size_t next_pos = 0;; pos = next_pos) {
    const std::string_view line = *line_at(head, pos, next_pos);
    if (line.empty()) return std::nullopt;
    if (line.front() == ' ' || line.front() == '\t')
      return reject(r, 400, "a header line starts with white space (obsolete line folding)");
    const size_t colon = line.find(':');
    const std::string_view name = colon == std::string_view::npos ? "" : line.substr(0, colon);
    if (name.empty() || name.find_first_of(" \t") != std::string_view::npos)
      return reject(r, 400, fmt::format("malformed header line {}", ds::quoted_excerpt(line, 120)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (ds::iequals(name, "Content-Length")) {
      if (auto error = add_content_length(value, f))
        return reject(r, 400, *error, "Content-Length");
    } else if (ds::iequals(name, "Transfer-Encoding")) {
      if (f.chunked || !ds::iequals(value, "chunked"))
        return reject(r, f.chunked ? 400 : 501,
                      fmt::format("Transfer-Encoding {} is not supported (only chunked)",
                                  ds::quoted_excerpt(value, 60)),
                      "Transfer-Encoding");
      f.chunked = true;
    } else if (ds::iequals(name, "Expect")) {
      if (!ds::iequals(value, "100-continue"))
        return reject(r, 417,
                      fmt::format("Expect {} is not supported (only 100-continue)",
                                  ds::quoted_excerpt(value, 60)),
                      "Expect");
      f.expect_continue = true;
    } else if (!(http10 && ds::iequals(name, "Connection"))) {
      out.append(line.data(), line.size());
      out += "\r\n";
    }
  }
}

}  // namespace

std::optional<std::string> RequestReader::read_head(ReadResult& r, bool first) {
  // Empty lines before a request line are ignored (RFC 9112 2.2).
  auto skip_blank = [&] {
    size_t i = 0;
    while (i < buf_.size() && (buf_[i] == '\r' || buf_[i] == '\n')) ++i;
    buf_.erase(0, i);
  };
  skip_blank();
  const auto idle_deadline = after(first ? limits_.header_seconds : limits_.idle_seconds);
  while (buf_.empty()) {
    if (fill(idle_deadline) != Fill::kOk) return std::nullopt;  // idle, closed or stopping
    skip_blank();
  }
  // The head: within header_seconds of its first byte, at most max_head_bytes.
  const auto head_deadline = after(limits_.header_seconds);
  size_t end;
  while ((end = head_end(buf_)) == std::string::npos) {
    if (buf_.size() > limits_.max_head_bytes) break;
    const Fill f = fill(head_deadline);
    if (f == Fill::kTimeout) {
      r = reject(r, 408,
                 fmt::format("the request line and headers did not arrive within {} s",
                             limits_.header_seconds));
      return std::nullopt;
    }
    if (f != Fill::kOk) return std::nullopt;
  }
  if (end == std::string::npos || end > limits_.max_head_bytes) {
    r = reject(r, 431,
               fmt::format("the request line and headers are larger than {} bytes",
                           limits_.max_head_bytes));
    return std::nullopt;
  }
  std::string head = buf_.substr(0, end);
  buf_.erase(0, end);
  return head;
}

ReadResult RequestReader::next(bool first) {
  ReadResult r;
  const std::optional<std::string> head = read_head(r, first);
  if (!head) return r;
  size_t pos = 0;
  const std::string_view request_line = *line_at(*head, 0, pos);
  if (!parse_request_line(request_line, r))
    return reject(r, 400,
                  fmt::format("malformed request line {} (expected METHOD /path HTTP/1.1)",
                              ds::quoted_excerpt(request_line, 120)));
  const bool http10 = r.version == "HTTP/1.0";
  std::string out = std::string(request_line) + "\r\n";
  Framing f;
  if (auto rejected = parse_headers(*head, pos, http10, r, out, f)) return *rejected;
  if (f.chunked && f.content_length)
    return reject(r, 400, "both Content-Length and Transfer-Encoding: chunked; send one",
                  "Content-Length");
  // HTTP/1.0 gets no keep-alive: a streaming reply is then delimited by the close (RFC 9112 6.3
  // forbids chunked to a 1.0 client).
  if (http10) out += "Connection: close\r\n";
  size_t length = 0;
  if (f.content_length) {
    length = std::stoull(*f.content_length);
    if (length > limits_.max_body_bytes)
      return reject(r, 413,
                    fmt::format("the request body ({} bytes) is larger than the limit of {} bytes "
                                "(--max_body_bytes)",
                                length, limits_.max_body_bytes),
                    "body");
  }
  std::string body;
  if (f.content_length || f.chunked) {
    ReadResult failed = read_body(r, length, f.chunked, f.expect_continue, body);
    if (failed.kind != ReadResult::kRequest) return failed;
  }
  if (!body.empty() || f.content_length || f.chunked || r.method == "POST" ||
      r.method == "PUT" || r.method == "PATCH")
    out += fmt::format("Content-Length: {}\r\n", body.size());
  out += "\r\n";
  out += body;
  r.kind = ReadResult::kRequest;
  r.request = std::move(out);
  return r;
}

ReadResult RequestReader::read_body(ReadResult& r, size_t content_length, bool chunked,
                                    bool expect_continue, std::string& body) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(limits_.body_seconds));
  auto timed_out = [&] {
    return reject(r, 408,
                  fmt::format("the request body did not arrive within {} s", limits_.body_seconds),
                  "body");
  };
  // The client waits for "100 Continue" before it sends the body; it has sent nothing yet.
  if (expect_continue && buf_.empty() && (chunked || content_length > 0)) {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ::send(fd_, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL);
  }
  ReadResult ok;
  ok.kind = ReadResult::kRequest;
  if (!chunked) {
    while (buf_.size() < content_length) {
      const Fill f = fill(deadline);
      if (f == Fill::kTimeout) return timed_out();
      if (f != Fill::kOk) return ReadResult{};
    }
    body = buf_.substr(0, content_length);
    buf_.erase(0, content_length);
    return ok;
  }
  // Chunked: size line (hex, maybe ";extensions"), data, CRLF; a 0 size, trailers, empty line.
  // Decoded as it arrives, so that no more than the limit (plus one read) is ever held.
  auto need_line = [&](size_t& next, std::optional<std::string_view>& line) -> int {
    for (;;) {
      line = line_at(buf_, 0, next);
      if (line) return 0;
      if (buf_.size() > 4096) return 400;
      const Fill f = fill(deadline);
      if (f == Fill::kTimeout) return 408;
      if (f != Fill::kOk) return -1;
    }
  };
  auto bad_chunk = [&](const std::string& what) {
    return reject(r, 400, "malformed chunked body: " + what, "body");
  };
  for (;;) {
    size_t next = 0;
    std::optional<std::string_view> line;
    if (const int e = need_line(next, line); e != 0)
      return e == 408   ? timed_out()
             : e == 400 ? bad_chunk("a chunk size line over 4096 bytes")
                        : ReadResult{};
    const std::string_view size_text = trim(line->substr(0, line->find(';')));
    if (size_text.empty() || size_text.size() > 15 ||
        size_text.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos)
      return bad_chunk(fmt::format("chunk size {}", ds::quoted_excerpt(*line, 60)));
    const size_t size = std::stoull(std::string(size_text), nullptr, 16);
    buf_.erase(0, next);
    if (size == 0) break;
    if (size > limits_.max_body_bytes - body.size())
      return reject(r, 413,
                    fmt::format("the chunked request body is larger than the limit of {} bytes "
                                "(--max_body_bytes)",
                                limits_.max_body_bytes),
                    "body");
    while (buf_.size() < size + 2) {
      const Fill f = fill(deadline);
      if (f == Fill::kTimeout) return timed_out();
      if (f != Fill::kOk) return ReadResult{};
    }
    if (buf_.compare(size, 2, "\r\n") != 0 && buf_[size] != '\n')
      return bad_chunk("a chunk's data is not followed by CRLF");
    body.append(buf_, 0, size);
    buf_.erase(0, size + (buf_[size] == '\n' ? 1 : 2));
  }
  // Trailer fields (ignored) up to the empty line.
  for (size_t trailer_bytes = 0;;) {
    size_t next = 0;
    std::optional<std::string_view> line;
    if (const int e = need_line(next, line); e != 0)
      return e == 408   ? timed_out()
             : e == 400 ? bad_chunk("a trailer line over 4096 bytes")
                        : ReadResult{};
    const bool last = line->empty();
    trailer_bytes += next;
    buf_.erase(0, next);
    if (last) break;
    if (trailer_bytes > limits_.max_head_bytes) return bad_chunk("trailers too large");
  }
  return ok;
}

}  // namespace ds::serve
