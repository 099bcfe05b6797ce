// ds_serve under load: N concurrent clients, each sending streaming /v1/completions requests one
// after another, against a running server. bench/run_serve.sh starts the server and measures the
// reference (ds_generate's single-request decode speed on the same model) in the same run.
//
//   build/bench/bench_serve --port 8000 --clients 1,8,32 --requests 64 --max_tokens 32 \
//       [--prompt TEXT] [--host 127.0.0.1]
//
// For each client count: max(`requests`, 2 x clients) requests in all, taken by the clients as
// they finish (each client sends its next request when its last one is answered).
// Latency is the client's: request sent to the last byte; TTFT is request sent to the first
// chunk with text. tokens/s is completion tokens of successful requests (from the usage chunk)
// over the wall time of the level. A 503 (busy) is counted and not retried. Prints per level:
//   BENCH serve clients=<n> requests=<ok> busy_503=<k> errors=<e> wall_s=<t> req_per_s=<r>
//         tokens_per_s=<x> p50_ms=<a> p99_ms=<b> ttft_p50_ms=<c> ttft_p99_ms=<d>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// The q-quantile (0..1) by the nearest-rank method.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Sample {
  double latency_ms = 0.0, ttft_ms = -1.0;
  int64_t tokens = 0;
};

struct Level {
  std::vector<Sample> ok;
  int busy = 0, errors = 0;
  double wall_s = 0.0;
};

// One streaming request; returns the HTTP status (0 = no response).
int one_request(httplib::Client& c, const std::string& body, Sample& s) {
  std::string buf;
  bool done = false;
  const auto t0 = Clock::now();
  // httplib 0.11.4's client takes a content receiver only through send().
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string data_line = ev.substr(6);
      if (data_line == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(data_line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object())
        s.tokens = j["usage"]["completion_tokens"].get<int64_t>();
      if (s.ttft_ms < 0 && j.contains("choices") && !j["choices"].empty() &&
          !j["choices"][0].value("text", "").empty())
        s.ttft_ms = ms_since(t0, Clock::now());
    }
    return true;
  };
  auto res = c.send(req);
  s.latency_ms = ms_since(t0, Clock::now());
  if (!res) return 0;
  if (res->status == 200 && !done) return -1;
  return res->status;
}

Level run_level(const std::string& host, int port, int clients, int requests,
                const std::string& body) {
  Level level;
  std::mutex mu;
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&] {
      httplib::Client c(host, port);
      c.set_read_timeout(600, 0);
      c.set_write_timeout(60, 0);
      while (next.fetch_add(1) < requests) {
        Sample s;
        const int status = one_request(c, body, s);
        std::lock_guard<std::mutex> lock(mu);
        if (status == 200)
          level.ok.push_back(s);
        else if (status == 503)
          ++level.busy;
        else
          ++level.errors;
      }
    });
  for (auto& t : ts) t.join();
  level.wall_s = ms_since(t0, Clock::now()) / 1000.0;
  return level;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_serve: latency and throughput of a running ds_serve"};
  std::string host = "127.0.0.1", clients_arg = "1,8,32";
  std::string prompt = "The history of the city begins with a small settlement on the river";
  int port = 8000, requests = 64, max_tokens = 32;
  app.add_option("--host", host)->capture_default_str();
  app.add_option("--port", port)->required();
  app.add_option("--clients", clients_arg, "comma-separated client counts")->capture_default_str();
  app.add_option("--requests", requests, "requests per level (at least two per client)")
      ->capture_default_str();
  app.add_option("--max_tokens", max_tokens)->capture_default_str();
  app.add_option("--prompt", prompt);
  CLI11_PARSE(app, argc, argv);

  const std::string body = json{{"prompt", prompt},
                                {"max_tokens", max_tokens},
                                {"temperature", 0},
                                {"stream", true},
                                {"stream_options", {{"include_usage", true}}}}
                               .dump();
  std::stringstream ss(clients_arg);
  std::string item;
  int rc = 0;
  while (std::getline(ss, item, ',')) {
    const int clients = std::stoi(item);
    const Level l = run_level(host, port, clients, std::max(requests, 2 * clients), body);
    std::vector<double> lat, ttft;
    int64_t tokens = 0;
    for (const Sample& s : l.ok) {
      lat.push_back(s.latency_ms);
      if (s.ttft_ms >= 0) ttft.push_back(s.ttft_ms);
      tokens += s.tokens;
    }
    std::printf(
        "BENCH serve clients=%d requests=%zu busy_503=%d errors=%d wall_s=%.2f req_per_s=%.2f "
        "tokens_per_s=%.1f p50_ms=%.0f p99_ms=%.0f ttft_p50_ms=%.0f ttft_p99_ms=%.0f\n",
        clients, l.ok.size(), l.busy, l.errors, l.wall_s,
        static_cast<double>(l.ok.size()) / l.wall_s, static_cast<double>(tokens) / l.wall_s,
        quantile(lat, 0.5), quantile(lat, 0.99), quantile(ttft, 0.5), quantile(ttft, 0.99));
    std::fflush(stdout);
    if (l.errors > 0) rc = 1;
  }
  return rc;
}
