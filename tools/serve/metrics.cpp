// ds_serve's Prometheus metrics (metrics.h).
#include "metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace ds::serve {

namespace {

// Prometheus renders +Inf and floats with Go's formatting; plain %g is accepted by its parser.
std::string num(double v) {
  return fmt::format("{}", v);
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                       bounds_.begin());  // le: v <= bound
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(bounds_[i]), cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, num(sum_), name, count_);
}

Metrics::Metrics()
    : latency_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      batch_({1, 2, 4, 8, 16, 32, 64, 128, 256}) {}

void Metrics::record_decode_step(int batch) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_.observe(batch);
}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::record_generation(int64_t prompt_tokens, int64_t completion_tokens, double seconds,
                                double first_token_seconds, bool cancelled) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(prompt_tokens, 0));
  completion_tokens_ += static_cast<uint64_t>(std::max<int64_t>(completion_tokens, 0));
  if (cancelled) ++cancelled_;
  latency_.observe(seconds);
  if (first_token_seconds >= 0.0) ttft_.observe(first_token_seconds);
}

std::string Metrics::render(const ServeGauges& g) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "ds_serve_requests_total", "counter", "HTTP replies by route and status.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("ds_serve_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  header(out, "ds_serve_requests_in_flight", "gauge",
         "Generation requests admitted: running plus waiting.");
  out += fmt::format("ds_serve_requests_in_flight {}\n", g.in_flight);
  header(out, "ds_serve_requests_running", "gauge",
         "Generation requests generating now (sequences in the batch).");
  out += fmt::format("ds_serve_requests_running {}\n", g.running);
  header(out, "ds_serve_requests_waiting", "gauge",
         "Generation requests queued for a place in the batch (queue depth).");
  out += fmt::format("ds_serve_requests_waiting {}\n", g.waiting);
  header(out, "ds_serve_max_queue", "gauge", "Requests that may wait (--max_queue); more get 503.");
  out += fmt::format("ds_serve_max_queue {}\n", g.max_queue);
  header(out, "ds_serve_max_batch", "gauge", "Sequences one decode step may hold (--max_batch).");
  out += fmt::format("ds_serve_max_batch {}\n", g.max_batch);
  header(out, "ds_serve_connections_open", "gauge",
         "Client connections being served (each on its own thread), idle kept-alive ones "
         "included.");
  out += fmt::format("ds_serve_connections_open {}\n", g.connections_open);
  header(out, "ds_serve_connections_queued", "gauge",
         "Accepted connections waiting for a thread (beyond --max_connections).");
  out += fmt::format("ds_serve_connections_queued {}\n", g.connections_queued);
  header(out, "ds_serve_max_connections", "gauge",
         "Open connections allowed (--max_connections); more are answered 503.");
  out += fmt::format("ds_serve_max_connections {}\n", g.max_connections);
  header(out, "ds_serve_prompt_tokens_total", "counter", "Prompt tokens of finished generations.");
  out += fmt::format("ds_serve_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "ds_serve_completion_tokens_total", "counter",
         "Tokens generated (completion tokens) by finished generations.");
  out += fmt::format("ds_serve_completion_tokens_total {}\n", completion_tokens_);
  header(out, "ds_serve_generations_cancelled_total", "counter",
         "Generations stopped because the client went away (or a drain ran out of time).");
  out += fmt::format("ds_serve_generations_cancelled_total {}\n", cancelled_);
  header(out, "ds_serve_request_duration_seconds", "histogram",
         "Generation requests: admission to the last byte of the reply.");
  latency_.render(out, "ds_serve_request_duration_seconds");
  header(out, "ds_serve_time_to_first_token_seconds", "histogram",
         "Generation requests: admission to the first new token (queueing and prefill included).");
  ttft_.render(out, "ds_serve_time_to_first_token_seconds");
  header(out, "ds_serve_decode_steps_total", "counter",
         "Batched decode forwards: one per step, whatever the number of sequences in it.");
  out += fmt::format("ds_serve_decode_steps_total {}\n", batch_.count());
  header(out, "ds_serve_batch_size", "histogram", "Sequences per decode step.");
  batch_.render(out, "ds_serve_batch_size");
  return out;
}

}  // namespace ds::serve
