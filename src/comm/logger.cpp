// comms_logger: counts, bytes and times per operation and message size.
#include "ds/comm/logger.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/internal.h"

namespace ds::comm {

double bus_factor(OpKind op, int n) {
  if (n <= 1) return 0.0;
  switch (op) {
    case OpKind::all_reduce:
      return 2.0 * (n - 1) / n;
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
    case OpKind::all_to_all:
    case OpKind::all_to_all_v:
      return double(n - 1) / n;
    case OpKind::reduce:
    case OpKind::broadcast:
    case OpKind::send:
    case OpKind::recv:
      return 1.0;
    default:
      return 0.0;
  }
}

CommsLogger& comms_logger() {
  static CommsLogger* logger = [] {
    auto* l = new CommsLogger();  // never destroyed: comm threads may record during exit
    const char* e = std::getenv("DS_COMMS_LOGGER");
    if (e && *e && std::strcmp(e, "0") != 0) l->enable(true);
    return l;
  }();
  return *logger;
}

void CommsLogger::enable(bool on) {
  std::lock_guard lk(mu_);
  enabled_ = on;
}

bool CommsLogger::enabled() const {
  std::lock_guard lk(mu_);
  return enabled_;
}

void CommsLogger::record(OpKind op, uint64_t bytes, double seconds, int group_size) {
  std::lock_guard lk(mu_);
  if (!enabled_) return;
  Entry& e = entries_[{op, bytes}];
  e.count += 1;
  e.bytes += bytes;
  e.seconds += seconds;
  e.max_seconds = std::max(e.max_seconds, seconds);
  bus_factor_[op] = bus_factor(op, group_size);
}

void CommsLogger::reset() {
  std::lock_guard lk(mu_);
  entries_.clear();
  bus_factor_.clear();
}

std::map<OpKind, CommsLogger::Entry> CommsLogger::totals() const {
  std::lock_guard lk(mu_);
  std::map<OpKind, Entry> t;
  for (const auto& [key, e] : entries_) {
    Entry& s = t[key.first];
    s.count += e.count;
    s.bytes += e.bytes;
    s.seconds += e.seconds;
    s.max_seconds = std::max(s.max_seconds, e.max_seconds);
  }
  return t;
}

std::string CommsLogger::table() const {
  std::map<std::pair<OpKind, uint64_t>, Entry> entries;
  std::map<OpKind, double> factors;
  {
    std::lock_guard lk(mu_);
    entries = entries_;
    factors = bus_factor_;
  }
  std::string out =
      fmt::format("{:<15} {:>12} {:>8} {:>12} {:>10} {:>10} {:>11} {:>11}\n", "op", "msg size",
                  "count", "total ms", "avg ms", "max ms", "algbw GB/s", "busbw GB/s");
  auto row = [&](const std::string& op, const std::string& size, const Entry& e, double f) {
    const double algbw = e.seconds > 0 ? e.bytes / e.seconds / 1e9 : 0.0;
    out +=
        fmt::format("{:<15} {:>12} {:>8} {:>12.3f} {:>10.3f} {:>10.3f} {:>11.2f} {:>11.2f}\n", op,
                    size, e.count, e.seconds * 1e3, e.count ? e.seconds * 1e3 / e.count : 0.0,
                    e.max_seconds * 1e3, algbw, algbw * f);
  };
  std::map<OpKind, Entry> totals;
  for (const auto& [key, e] : entries) {
    const double f = factors.count(key.first) ? factors.at(key.first) : 0.0;
    row(op_name(key.first), detail::format_bytes(key.second), e, f);
    Entry& t = totals[key.first];
    t.count += e.count;
    t.bytes += e.bytes;
    t.seconds += e.seconds;
    t.max_seconds = std::max(t.max_seconds, e.max_seconds);
  }
  for (const auto& [op, t] : totals) {
    const double f = factors.count(op) ? factors.at(op) : 0.0;
    row(std::string(op_name(op)) + " total", detail::format_bytes(t.bytes), t, f);
  }
  if (entries.empty()) out += "(no operations recorded; enable with DS_COMMS_LOGGER=1)\n";
  return out;
}

}  // namespace ds::comm
