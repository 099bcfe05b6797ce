// Finding a request's socket and polling it for the peer's close (connection.h).
#include "connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

#include <httplib.h>

namespace ds::serve {

namespace {

// Numeric host and port of a socket address, as httplib formats Request::remote_addr (getnameinfo
// with NI_NUMERICHOST), so that the strings compare equal.
bool host_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  host = h;
  if (a.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  else
    return false;
  return true;
}

bool matches(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof local, plen = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return false;  // ENOTSOCK
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) return false;
  std::string lhost, phost;
  int lport = -1, pport = -1;
  if (!host_port(local, llen, lhost, lport) || !host_port(peer, plen, phost, pport)) return false;
  return lport == req.local_port && pport == req.remote_port && phost == req.remote_addr &&
         (req.local_addr.empty() || lhost == req.local_addr);
}

}  // namespace

ClientConnection ClientConnection::of(const httplib::Request& req) {
  ClientConnection c;
  if (req.remote_port < 0 || req.local_port < 0) return c;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return c;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (matches(static_cast<int>(fd), req)) {
      c.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return c;
}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace ds::serve
