// ds_serve's connection threads and per-connection request loop (http_server.h).
#include "http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace ds::serve {

namespace {

// Threads for connections: a job (one connection) starts at once on an idle thread or a new one,
// up to max_threads; beyond that it waits, counted in `queued`. Threads above `keep` that stay
// idle for a minute end. shutdown() waits for every job to finish.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t keep, size_t max_threads, std::atomic<int>& queued)
      : keep_(keep), max_(std::max<size_t>(1, max_threads)), queued_(queued) {}
  ~ConnectionPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(std::move(fn));
    queued_ = static_cast<int>(jobs_.size());
    if (idle_ < jobs_.size() && threads_ < max_) {
      ++threads_;
      std::thread([this] { work(); }).detach();
    }
    cv_.notify_one();
  }

  void shutdown() override {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
    done_.wait(lk, [&] { return threads_ == 0; });
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      ++idle_;
      const bool woken =
          cv_.wait_for(lk, std::chrono::seconds(60), [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) {
        if (stop_ || (!woken && threads_ > keep_)) break;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      queued_ = static_cast<int>(jobs_.size());
      lk.unlock();
      fn();
      fn = nullptr;
      lk.lock();
    }
    --threads_;
    done_.notify_all();  // under the lock: shutdown() cannot return before we release it
  }

  const size_t keep_, max_;
  std::atomic<int>& queued_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<std::function<void()>> jobs_;
  size_t threads_ = 0, idle_ = 0;
  bool stop_ = false;
};

// Numeric host and port of a socket address, as httplib formats them (getnameinfo with
// NI_NUMERICHOST): connection.h matches requests to sockets by these strings.
void host_port(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char h[NI_MAXHOST];
  if (rc != 0 || getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, nullptr, 0,
                             NI_NUMERICHOST) != 0)
    return;
  host = h;
  if (a.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
}

// One request for httplib: read from memory (what RequestReader accepted), written to the socket.
class RequestStream : public httplib::Stream {
 public:
  RequestStream(int fd, const std::string& request, int write_timeout_ms)
      : fd_(fd), request_(request), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return pos_ < request_.size(); }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return ::poll(&p, 1, write_timeout_ms_) > 0 && (p.revents & (POLLERR | POLLHUP)) == 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - pos_);
    std::memcpy(ptr, request_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      if (!is_writable()) return -1;
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    host_port(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    host_port(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  const std::string& request_;
  size_t pos_ = 0;
  int write_timeout_ms_;
};

// Threads kept beyond max_connections to answer connections over the limit with a 503.
constexpr int kRefusalThreads = 16;

}  // namespace

HttpServer::HttpServer(Options o, RejectHandler on_reject)
    : opt_(o), on_reject_(std::move(on_reject)) {
  opt_.keep_threads = std::max(1, opt_.keep_threads);
  opt_.max_connections = std::max(1, opt_.max_connections);
  new_task_queue = [this] {
    return new ConnectionPool(static_cast<size_t>(opt_.keep_threads),
                              static_cast<size_t>(opt_.max_connections + kRefusalThreads), queued_);
  };
  set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, opt_.read.idle_seconds)));
  set_keep_alive_max_count(100);
  set_payload_max_length(opt_.read.max_body_bytes);
}

bool HttpServer::set_backlog(int backlog) {
  return ::listen(svr_sock_, backlog) == 0;
}

void HttpServer::refuse(int sock, const ReadResult& r) {
  const std::string reply = raw_json_response(r.status, on_reject_ ? on_reject_(r) : "{}");
  // Best effort within the write timeout; then a lingering close: stop sending, read (and drop)
  // what the client still sends for a moment, so that the close does not reset the connection
  // before the client has read the reply.
  size_t off = 0;
  while (off < reply.size()) {
    pollfd p{sock, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000)) <=
        0)
      break;
    const ssize_t n = ::send(sock, reply.data() + off, reply.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::shutdown(sock, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  char buf[16384];
  size_t drained = 0;
  while (drained < (size_t{4} << 20) && std::chrono::steady_clock::now() < deadline) {
    pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  struct Count {
    std::atomic<int>& n;
    int now;
    explicit Count(std::atomic<int>& c) : n(c), now(++c) {}
    ~Count() { --n; }
  } open(open_);
  bool ret = true;
  if (open.now > opt_.max_connections) {
    ReadResult r;
    r.kind = ReadResult::kReject;
    r.status = 503;
    r.message =
        fmt::format("too many connections: {} open, the limit is --max_connections {}; retry later",
                    open.now, opt_.max_connections);
    refuse(sock, r);
  } else {
    RequestReader reader(sock, opt_.read, [this] { return svr_sock_ == INVALID_SOCKET; });
    const int write_timeout_ms =
        static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
    for (size_t served = 0;;) {
      const ReadResult r = reader.next(served == 0);
      if (r.kind == ReadResult::kClosed) break;
      if (r.kind == ReadResult::kReject) {
        refuse(sock, r);
        break;
      }
      RequestStream strm(sock, r.request, write_timeout_ms);
      ++served;
      const bool last = served >= keep_alive_max_count_ || svr_sock_ == INVALID_SOCKET;
      bool connection_closed = false;
      ret = process_request(strm, last, connection_closed, nullptr);
      if (!ret || connection_closed || last) break;
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace ds::serve
