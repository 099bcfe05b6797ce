#pragma once
// ds_serve's counters for GET /metrics, in Prometheus' text exposition format (version 0.0.4):
//
//   ds_serve_requests_total{route, status}        counter: every HTTP reply (route "other" for
//                                                  paths that are not a route, to bound the labels)
//   ds_serve_requests_in_flight                    gauge: generation requests admitted (running +
//                                                  waiting)
//   ds_serve_requests_running / _waiting           gauge: in the batch now / queued for a place
//   ds_serve_max_queue / ds_serve_max_batch        gauge: --max_queue / --max_batch
//   ds_serve_connections_open / _queued            gauge: connections on a thread / accepted and
//                                                  waiting for one (http_server.h)
//   ds_serve_max_connections                       gauge: --max_connections
//   ds_serve_prompt_tokens_total                   counter: prompt tokens of finished generations
//   ds_serve_completion_tokens_total               counter: tokens they generated
//   ds_serve_generations_cancelled_total           counter: generations stopped because the client
//                                                  went away (or a drain ran out of time)
//   ds_serve_request_duration_seconds              histogram: admission to the reply's last byte
//   ds_serve_time_to_first_token_seconds           histogram: admission to the first new token
//                                                  (queueing and prefill included)
//   ds_serve_decode_steps_total                    counter: batched decode forwards (one per step,
//                                                  whatever the number of sequences in it)
//   ds_serve_batch_size                            histogram: sequences per decode step
//
// The gauges are read at render time from the caller (the server owns them); everything else is
// recorded here. Names follow Prometheus conventions (base units, _total for counters) and vLLM's
// choices where one exists (e2e latency, time to first token).
//
// Thread-safe: every method may be called from any thread; one mutex guards the state (a few
// increments per request, far below the cost of a generation).
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ds::serve {

// Cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "<name>_bucket{le=...} n" lines, then _sum and _count.
  void render(std::string& out, const std::string& name) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative (+Inf is the last)
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct ServeGauges {
  int in_flight = 0, running = 0, waiting = 0, max_queue = 0, max_batch = 1;
  int connections_open = 0, connections_queued = 0, max_connections = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& route, int status);
  // A finished generation: its token counts and, when a token was produced, the time to it.
  void record_generation(int64_t prompt_tokens, int64_t completion_tokens, double seconds,
                         double first_token_seconds /* < 0: none */, bool cancelled = false);
  // A batched decode step of `batch` sequences.
  void record_decode_step(int batch);
  // The text format, with the gauges given.
  std::string render(const ServeGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, cancelled_ = 0;
  Histogram latency_, ttft_, batch_;
};

}  // namespace ds::serve
