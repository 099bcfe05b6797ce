// ds_serve's HTTP server, started in-process on an ephemeral port with a tiny model exported in the
// test: every route's happy path (non-streaming and streaming) and every kind of bad input, after
// which the server must still answer.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/models/gpt_decoder.h"
#include "ds/serve/api.h"
#include "ds/serve/generate.h"
#include "serve/admission.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "serve_fixture.h"

using nlohmann::json;

namespace {

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new serve_test::TempDir("http");
    auto m = serve_test::make_model(serve_test::tiny_gpt2(256));
    ds::models::export_hf(*m, dir_->path() / "tiny");
    ds::serve::ServerOptions o;
    o.port = 0;
    o.max_body_bytes = 4096;
    o.log_requests = false;
    server_ = new ds::serve::Server(ds::serve::load_model(dir_->path() / "tiny"), o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->run(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200; ++i) {  // until the listener answers
      if (auto r = c.Get("/health"); r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete dir_;
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // POST returning (status, parsed body).
  std::pair<int, json> post(const std::string& path, const std::string& body) {
    auto c = client();
    auto r = c.Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << "no response from " << path;
    if (!r) return {0, {}};
    json j = json::parse(r->body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r->body;
    return {r->status, j};
  }
  // An OpenAI error: status 400 and error.param == param.
  void expect_openai_error(const std::string& path, const std::string& body,
                           const std::string& param, int status = 400) {
    auto [st, j] = post(path, body);
    EXPECT_EQ(st, status) << body << " -> " << j.dump();
    ASSERT_TRUE(j.contains("error") && j["error"].is_object()) << j.dump();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << j.dump();
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param) << j.dump();
  }
  static inline serve_test::TempDir* dir_ = nullptr;
  static inline ds::serve::Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
};

// The data: lines of an SSE body, parsed (the last is "[DONE]" as a string).
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    pos = end;
  }
  return out;
}

// A Prometheus text exposition, parsed: "name{labels}" -> value. Fails the test on a line that
// is neither a comment nor a sample.
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) ([-+0-9.eE]+|\+Inf|NaN))");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a Prometheus sample line: " << line;
      continue;
    }
    out[m[1]] = std::stod(m[3]);
  }
  return out;
}

}  // namespace

TEST_F(ServeHttp, HealthAndModels) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  const json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

// GET / is the chat page: one self-contained HTML document (nothing loaded from elsewhere) that
// streams from the OpenAI chat route; POST / stays the guide's API.
TEST_F(ServeHttp, ChatPageAtGetRoot) {
  auto c = client();
  auto r = c.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  const std::string& html = r->body;
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u) << html.substr(0, 100);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_NE(html.find("fetch(\"v1/chat/completions\""), std::string::npos);
  EXPECT_NE(html.find("stream: true"), std::string::npos);
  EXPECT_NE(html.find("data: "), std::string::npos);  // it parses server-sent events
  for (const char* external : {"src=\"http", "href=\"http", "src=\"//", "href=\"//", "@import"})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  // The page's requests work: the models list it shows, and a streamed chat.
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
}

TEST_F(ServeHttp, GuideApiKeepsHistory) {
  auto [st, j] = post("/", R"({"prompt": "你好", "history": [], "max_length": 24})");
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["status"], 200);
  ASSERT_TRUE(j["response"].is_string());
  EXPECT_EQ(j["history"], json::array({json::array({"你好", j["response"]})}));
  EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")));
  // A second round sends the history back; optional fields may be null.
  json req = {{"prompt", "again"},
              {"history", j["history"]},
              {"max_length", 200},
              {"top_p", nullptr},
              {"temperature", 0.5}};
  auto [st2, j2] = post("/", req.dump());
  ASSERT_EQ(st2, 200) << j2.dump();
  ASSERT_EQ(j2["history"].size(), 2u);
  EXPECT_EQ(j2["history"][0], j["history"][0]);
  EXPECT_EQ(j2["history"][1][0], "again");
  EXPECT_EQ(j2["history"][1][1], j2["response"]);
}

TEST_F(ServeHttp, CompletionsMatchDirectGeneration) {
  auto [st, j] = post("/v1/completions",
                      R"({"model": "tiny", "prompt": "Hello", "max_tokens": 6, "temperature": 0.8,
                          "top_k": 40, "seed": 5})");
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  const auto& u = j["usage"];
  EXPECT_EQ(u["prompt_tokens"], 5);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  // The same generation run directly (what ds_generate does) gives the same text.
  auto lm = ds::serve::load_model(dir_->path() / "tiny");
  ds::models::GPTDecoder dec(lm.model);
  ds::serve::SamplingParams p;
  p.max_tokens = 6;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.seed = 5;
  const auto r =
      ds::serve::generate(dec, *lm.tokenizer, lm.tokenizer->encode("Hello"), p, lm.eos_ids);
  EXPECT_EQ(j["choices"][0]["text"], r.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], r.finish_reason);
  EXPECT_EQ(u["completion_tokens"], r.completion_tokens);
  // Token-id prompts and echo.
  auto [st2, j2] =
      post("/v1/completions",
           R"({"prompt": [72, 105], "max_tokens": 2, "temperature": 0, "echo": true})");
  ASSERT_EQ(st2, 200) << j2.dump();
  EXPECT_EQ(j2["choices"][0]["text"].get<std::string>().substr(0, 2), "Hi");
}

TEST_F(ServeHttp, ChatCompletionsAndStreamingAgree) {
  const std::string body =
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi there"}],
          "max_tokens": 12, "temperature": 0.7, "seed": 3})";
  auto [st, j] = post("/v1/chat/completions", body);
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const std::string content = j["choices"][0]["message"]["content"];
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 20);
  // Streaming the same request: the deltas add up to the same content.
  json sreq = json::parse(body);
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto c = client();
  auto r = c.Post("/v1/chat/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto ev = sse_events(r->body);
  ASSERT_GE(ev.size(), 4u) << r->body;
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 0; i + 3 < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["object"], "chat.completion.chunk");
    streamed += ev[i]["choices"][0]["delta"].value("content", "");
  }
  const json& closing = ev[ev.size() - 3];
  EXPECT_EQ(closing["choices"][0]["finish_reason"], j["choices"][0]["finish_reason"]);
  const json& usage = ev[ev.size() - 2];
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], j["usage"]);
  EXPECT_EQ(streamed, content);
  // Completions stream too.
  auto r2 = c.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 3, "stream": true})",
                   "application/json");
  ASSERT_TRUE(r2);
  const auto ev2 = sse_events(r2->body);
  ASSERT_GE(ev2.size(), 2u);
  EXPECT_EQ(ev2.back(), "[DONE]");
  EXPECT_EQ(ev2[0]["object"], "text_completion");
}

TEST_F(ServeHttp, BadInputIsA400NamingTheField) {
  const std::string chat = "/v1/chat/completions", cmpl = "/v1/completions";
  expect_openai_error(chat, "{not json", "body");
  expect_openai_error(chat, "[]", "body");
  expect_openai_error(chat, R"({"messages": "hello"})", "messages");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": 5}]})",
                      "messages[0].content");
  expect_openai_error(chat,
                      R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})",
                      "temperature");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})",
                      "max_tokens");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": "x"}], "n": 3})", "n");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})",
                      "stop");
  // Unknown fields are named in the message.
  auto [st, j] = post(chat, R"({"messages": [{"role": "user", "content": "x"}], "temprature": 1})");
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "temprature");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("temprature"), std::string::npos);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("(did you mean 'temperature'?)"),
            std::string::npos)
      << j.dump();
  // Context length (256 tokens): a long prompt, and prompt + max_tokens.
  const std::string long_prompt(300, 'a');
  auto [st2, j2] = post(cmpl, json{{"prompt", long_prompt}}.dump());
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(j2["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(j2["error"]["param"], "prompt");
  expect_openai_error(cmpl, R"({"prompt": "abc", "max_tokens": 254})", "max_tokens");
  expect_openai_error(cmpl, R"({"prompt": [1, 99999]})", "prompt");
  expect_openai_error(cmpl, R"({"max_tokens": 3})", "prompt");
  // The guide route: same checks, its own error body.
  auto [st3, j3] = post("/", R"({"prompt": "x", "history": [["only one"]]})");
  EXPECT_EQ(st3, 400);
  EXPECT_EQ(j3["status"], 400);
  EXPECT_EQ(j3["param"], "history[0]");
  auto [st4, j4] = post("/", R"({"prompt": 1})");
  EXPECT_EQ(st4, 400);
  EXPECT_EQ(j4["param"], "prompt");
  auto [st5, j5] = post("/", R"({"prompt": "x", "histroy": []})");
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(j5["param"], "histroy");
  auto [st6, j6] = post("/", json{{"prompt", long_prompt}}.dump());
  EXPECT_EQ(st6, 400);
  // Too large a body (limit 4096 bytes in this test) and unknown routes.
  auto c = client();
  auto big = c.Post("/v1/completions", json{{"prompt", std::string(8000, 'x')}}.dump(),
                    "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  auto nf = c.Get("/nowhere");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["type"], "not_found_error");
  // Still serving.
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(ServeHttp, ConcurrentClientsAreServed) {
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(60, 0);
      auto r =
          c.Post("/v1/completions",
                 json{{"prompt", "q" + std::to_string(i)}, {"max_tokens", 4}, {"seed", i}}.dump(),
                 "application/json");
      if (r && r->status == 200) ++ok;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok, 8);
}

// At most 1 + max_queue generation requests are held; the next is a 503 naming the limit, and a
// released slot admits again.
TEST(ServeAdmission, BoundsWaitingRequests) {
  ds::serve::Admission gate(1, 1);
  auto a = gate.admit();
  auto b = gate.admit();
  EXPECT_EQ(gate.admitted(), 2);
  try {
    gate.admit();
    ADD_FAILURE() << "a third request was admitted";
  } catch (const ds::serve::ApiError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_NE(std::string(e.what()).find("--max_queue 1"), std::string::npos) << e.what();
  }
  b.reset();
  EXPECT_EQ(gate.admitted(), 1);
  auto c = gate.admit();
  EXPECT_EQ(gate.admitted(), 2);
}

// GET /metrics: Prometheus text format; a generation, a 400 and a 404 move exactly the counters
// they should, and the token counters add up to the replies' usage.
TEST_F(ServeHttp, MetricsCountRequestsTokensAndLatency) {
  auto c = client();
  auto scrape = [&] {
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r);
    if (!r) return std::map<std::string, double>{};
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/plain; version=0.0.4"),
              std::string::npos);
    EXPECT_NE(r->body.find("# TYPE ds_serve_request_duration_seconds histogram"),
              std::string::npos);
    return parse_metrics(r->body);
  };
  // A reply is counted by httplib's logger after its last byte is sent, so the client may see a
  // reply (the previous test's, or the 404 below) before it is counted: scrape until two scrapes
  // 50 ms apart agree (the /metrics route's own counter aside).
  auto settled = [&] {
    auto prev = scrape();
    for (int i = 0; i < 40; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto cur = scrape();
      bool same = cur.size() == prev.size();
      for (const auto& [k, v] : cur) {
        if (k.find("route=\"/metrics\"") != std::string::npos) continue;
        auto it = prev.find(k);
        same = same && it != prev.end() && it->second == v;
      }
      if (same) return cur;
      prev = cur;
    }
    return prev;
  };
  const auto before = settled();
  auto [st, j] = post("/v1/completions", R"({"prompt": "metrics", "max_tokens": 5,
                                              "temperature": 0})");
  ASSERT_EQ(st, 200) << j.dump();
  auto [st2, j2] = post("/v1/completions", R"({"prompt": "x", "max_tokens": "five"})");
  ASSERT_EQ(st2, 400);
  auto nf = c.Get("/no/such/route");
  ASSERT_TRUE(nf);
  ASSERT_EQ(nf->status, 404);
  const auto after = settled();
  auto delta = [&](const std::string& key) {
    auto a = after.find(key);
    auto b = before.find(key);
    return (a == after.end() ? 0.0 : a->second) - (b == before.end() ? 0.0 : b->second);
  };
  EXPECT_EQ(delta(R"(ds_serve_requests_total{route="/v1/completions",status="200"})"), 1.0);
  EXPECT_EQ(delta(R"(ds_serve_requests_total{route="/v1/completions",status="400"})"), 1.0);
  EXPECT_EQ(delta(R"(ds_serve_requests_total{route="other",status="404"})"), 1.0);
  // The first scrape is counted by the time of the second.
  EXPECT_GE(after.at(R"(ds_serve_requests_total{route="/metrics",status="200"})"), 1.0);
  EXPECT_EQ(delta("ds_serve_prompt_tokens_total"), j["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(delta("ds_serve_completion_tokens_total"),
            j["usage"]["completion_tokens"].get<double>());
  EXPECT_EQ(delta("ds_serve_request_duration_seconds_count"), 1.0);
  EXPECT_EQ(delta("ds_serve_time_to_first_token_seconds_count"), 1.0);
  EXPECT_GT(delta("ds_serve_request_duration_seconds_sum"), 0.0);
  EXPECT_EQ(after.at("ds_serve_requests_in_flight"), 0.0);
  EXPECT_EQ(after.at("ds_serve_requests_running"), 0.0);
  EXPECT_EQ(after.at("ds_serve_requests_waiting"), 0.0);
  EXPECT_EQ(after.at("ds_serve_max_queue"), 16.0);
  EXPECT_EQ(after.at("ds_serve_max_batch"), 8.0);
  // One request alone: its first token comes from the prefill, each other from a decode step of
  // one sequence.
  const double steps = j["usage"]["completion_tokens"].get<double>() - 1.0;
  EXPECT_EQ(delta("ds_serve_decode_steps_total"), steps);
  EXPECT_EQ(delta(R"(ds_serve_batch_size_bucket{le="1"})"), steps);
  EXPECT_EQ(delta("ds_serve_batch_size_sum"), steps);
  // Histogram buckets are cumulative and end at the count.
  for (const std::string h :
       {"ds_serve_request_duration_seconds", "ds_serve_time_to_first_token_seconds"}) {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    for (const auto& [k, v] : after)
      if (k.rfind(h + "_bucket{le=\"", 0) == 0 && k.find("+Inf") == std::string::npos)
        buckets.emplace_back(std::stod(k.substr(h.size() + 12)), v);
    std::sort(buckets.begin(), buckets.end());
    ASSERT_GE(buckets.size(), 5u) << h;
    for (size_t i = 1; i < buckets.size(); ++i) EXPECT_GE(buckets[i].second, buckets[i - 1].second);
    EXPECT_LE(buckets.back().second, after.at(h + "_count"));
    EXPECT_EQ(after.at(h + R"(_bucket{le="+Inf"})"), after.at(h + "_count")) << h;
  }
}

// The exposition format of the histograms: cumulative buckets in order of their bounds, +Inf last
// and equal to _count, _sum the total.
TEST(ServeMetrics, HistogramIsCumulative) {
  ds::serve::Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 50.0}) h.observe(v);
  std::string out;
  h.render(out, "x");
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 2\n"
            "x_bucket{le=\"1\"} 3\n"
            "x_bucket{le=\"10\"} 4\n"
            "x_bucket{le=\"+Inf\"} 5\n"
            "x_sum 52.65\n"
            "x_count 5\n");
  ds::serve::Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/", 503);
  m.record_generation(7, 3, 0.2, 0.05);
  m.record_generation(4, 0, 0.1, -1.0);  // no token: no time to first token
  m.record_decode_step(3);
  const std::string text = m.render({2, 1, 1, 16, 8});
  const auto v = parse_metrics(text);
  EXPECT_EQ(v.at(R"(ds_serve_requests_total{route="/v1/completions",status="200"})"), 2.0);
  EXPECT_EQ(v.at(R"(ds_serve_requests_total{route="/",status="503"})"), 1.0);
  EXPECT_EQ(v.at("ds_serve_prompt_tokens_total"), 11.0);
  EXPECT_EQ(v.at("ds_serve_completion_tokens_total"), 3.0);
  EXPECT_EQ(v.at("ds_serve_request_duration_seconds_count"), 2.0);
  EXPECT_EQ(v.at("ds_serve_time_to_first_token_seconds_count"), 1.0);
  EXPECT_EQ(v.at("ds_serve_requests_in_flight"), 2.0);
  EXPECT_EQ(v.at("ds_serve_requests_waiting"), 1.0);
  EXPECT_EQ(v.at("ds_serve_max_batch"), 8.0);
  EXPECT_EQ(v.at("ds_serve_decode_steps_total"), 1.0);
  EXPECT_EQ(v.at(R"(ds_serve_batch_size_bucket{le="2"})"), 0.0);
  EXPECT_EQ(v.at(R"(ds_serve_batch_size_bucket{le="4"})"), 1.0);
}

// ---- Clients that go away ----
//
// A server with a model whose generations take seconds (serve_fixture.h: make_slow_model, no end
// of text before max_tokens). Clients are raw sockets so the test decides when they close.
namespace {

class RawClient {
 public:
  RawClient(int port, const std::string& path, const std::string& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const std::string req = "POST " + path +
                            " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Content-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    EXPECT_EQ(::send(fd_, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  }
  ~RawClient() { close(); }
  // Reads until `what` has arrived (or 30 s pass); returns what was read.
  std::string read_until(const std::string& what) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    char buf[4096];
    while (got.find(what) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

class ServeCancel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new serve_test::TempDir("cancel");
    ds::models::export_hf(*serve_test::make_slow_model(), dir_->path() / "slow");
    ds::serve::ServerOptions o;
    o.port = 0;
    o.log_requests = false;
    o.sse_ping_seconds = 0.05;
    o.max_batch = 1;  // a second request waits for the first (the waiting-client tests)
    server_ = new ds::serve::Server(ds::serve::load_model(dir_->path() / "slow"), o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->run(); });
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete dir_;
  }
  static std::map<std::string, double> scrape() {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? parse_metrics(r->body) : std::map<std::string, double>{};
  }
  static double metric(const std::string& name) {
    const auto m = scrape();
    auto it = m.find(name);
    return it == m.end() ? 0.0 : it->second;
  }
  // Polls /metrics until pred holds (true) or `seconds` pass (false).
  static bool wait_for(const std::function<bool(const std::map<std::string, double>&)>& pred,
                       double seconds = 30.0) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(scrape())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static double at(const std::map<std::string, double>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? 0.0 : it->second;
  }
  static inline serve_test::TempDir* dir_ = nullptr;
  static inline ds::serve::Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
};

const std::string kLong = R"({"prompt": "a", "max_tokens": 4000, "temperature": 0})";
const std::string kLongStream =
    R"({"prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": true})";

}  // namespace

// A non-streaming client writes nothing back until its answer, so only the socket tells that it
// left: its generation stops, with a fraction of its 4000 tokens, and its slot is freed.
TEST_F(ServeCancel, NonStreamingClientThatLeavesStopsItsGeneration) {
  const auto before = scrape();
  {
    RawClient c(port_, "/v1/completions", kLong);
    ASSERT_TRUE(wait_for([](const auto& m) { return at(m, "ds_serve_requests_running") == 1; }));
  }  // closes
  ASSERT_TRUE(wait_for([](const auto& m) { return at(m, "ds_serve_requests_in_flight") == 0; }, 5))
      << "the generation went on after its client left";
  const auto after = scrape();
  EXPECT_EQ(at(after, "ds_serve_generations_cancelled_total") -
                at(before, "ds_serve_generations_cancelled_total"),
            1.0);
  const double tokens = at(after, "ds_serve_completion_tokens_total") -
                        at(before, "ds_serve_completion_tokens_total");
  EXPECT_LT(tokens, 4000.0);
  // Counted as 499 (client closed request) once httplib has given up on the reply.
  EXPECT_TRUE(wait_for([](const auto& m) {
    return at(m, R"(ds_serve_requests_total{route="/v1/completions",status="499"})") >= 1;
  }));
}

TEST_F(ServeCancel, StreamingClientThatLeavesStopsItsGeneration) {
  const auto before = scrape();
  {
    RawClient c(port_, "/v1/completions", kLongStream);
    const std::string got = c.read_until("\"text\":");  // a first piece of text has come
    ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
  }
  ASSERT_TRUE(wait_for([](const auto& m) { return at(m, "ds_serve_requests_in_flight") == 0; }, 5));
  const auto after = scrape();
  EXPECT_EQ(at(after, "ds_serve_generations_cancelled_total") -
                at(before, "ds_serve_generations_cancelled_total"),
            1.0);
  EXPECT_LT(at(after, "ds_serve_completion_tokens_total") -
                at(before, "ds_serve_completion_tokens_total"),
            4000.0);
}

// A client waiting in the queue behind a long generation leaves: its slot is free at once, while
// the generation ahead of it still runs (not when its turn would have come).
TEST_F(ServeCancel, WaitingClientThatLeavesFreesItsSlotAtOnce) {
  const auto before = scrape();
  RawClient running(port_, "/v1/completions", kLongStream);
  running.read_until("\"text\":");
  {
    RawClient waiting(port_, "/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})");
    ASSERT_TRUE(wait_for([](const auto& m) {
      return at(m, "ds_serve_requests_in_flight") == 2 && at(m, "ds_serve_requests_waiting") == 1;
    }));
  }
  ASSERT_TRUE(wait_for(
      [](const auto& m) {
        return at(m, "ds_serve_requests_in_flight") == 1 && at(m, "ds_serve_requests_waiting") == 0;
      },
      5));
  EXPECT_EQ(metric("ds_serve_requests_running"), 1.0) << "the long generation should still run";
  running.close();
  ASSERT_TRUE(wait_for([](const auto& m) { return at(m, "ds_serve_requests_in_flight") == 0; }, 5));
  // Both were cancelled; the waiting one never generated a token.
  EXPECT_EQ(metric("ds_serve_generations_cancelled_total") -
                at(before, "ds_serve_generations_cancelled_total"),
            2.0);
}

// A stream waiting for its turn gets SSE comment pings (every sse_ping_seconds, 0.05 s here), so
// clients and proxies do not time it out; no text comes before its turn.
TEST_F(ServeCancel, WaitingStreamGetsPings) {
  RawClient running(port_, "/v1/completions", kLongStream);
  running.read_until("\"text\":");
  RawClient waiting(port_, "/v1/completions", kLongStream);
  // Two pings at least (in the raw bytes each sits in its own HTTP chunk).
  std::string got = waiting.read_until(": ping\n\n");
  got += waiting.read_until(": ping\n\n");
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  size_t pings = 0;
  for (size_t at = got.find(": ping\n\n"); at != std::string::npos;
       at = got.find(": ping\n\n", at + 1))
    ++pings;
  EXPECT_GE(pings, 2u) << got;
  EXPECT_EQ(got.find("\"text\":"), std::string::npos) << "text before its turn: " << got;
  EXPECT_EQ(metric("ds_serve_requests_waiting"), 1.0);
  waiting.close();
  running.close();
  ASSERT_TRUE(wait_for([](const auto& m) { return at(m, "ds_serve_requests_in_flight") == 0; }, 5));
}

// ---- 32 concurrent clients ----
namespace {

// A server on its own thread for one test.
struct RunningServer {
  ds::serve::Server server;
  int port;
  std::thread thread;
  RunningServer(const std::filesystem::path& model, ds::serve::ServerOptions o)
      : server(ds::serve::load_model(model), (o.port = 0, o.log_requests = false, o)),
        port(server.bind()),
        thread([this] { server.run(); }) {}
  ~RunningServer() {
    server.stop();
    thread.join();
  }
};

struct Reply {
  int status = 0;
  std::string text, finish, retry_after;
  json usage, error;
};

// One request of client i's kind; a streamed reply is reassembled into text/finish/usage.
Reply send_request(int port, const std::string& path, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  Reply out;
  if (!r) {
    out.error = "no reply: " + httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.retry_after = r->get_header_value("Retry-After");
  if (r->status != 200) {
    const json j = json::parse(r->body, nullptr, false);
    out.error = j.is_discarded() ? json(r->body) : j;
    return out;
  }
  const bool chat = path == "/v1/chat/completions";
  if (body.value("stream", false)) {
    for (const json& ev : sse_events(r->body)) {
      if (ev == "[DONE]") continue;
      if (ev.contains("usage")) out.usage = ev["usage"];
      if (ev["choices"].empty()) continue;
      const json& ch = ev["choices"][0];
      out.text += chat ? ch["delta"].value("content", "") : ch.value("text", "");
      if (!ch["finish_reason"].is_null()) out.finish = ch["finish_reason"];
    }
  } else {
    const json j = json::parse(r->body);
    if (path == "/") {
      out.text = j["response"];
      out.finish = "-";
      return out;
    }
    const json& ch = j["choices"][0];
    out.text = chat ? ch["message"]["content"].get<std::string>() : ch["text"].get<std::string>();
    out.finish = ch["finish_reason"];
    out.usage = j["usage"];
  }
  return out;
}

// Runs fn(i) for i in 0 .. n-1 on n threads that start together; returns when all are done.
void all_at_once(int n, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      ++ready;
      while (ready < n) std::this_thread::yield();
      fn(i);
    });
  for (auto& t : ts) t.join();
}

// Client i's request: the five kinds of generation request in turn (OpenAI completions and chat,
// streaming or not, and the guide's POST /), each with its own prompt and seed.
std::pair<std::string, json> client_request(int i) {
  const std::string text = "client " + std::to_string(i) + " says";
  const bool stream = (i / 5) % 2 == 1;
  json sampling = {{"max_tokens", 12}, {"temperature", 0.8}, {"seed", i}};
  switch (i % 5) {
    case 0:
    case 1: {
      json b = sampling;
      b["prompt"] = text;
      b["stream"] = stream || i % 5 == 1;
      if (b["stream"]) b["stream_options"] = {{"include_usage", true}};
      return {"/v1/completions", b};
    }
    case 2:
    case 3: {
      json b = sampling;
      b["messages"] = json::array({{{"role", "user"}, {"content", text}}});
      b["stream"] = stream || i % 5 == 3;
      if (b["stream"]) b["stream_options"] = {{"include_usage", true}};
      return {"/v1/chat/completions", b};
    }
    default:
      return {"/", {{"prompt", text}, {"history", json::array()}, {"max_length", 40}}};
  }
}

}  // namespace

// 32 clients at once, each a different request: every answer equals the one the same request got
// alone (so requests do not see each other's state), a malformed request in the middle gets its
// 400 naming the field, and the server still answers afterwards.
TEST(ServeConcurrency, ThirtyTwoClientsGetTheirOwnAnswers) {
  serve_test::TempDir dir("concurrent");
  ds::models::export_hf(*serve_test::make_model(serve_test::tiny_gpt2(256)), dir.path() / "tiny");
  ds::serve::ServerOptions o;
  o.http_threads = 40;
  o.max_queue = 40;  // room for everyone: no 503 here
  RunningServer s(dir.path() / "tiny", o);
  constexpr int kClients = 32, kBad = 16;  // client 16 sends a malformed request
  std::vector<Reply> alone(kClients);
  for (int i = 0; i < kClients; ++i) {
    if (i == kBad) continue;
    auto [path, body] = client_request(i);
    alone[i] = send_request(s.port, path, body);
    ASSERT_EQ(alone[i].status, 200) << path << " " << body.dump() << " " << alone[i].error.dump();
    ASSERT_FALSE(alone[i].finish.empty());
  }
  std::vector<Reply> together(kClients);
  all_at_once(kClients, [&](int i) {
    if (i == kBad) {
      together[i] = send_request(
          s.port, "/v1/chat/completions",
          {{"messages", json::array({{{"role", "user"}, {"content", 5}}})}, {"max_tokens", 4}});
      return;
    }
    auto [path, body] = client_request(i);
    together[i] = send_request(s.port, path, body);
  });
  for (int i = 0; i < kClients; ++i) {
    if (i == kBad) continue;
    EXPECT_EQ(together[i].status, 200) << "client " << i << ": " << together[i].error.dump();
    EXPECT_EQ(together[i].text, alone[i].text) << "client " << i;
    EXPECT_EQ(together[i].finish, alone[i].finish) << "client " << i;
    EXPECT_EQ(together[i].usage, alone[i].usage) << "client " << i;
  }
  EXPECT_EQ(together[kBad].status, 400);
  EXPECT_EQ(together[kBad].error["error"]["param"], "messages[0].content")
      << together[kBad].error.dump();
  httplib::Client c("127.0.0.1", s.port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  // A slot is released when its handler (a stream: its content provider) is destroyed, which can
  // come a moment after the client has read the whole reply: the gauge reaches 0 shortly after,
  // never stays above it.
  double in_flight = -1.0;
  for (int i = 0; i < 500; ++i) {
    in_flight = parse_metrics(c.Get("/metrics")->body).at("ds_serve_requests_in_flight");
    if (in_flight == 0.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(in_flight, 0.0);
}

// 32 clients at once against a queue of 2 and generations that take a while: each gets either
// the answer (the same as alone) or a well-formed 503 with Retry-After, never anything else; the
// server goes on serving.
TEST(ServeConcurrency, ThirtyTwoClientsAgainstASmallQueueGetAnswersOr503) {
  serve_test::TempDir dir("busy");
  ds::models::export_hf(*serve_test::make_slow_model(), dir.path() / "slow");
  ds::serve::ServerOptions o;
  o.http_threads = 40;
  o.max_queue = 2;
  RunningServer s(dir.path() / "slow", o);
  const json body = {{"prompt", "busy"}, {"max_tokens", 100}, {"temperature", 0}};
  const Reply alone = send_request(s.port, "/v1/completions", body);
  ASSERT_EQ(alone.status, 200) << alone.error.dump();
  constexpr int kClients = 32;
  std::vector<Reply> got(kClients);
  all_at_once(kClients, [&](int i) { got[i] = send_request(s.port, "/v1/completions", body); });
  int ok = 0, busy = 0;
  for (int i = 0; i < kClients; ++i) {
    if (got[i].status == 200) {
      ++ok;
      EXPECT_EQ(got[i].text, alone.text) << "client " << i;
      EXPECT_EQ(got[i].usage, alone.usage) << "client " << i;
    } else {
      ++busy;
      EXPECT_EQ(got[i].status, 503) << "client " << i << ": " << got[i].error.dump();
      EXPECT_EQ(got[i].retry_after, "1");
      EXPECT_EQ(got[i].error["error"]["type"], "server_busy") << got[i].error.dump();
    }
  }
  // The first arrival always runs; with 32 arrivals at once and room for 3, most are turned away.
  EXPECT_GE(ok, 1);
  EXPECT_GE(busy, 1);
  EXPECT_EQ(ok + busy, kClients);
  const Reply after = send_request(s.port, "/v1/completions", body);
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.text, alone.text);
}

// Continuous batching through HTTP: 4 clients at once share decode steps. Counted, not timed:
// every token but each request's first is one row of some decode step (batch_size_sum: exactly
// 4 x 199), and the steps number far fewer than the 4 x 199 of one generation at a time (about
// 199 when the four arrive together; the bound leaves room for arrivals ~200 steps apart).
TEST(ServeConcurrency, ConcurrentRequestsShareDecodeSteps) {
  serve_test::TempDir dir("batch");
  ds::models::export_hf(*serve_test::make_slow_model(), dir.path() / "slow");
  ds::serve::ServerOptions o;
  o.max_batch = 4;
  RunningServer s(dir.path() / "slow", o);
  httplib::Client c("127.0.0.1", s.port);
  auto scrape = [&] { return parse_metrics(c.Get("/metrics")->body); };
  const auto before = scrape();
  constexpr int kClients = 4, kTokens = 200;
  std::vector<Reply> got(kClients);
  all_at_once(kClients, [&](int i) {
    got[i] = send_request(s.port, "/v1/completions",
                          {{"prompt", "share " + std::to_string(i)},
                           {"max_tokens", kTokens},
                           {"temperature", 0},
                           {"stream", i % 2 == 1}});
  });
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(got[i].status, 200) << got[i].error.dump();
    EXPECT_EQ(got[i].finish, "length");
  }
  const auto after = scrape();
  auto delta = [&](const std::string& k) {
    return after.at(k) - (before.count(k) ? before.at(k) : 0.0);
  };
  EXPECT_EQ(delta("ds_serve_batch_size_sum"), kClients * (kTokens - 1));
  EXPECT_EQ(delta("ds_serve_completion_tokens_total"), kClients * kTokens);
  const double steps = delta("ds_serve_decode_steps_total");
  EXPECT_GE(steps, kTokens - 1);
  EXPECT_LE(steps, 2 * (kTokens - 1)) << "sequential would be " << kClients * (kTokens - 1);
  // Some steps held three or four.
  EXPECT_GT(delta("ds_serve_batch_size_count") - delta(R"(ds_serve_batch_size_bucket{le="2"})"),
            0.0);
}

// ---- Availability and HTTP correctness at the byte level ----
//
// Clients here are raw loopback sockets (127.0.0.1 only) that drip bytes, send chunked bodies and
// pipeline requests; every read has a deadline, so a server that misbehaves fails the test instead
// of hanging it.
namespace {

class Conn {
 public:
  explicit Conn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    EXPECT_TRUE(connected_);
  }
  ~Conn() { close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  // False once the server has closed (or reset) the connection.
  bool send(const std::string& bytes) {
    return fd_ >= 0 && ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                           static_cast<ssize_t>(bytes.size());
  }
  // Reads until `what` has arrived, the peer closes, or `seconds` pass; returns all read so far.
  std::string read_until(const std::string& what, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    while (!eof_ && got_.find(what) == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      poll_once(50);
    return got_;
  }
  // Reads until the peer closes or `seconds` pass (then closed() is false).
  std::string read_to_close(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    while (!eof_ && std::chrono::steady_clock::now() < deadline) poll_once(50);
    return got_;
  }
  // Whatever has arrived, without waiting.
  const std::string& got() {
    while (!eof_ && poll_once(0)) {
    }
    return got_;
  }
  bool closed() const { return eof_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool poll_once(int ms) {
    if (fd_ < 0) {
      eof_ = true;
      return false;
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char buf[8192];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    got_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false, eof_ = false;
  std::string got_;
};

std::string post_request(const std::string& path, const std::string& body,
                         const std::string& extra_headers = "Content-Type: application/json\r\n",
                         const std::string& version = "HTTP/1.1") {
  return "POST " + path + " " + version + "\r\nHost: 127.0.0.1\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct RawReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

// Replies in a byte stream: bodies by Content-Length, or to the end when there is none (a
// close-delimited body); 1xx interim replies are skipped.
std::vector<RawReply> parse_replies(const std::string& bytes) {
  std::vector<RawReply> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t end = bytes.find("\r\n\r\n", pos);
    if (end == std::string::npos || bytes.compare(pos, 5, "HTTP/") != 0) break;
    RawReply r;
    std::istringstream head(bytes.substr(pos, end - pos));
    std::string line;
    std::getline(head, line);
    r.status = std::stoi(line.substr(9, 3));
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    pos = end + 4;
    if (r.status < 200) continue;  // an interim reply has no body
    if (r.headers.count("content-length")) {
      const size_t n = std::stoul(r.headers["content-length"]);
      r.body = bytes.substr(pos, n);
      pos += n;
    } else {
      r.body = bytes.substr(pos);
      pos = bytes.size();
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::map<std::string, double> scrape_metrics(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(5, 0);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? parse_metrics(r->body) : std::map<std::string, double>{};
}

double metric_of(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? -1.0 : it->second;
}

// Polls /metrics until pred holds or `seconds` pass.
bool wait_metrics(int port, const std::function<bool(const std::map<std::string, double>&)>& pred,
                  double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(scrape_metrics(port))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

const std::string kLongRequest = R"({"prompt": "a", "max_tokens": 4000, "temperature": 0})";
const std::string kLongStreamRequest =
    R"({"prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": true})";

}  // namespace

// Slowloris: 20 connections (more than --http_threads 8) each send a request line and then a
// header line every 250 ms. /health still answers while they drip, and each of them gets a 408
// once its headers have taken longer than --header_timeout (1.5 s here) and is closed.
TEST(ServeAvailability, SlowlorisConnectionsTimeOutAndDoNotBlockHealth) {
  serve_test::TempDir dir("slowloris");
  ds::models::export_hf(*serve_test::make_model(serve_test::tiny_gpt2(64)), dir.path() / "tiny");
  ds::serve::ServerOptions o;
  o.header_timeout_seconds = 1.5;
  RunningServer s(dir.path() / "tiny", o);
  constexpr int kDrips = 20;
  std::vector<std::unique_ptr<Conn>> drips;
  for (int i = 0; i < kDrips; ++i) {
    drips.push_back(std::make_unique<Conn>(s.port));
    drips.back()->send("POST /v1/completions HTTP/1.1\r\n");
  }
  std::atomic<bool> stop{false};
  std::thread dripper([&] {  // at most 8 s of dripping
    for (int t = 0; t < 32 && !stop; ++t) {
      for (int i = 0; i < kDrips; ++i) drips[i]->send("X-Drip-" + std::to_string(t) + ": 1\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // they hold their connections
  httplib::Client c("127.0.0.1", s.port);
  c.set_connection_timeout(4, 0);
  c.set_read_timeout(4, 0);
  auto h = c.Get("/health");
  const bool health_ok = h && h->status == 200;
  int timed_out = 0;
  for (auto& d : drips) {
    const std::string got = d->read_to_close(8.0);
    const auto replies = parse_replies(got);
    if (d->closed() && replies.size() == 1 && replies[0].status == 408) ++timed_out;
  }
  stop = true;
  dripper.join();
  EXPECT_TRUE(health_ok) << "/health did not answer while slow clients dripped headers";
  EXPECT_EQ(timed_out, kDrips) << "each dripping connection should get a 408 and be closed";
}

// /health and /metrics answer while 8 streams (as many as --http_threads and --max_batch) run.
TEST(ServeAvailability, HealthAndMetricsAnswerWhileStreamsRun) {
  serve_test::TempDir dir("health");
  ds::models::export_hf(*serve_test::make_slow_model(), dir.path() / "slow");
  ds::serve::ServerOptions o;  // http_threads 8, max_batch 8
  RunningServer s(dir.path() / "slow", o);
  std::vector<std::unique_ptr<Conn>> streams;
  for (int i = 0; i < 8; ++i) {
    streams.push_back(std::make_unique<Conn>(s.port));
    streams.back()->send(post_request("/v1/completions", kLongStreamRequest));
  }
  for (auto& st : streams)
    ASSERT_NE(st->read_until("\"text\":", 30).find("\"text\":"), std::string::npos);
  httplib::Client c("127.0.0.1", s.port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(5, 0);
  auto h = c.Get("/health");
  auto m = c.Get("/metrics");
  EXPECT_TRUE(h && h->status == 200) << "/health waited behind the streams";
  ASSERT_TRUE(m && m->status == 200) << "/metrics waited behind the streams";
  EXPECT_EQ(parse_metrics(m->body).at("ds_serve_requests_running"), 8.0);
  streams.clear();
  EXPECT_TRUE(wait_metrics(
      s.port, [](const auto& v) { return metric_of(v, "ds_serve_requests_in_flight") == 0; }, 10));
}

// A chunked body over --max_body_bytes (4096 here) is a 413 while it is read; one under the limit
// is decoded and served.
TEST_F(ServeHttp, ChunkedBodyOverTheLimitIs413) {
  {
    Conn c(port_);
    c.send(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        "application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string body = R"({"prompt": ")" + std::string(64 * 1024, 'x') + R"("})";
    for (size_t at = 0; at < body.size(); at += 1024) {
      const std::string piece = body.substr(at, 1024);
      if (!c.send(fmt::format("{:x}\r\n{}\r\n", piece.size(), piece))) break;  // refused early
    }
    c.send("0\r\n\r\n");
    const auto replies = parse_replies(c.read_to_close(10));
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].status, 413) << replies[0].body;
    EXPECT_EQ(json::parse(replies[0].body)["error"]["param"], "body") << replies[0].body;
  }
  // Under the limit, in uneven chunks with an extension and a trailer: decoded and served.
  std::string chunked;
  for (const char* piece : {R"({"prompt": )", R"("ab", "max_tokens": 2, "seed")", ": 1", "}"})
    chunked +=
        fmt::format("{:x}{}\r\n{}\r\n", std::strlen(piece), piece[0] == '"' ? ";ext=1" : "", piece);
  Conn c(port_);
  c.send(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
      chunked + "0\r\nX-Trailer: 1\r\n\r\n");
  const auto replies = parse_replies(c.read_to_close(30));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].status, 200) << replies[0].body;
  EXPECT_EQ(json::parse(replies[0].body)["object"], "text_completion");
}

// Numbers a double cannot hold are a 400 naming their field (not a 500 with the JSON library's
// message); a whole number past int64 is out of range, not a fraction.
TEST_F(ServeHttp, OverflowingNumbersAre400NamingTheField) {
  const std::string cmpl = "/v1/completions", chat = "/v1/chat/completions";
  expect_openai_error(cmpl, R"({"prompt": "a", "temperature": 1e309})", "temperature");
  expect_openai_error(cmpl, R"({"prompt": "a", "max_tokens": 1e400})", "max_tokens");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": "x"}], "top_p": -1e999})",
                      "top_p");
  expect_openai_error(chat, R"({"messages": [{"role": "user", "content": "x"}], "stop": [1e999]})",
                      "stop[0]");
  auto [st, j] = post(cmpl, R"({"prompt": "a", "max_tokens": 18446744073709551616})");
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  const std::string msg = j["error"]["message"];
  EXPECT_NE(msg.find("must be in"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("fraction"), std::string::npos) << msg;
  auto [st2, j2] = post("/", R"({"prompt": "x", "temperature": 1e309})");
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(j2["param"], "temperature");
}

// Pipelined requests (sent together on one connection) are all answered, in order.
TEST_F(ServeHttp, PipelinedRequestsAreAnsweredInOrder) {
  Conn c(port_);
  c.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" +
         post_request("/v1/completions", R"({"prompt": "ab", "max_tokens": 2, "seed": 1})") +
         "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const auto replies = parse_replies(c.read_to_close(30));
  ASSERT_EQ(replies.size(), 3u) << c.got();
  EXPECT_EQ(json::parse(replies[0].body)["status"], "ok");
  EXPECT_EQ(json::parse(replies[1].body)["object"], "text_completion");
  EXPECT_EQ(json::parse(replies[2].body)["object"], "list");
  EXPECT_TRUE(c.closed());
}

// A stream to an HTTP/1.0 client is not chunked (RFC 9112 forbids it): the body ends with the
// connection.
TEST_F(ServeHttp, Http10StreamIsCloseDelimited) {
  Conn c(port_);
  c.send(post_request("/v1/completions", R"({"prompt": "ab", "max_tokens": 3, "stream": true})",
                      "Content-Type: application/json\r\n", "HTTP/1.0"));
  const std::string got = c.read_to_close(30);
  ASSERT_TRUE(c.closed()) << got;
  const auto replies = parse_replies(got);
  ASSERT_EQ(replies.size(), 1u) << got;
  EXPECT_EQ(replies[0].status, 200);
  EXPECT_EQ(replies[0].headers.count("transfer-encoding"), 0u) << got;
  EXPECT_EQ(replies[0].body.rfind("data: ", 0), 0u) << got;  // no chunk size line
  const auto ev = sse_events(replies[0].body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
}

// Two Content-Length headers that differ are a 400 (proxies could frame the body either way);
// equal ones are one length.
TEST_F(ServeHttp, ConflictingContentLengthIs400) {
  const std::string body = R"({"prompt": "ab", "max_tokens": 2})";
  {
    Conn c(port_);
    c.send(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nContent-Length: " + std::to_string(body.size() + 2) +
        "\r\n\r\n" + body + "  ");
    const auto replies = parse_replies(c.read_to_close(30));
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].status, 400) << replies[0].body;
    EXPECT_EQ(json::parse(replies[0].body)["error"]["param"], "Content-Length");
  }
  Conn c(port_);
  const std::string n = std::to_string(body.size());
  c.send(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nContent-Length: " +
      n + "\r\nContent-Length: " + n + "\r\n\r\n" + body);
  const auto replies = parse_replies(c.read_to_close(30));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].status, 200) << replies[0].body;
}

// GET /v1/models/{id}: the openai client's models.retrieve.
TEST_F(ServeHttp, ModelsRetrieveById) {
  auto c = client();
  auto r = c.Get("/v1/models/tiny");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["id"], "tiny");
  EXPECT_EQ(j["object"], "model");
  EXPECT_EQ(j["owned_by"], "deepspeed.cpp");
  auto nf = c.Get("/v1/models/gpt-4");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["code"], "model_not_found") << nf->body;
}

// Response ids are unique across restarts, not the same sequence on every server.
TEST(ServeAvailability, ResponseIdsDifferAcrossRestarts) {
  serve_test::TempDir dir("ids");
  ds::models::export_hf(*serve_test::make_model(serve_test::tiny_gpt2(64)), dir.path() / "tiny");
  const json body = {{"prompt", "a"}, {"max_tokens", 1}};
  std::vector<std::string> ids;
  for (int run = 0; run < 2; ++run) {
    RunningServer s(dir.path() / "tiny", {});
    for (int i = 0; i < 2; ++i) {
      httplib::Client c("127.0.0.1", s.port);
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r && r->status == 200);
      ids.push_back(json::parse(r->body)["id"]);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t k = i + 1; k < ids.size(); ++k) EXPECT_NE(ids[i], ids[k]) << i << " " << k;
  EXPECT_EQ(ids[0].rfind("cmpl-", 0), 0u) << ids[0];
}

// With the defaults (--http_threads 8, --max_batch 8, --max_queue 16), 30 clients at once: 24 are
// admitted and 6 answered 503 at once, although only 8 threads are kept ready; /metrics counts the
// open connections.
TEST(ServeAvailability, ConnectionsBeyondHttpThreadsAreAdmittedOr503) {
  serve_test::TempDir dir("limit");
  ds::models::export_hf(*serve_test::make_slow_model(), dir.path() / "slow");
  RunningServer s(dir.path() / "slow", {});
  constexpr int kClients = 30;
  std::vector<std::unique_ptr<Conn>> cs;
  for (int i = 0; i < kClients; ++i) {
    cs.push_back(std::make_unique<Conn>(s.port));
    cs.back()->send(post_request("/v1/completions", kLongRequest));
  }
  ASSERT_TRUE(wait_metrics(
      s.port, [](const auto& v) { return metric_of(v, "ds_serve_requests_in_flight") == 24; }, 15))
      << "max_batch + max_queue requests were never admitted";
  int busy = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (busy < kClients - 24 && std::chrono::steady_clock::now() < deadline) {
    busy = 0;
    for (auto& c : cs)
      if (c->got().find("HTTP/1.1 503") == 0) ++busy;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(busy, kClients - 24);
  for (auto& c : cs)
    if (c->got().find("HTTP/1.1 503") == 0) {
      const auto r = parse_replies(c->got());
      ASSERT_EQ(r.size(), 1u);
      EXPECT_EQ(json::parse(r[0].body)["error"]["type"], "server_busy");
    }
  const auto m = scrape_metrics(s.port);
  EXPECT_GE(metric_of(m, "ds_serve_connections_open"), 24.0);
  EXPECT_EQ(metric_of(m, "ds_serve_connections_queued"), 0.0);
  EXPECT_EQ(metric_of(m, "ds_serve_max_connections"), 256.0);
  cs.clear();
  EXPECT_TRUE(wait_metrics(
      s.port, [](const auto& v) { return metric_of(v, "ds_serve_requests_in_flight") == 0; }, 10));
}

// The JSON routes take only JSON bodies: a text/plain POST (what a cross-site form can send) is a
// 415, and the guide's curl (-H 'Content-Type: application/json') works, with a charset too.
TEST_F(ServeHttp, NonJsonContentTypeIs415) {
  const std::string body = R"({"prompt": "ab", "max_tokens": 2})";
  auto c = client();
  for (const char* type :
       {"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"}) {
    auto r = c.Post("/v1/completions", body, type);
    ASSERT_TRUE(r) << type;
    EXPECT_EQ(r->status, 415) << type << ": " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "Content-Type") << r->body;
  }
  auto g = c.Post("/", R"({"prompt": "x", "max_length": 8})", "text/plain");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 415);
  EXPECT_EQ(json::parse(g->body)["status"], 415);
  {  // no Content-Type at all
    Conn raw(port_);
    raw.send(post_request("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})",
                          "Connection: close\r\n"));
    const auto replies = parse_replies(raw.read_to_close(30));
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].status, 415);
  }
  for (const char* type :
       {"application/json", "application/json; charset=utf-8", "Application/JSON"}) {
    auto r = c.Post("/v1/completions", body, type);
    ASSERT_TRUE(r) << type;
    EXPECT_EQ(r->status, 200) << type << ": " << r->body;
  }
  auto guide =
      c.Post("/", R"({"prompt": "你好", "history": [], "max_length": 24})", "application/json");
  ASSERT_TRUE(guide);
  EXPECT_EQ(guide->status, 200);
}

// A client that sends `Expect: 100-continue` (curl does for large bodies) gets its 100 Continue
// before it sends the body, then its answer; other expectations are a 417.
TEST_F(ServeHttp, ExpectContinueIsAnswered) {
  const std::string body = R"({"prompt": "ab", "max_tokens": 2})";
  Conn c(port_);
  c.send(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n");
  ASSERT_NE(c.read_until("\r\n\r\n", 10).find("HTTP/1.1 100 Continue\r\n\r\n"), std::string::npos)
      << c.got();
  c.send(body);
  const auto replies = parse_replies(c.read_to_close(30));
  ASSERT_EQ(replies.size(), 1u) << c.got();
  EXPECT_EQ(replies[0].status, 200) << replies[0].body;
  Conn other(port_);
  other.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 200-ok\r\n\r\n");
  const auto refused = parse_replies(other.read_to_close(10));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status, 417);
}
