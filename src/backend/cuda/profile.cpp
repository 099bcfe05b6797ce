// DS_CUDA_PROFILE (profile.h): the per-op table and its printing at exit.
#include "backend/cuda/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace ds::backend {
namespace {

struct Row {
  long long calls = 0;
  double seconds = 0.0;
};

struct Table {
  std::mutex mutex;
  std::map<std::string, Row> rows;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: printed from atexit
  return *t;
}

void print_table() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::pair<std::string, Row>> rows(t.rows.begin(), t.rows.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0.0;
  for (const auto& [op, r] : rows) total += r.seconds;
  std::fprintf(stderr, "[cuda:profile] %-24s %9s %11s %10s %6s\n", "op", "calls", "total ms",
               "mean us", "share");
  for (const auto& [op, r] : rows)
    std::fprintf(stderr, "[cuda:profile] %-24s %9lld %11.2f %10.1f %5.1f%%\n", op.c_str(), r.calls,
                 r.seconds * 1e3, r.seconds * 1e6 / static_cast<double>(std::max(r.calls, 1LL)),
                 total > 0 ? 100.0 * r.seconds / total : 0.0);
}

bool enabled_once() {
  static const bool on = [] {  // (enabled_once)
    const char* v = std::getenv("DS_CUDA_PROFILE");
    const bool yes = v != nullptr && *v != '\0' && std::string(v) != "0";
    if (yes) std::atexit(print_table);
    return yes;
  }();
  return on;
}

thread_local int t_depth = 0;

bool enabled() { return cuda_profiling(); }

}  // namespace

bool cuda_profiling() {
  static const bool on = enabled_once();
  return on;
}

ProfileScope::ProfileScope(CudaBackend& backend, const char* op, std::string detail) {
  if (!enabled() || t_depth++ > 0) return;
  cudaStreamSynchronize(backend.stream());
  backend_ = &backend;
  op_ = detail.empty() ? std::string(op) : std::string(op) + " " + detail;
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() {
  if (!enabled()) return;
  --t_depth;
  if (!backend_) return;
  cudaStreamSynchronize(backend_->stream());  // errors surface at the next checked call
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  Row& r = t.rows[op_];
  ++r.calls;
  r.seconds += s;
}

}  // namespace ds::backend
