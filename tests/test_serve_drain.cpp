// ds_serve and ds_generate as programs: SIGTERM drains (new requests are refused, the stream in
// flight runs to its end, the process exits 0), a second signal cancels what is left at once, and
// the served answers equal ds_generate's for the same seed; non-finite options and folders neither
// program can load are refused by name.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/models/hf_io.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_io.h"
#include "ds/ops/ops.h"
#include "serve_fixture.h"

extern char** environ;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// ds_serve started on a free port, its stderr in a file.
class ServeProcess {
 public:
  ServeProcess(const std::filesystem::path& model, const std::filesystem::path& log,
               const std::string& drain_timeout = "120", const std::vector<std::string>& extra = {})
      : log_(log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> args = {DS_SERVE_BIN, "--model", model.string(),    "--port",     "0",
                                     "--threads",  "2",       "--drain_timeout", drain_timeout};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, DS_SERVE_BIN, &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    // The port, from the start-up line "... on http://127.0.0.1:<port> ...".
    const std::regex re(R"(on http://127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 3000 && port_ == 0; ++i) {
      std::smatch m;
      const std::string text = log_text();
      if (std::regex_search(text, m, re))
        port_ = std::stoi(m[1]);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(port_, 0) << log_text();
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  void signal(int sig) { ::kill(pid_, sig); }
  // The exit status (-1 when it did not exit within `seconds` or died of a signal).
  int wait_exit(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(seconds));
    while (Clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string log_text() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
};

// A streaming completion on its own thread: the body and how many text chunks arrived, and after
// `mark` was set, how many more.
struct Stream {
  std::string body;
  std::atomic<int> chunks{0}, chunks_after_mark{0};
  std::atomic<bool> mark{false}, done{false};
  std::thread t;
  Stream(int port, int max_tokens) {
    t = std::thread([this, port, max_tokens] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(300, 0);
      const std::string req = json{{"prompt", "a"},
                                   {"max_tokens", max_tokens},
                                   {"temperature", 0},
                                   {"stream", true},
                                   {"stream_options", {{"include_usage", true}}}}
                                  .dump();
      // httplib 0.11.4's client takes a content receiver only through send().
      httplib::Request r;
      r.method = "POST";
      r.path = "/v1/completions";
      r.set_header("Content-Type", "application/json");
      r.body = req;
      r.content_receiver = [this](const char* data, size_t n, uint64_t, uint64_t) {
        body.append(data, n);
        ++chunks;
        if (mark) ++chunks_after_mark;
        return true;
      };
      c.send(r);
      done = true;
    });
  }
  ~Stream() {
    if (t.joinable()) t.join();
  }
  void wait_first_chunk() {
    for (int i = 0; i < 30000 && chunks == 0 && !done; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// The usage of a completed stream, or null when it has none (cut off).
json stream_usage(const std::string& body) {
  size_t pos = 0;
  json usage;
  while ((pos = body.find("data: {", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const json j = json::parse(body.substr(pos + 6, end - pos - 6), nullptr, false);
    if (!j.is_discarded() && j.contains("usage")) usage = j["usage"];
    pos = end;
  }
  return usage;
}

class ServeDrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new serve_test::TempDir("drain");
    ds::models::export_hf(*serve_test::make_slow_model(), dir_->path() / "slow");
  }
  static void TearDownTestSuite() { delete dir_; }
  static inline serve_test::TempDir* dir_ = nullptr;
};

}  // namespace

TEST_F(ServeDrain, SigtermRefusesNewRequestsFinishesTheStreamAndExitsZero) {
  ServeProcess p(dir_->path() / "slow", dir_->path() / "drain.log");
  ASSERT_GT(p.port(), 0);
  Stream s(p.port(), 1000);
  s.wait_first_chunk();
  ASSERT_GT(s.chunks.load(), 0) << p.log_text();
  s.mark = true;
  p.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the watcher polls every 20 ms
  // New requests: 503 "shutting_down" while draining (or no answer once the listener is closed).
  {
    httplib::Client c("127.0.0.1", p.port());
    c.set_read_timeout(10, 0);
    auto r = c.Post("/v1/completions", R"({"prompt": "b", "max_tokens": 2})", "application/json");
    if (r) {
      EXPECT_EQ(r->status, 503) << r->body;
      EXPECT_EQ(json::parse(r->body)["error"]["code"], "shutting_down") << r->body;
      EXPECT_EQ(r->get_header_value("Retry-After"), "1");
      auto h = c.Get("/health");
      ASSERT_TRUE(h);
      EXPECT_EQ(h->status, 503);
      EXPECT_EQ(json::parse(h->body)["status"], "draining");
    }
  }
  EXPECT_EQ(p.wait_exit(300), 0) << p.log_text();
  s.t.join();
  // The stream was in flight when the signal came, and ran to its end.
  EXPECT_GT(s.chunks_after_mark.load(), 0) << "the generation ended before the signal";
  const json usage = stream_usage(s.body);
  ASSERT_FALSE(usage.is_null()) << s.body.substr(s.body.size() > 300 ? s.body.size() - 300 : 0);
  EXPECT_EQ(usage["completion_tokens"], 1000);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(p.log_text().find("draining"), std::string::npos) << p.log_text();
}

TEST_F(ServeDrain, SecondSignalCancelsWhatIsLeft) {
  ServeProcess p(dir_->path() / "slow", dir_->path() / "force.log");
  ASSERT_GT(p.port(), 0);
  Stream s(p.port(), 4000);
  s.wait_first_chunk();
  ASSERT_GT(s.chunks.load(), 0) << p.log_text();
  p.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  p.signal(SIGINT);
  EXPECT_EQ(p.wait_exit(60), 0) << p.log_text();
  s.t.join();
  // Cut off: no usage chunk, no [DONE].
  EXPECT_TRUE(stream_usage(s.body).is_null());
  EXPECT_EQ(s.body.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(p.log_text().find("cancelling 1 request"), std::string::npos) << p.log_text();
}

// A non-streaming request still generating when --drain_timeout runs out is cancelled; its client
// is still connected, so it gets a 503 that says why (not 499, "the client closed the connection").
TEST_F(ServeDrain, GenerationCancelledByTheDrainTimeoutIs503) {
  ServeProcess p(dir_->path() / "slow", dir_->path() / "timeout.log", "0.5");
  ASSERT_GT(p.port(), 0);
  int status = 0;
  std::string body;
  std::atomic<bool> done{false};
  std::thread client([&] {
    httplib::Client c("127.0.0.1", p.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 4000, "temperature": 0})",
                    "application/json");
    if (r) {
      status = r->status;
      body = r->body;
    }
    done = true;
  });
  // Running: /metrics says so.
  bool running = false;
  for (int i = 0; i < 1500 && !running && !done; ++i) {
    httplib::Client c("127.0.0.1", p.port());
    c.set_read_timeout(5, 0);
    if (auto m = c.Get("/metrics"))
      running = m->body.find("\nds_serve_requests_running 1\n") != std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(running) << p.log_text();
  p.signal(SIGTERM);
  client.join();
  EXPECT_EQ(p.wait_exit(60), 0) << p.log_text();
  EXPECT_EQ(status, 503) << body;
  const json j = json::parse(body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << body;
  EXPECT_EQ(j["error"]["code"], "shutting_down") << body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("drain_timeout"), std::string::npos)
      << body;
}

// The served answer equals ds_generate's for the same prompt, seed and sampling: both programs,
// one over HTTP and one on the command line, on the tiny LLaMA fixture. ds_generate writes raw
// bytes; the server's JSON replaces invalid UTF-8 (random weights make some) with U+FFFD, so
// ds_generate's text goes through the same replacement before comparing.
// dtype: both programs' --dtype (bf16: the same bf16 weights and caches on both sides).
void check_served_equals_generate(const std::string& dtype) {
  serve_test::TempDir dir("programs");
  const std::filesystem::path model = std::filesystem::path(DS_FIXTURE_DIR) / "generate/llama_gqa";
  ServeProcess p(model, dir.path() / "serve.log", "120", {"--dtype", dtype});
  ASSERT_GT(p.port(), 0);
  EXPECT_NE(p.log_text().find("parameters in " + dtype), std::string::npos) << p.log_text();
  struct Case {
    std::string prompt;
    double temperature;
    int top_k;
    double top_p;
    int seed;
  };
  for (const Case& c : {Case{"Hello", 0.0, 0, 1.0, 0}, Case{"Hello", 0.8, 40, 1.0, 5},
                        Case{"The quick brown fox", 1.0, 0, 0.9, 123}}) {
    httplib::Client http("127.0.0.1", p.port());
    http.set_read_timeout(60, 0);
    const json req = {{"prompt", c.prompt}, {"max_tokens", 20}, {"temperature", c.temperature},
                      {"top_k", c.top_k},   {"top_p", c.top_p}, {"seed", c.seed}};
    auto r = http.Post("/v1/completions", req.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string served = json::parse(r->body)["choices"][0]["text"];
    const std::string cmd = fmt::format(
        "'{}' --model '{}' --prompt '{}' --max_tokens 20 --temperature {} --top_k {} --top_p {} "
        "--seed {} --threads 1 --dtype {} 2>/dev/null",
        DS_GENERATE_BIN, model.string(), c.prompt, c.temperature, c.top_k, c.top_p, c.seed, dtype);
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ASSERT_EQ(pclose(f), 0) << cmd;
    ASSERT_FALSE(out.empty());
    ASSERT_EQ(out.back(), '\n');  // ds_generate ends its output with a newline
    out.pop_back();
    const std::string as_served =
        json::parse(json(out).dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_EQ(as_served, served) << "prompt '" << c.prompt << "' seed " << c.seed;
    EXPECT_FALSE(served.empty());
  }
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait_exit(60), 0) << p.log_text();
}

TEST(ServeProgram, ServedAnswersEqualDsGenerate) {
  check_served_equals_generate("fp32");
}
TEST(ServeProgram, ServedAnswersEqualDsGenerateBf16) {
  check_served_equals_generate("bf16");
}

namespace {

// Runs cmd through the shell; -> (exit status, stdout and stderr).
std::pair<int, std::string> run_program(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace

// nan and inf in a float option of either program are refused naming the option (before:
// ds_generate --length_penalty nan ran, printed nothing and "18446744073709551615 tokens", exit 0);
// folders they cannot load say why before any option is judged against them (before: an mT5
// folder or an adapter with --max_new_tokens was told "--max_new_tokens applies to
// encoder-decoders only", a run folder "holds no config.json").
TEST(ServeProgram, NonFiniteOptionsAndUnloadableFoldersAreRefusedByName) {
  const std::string model =
      (std::filesystem::path(DS_FIXTURE_DIR) / "hf_families" / "bart_s2s").string();
  const std::string gen = fmt::format("'{}' --model '{}' --prompt hi ", DS_GENERATE_BIN, model);
  for (const char* opt :
       {"--length_penalty nan", "--length_penalty inf", "--temperature nan", "--temperature inf",
        "--top_p nan", "--repetition_penalty nan", "--repetition_penalty -inf"}) {
    const auto [rc, out] = run_program(gen + opt);
    EXPECT_NE(rc, 0) << opt << ": " << out;
    const std::string name = std::string(opt).substr(0, std::string(opt).find(' '));
    EXPECT_NE(out.find(name), std::string::npos) << opt << ": " << out;
    EXPECT_NE(out.find("finite"), std::string::npos) << opt << ": " << out;
  }
  const std::string serve = fmt::format("'{}' --model '{}' --port 0 ", DS_SERVE_BIN, model);
  for (const char* opt : {"--header_timeout nan", "--body_timeout inf", "--sse_ping_seconds inf",
                          "--drain_timeout nan"}) {
    const auto [rc, out] = run_program(serve + opt);
    EXPECT_NE(rc, 0) << opt << ": " << out;
    const std::string name = std::string(opt).substr(0, std::string(opt).find(' '));
    EXPECT_NE(out.find(name + ": must be a finite number"), std::string::npos)
        << opt << ": " << out;
  }

  serve_test::TempDir dir("why");
  const auto& d = dir.path();
  std::filesystem::create_directories(d / "mt5");
  std::ofstream(d / "mt5" / "config.json") << R"({"model_type": "mt5"})";
  std::filesystem::create_directories(d / "lora" / "hf_model");
  std::ofstream(d / "lora" / "hf_model" / "adapter_config.json")
      << R"({"peft_type": "LORA", "base_model_name_or_path": "/models/bart-base"})";
  std::filesystem::create_directories(d / "run" / "global_step2");
  std::ofstream(d / "run" / "latest") << "global_step2\n";
  const struct {
    std::string folder, reason;
  } cases[] = {{"mt5", "model_type \"mt5\""},
               {"lora", "is a PEFT LoRA adapter"},
               {"run", "is a ds_train run folder"}};
  for (const auto& c : cases) {
    const std::string folder = (d / c.folder).string();
    for (const std::string& cmd :
         {fmt::format("'{}' --model '{}' --prompt hi --max_new_tokens 5", DS_GENERATE_BIN, folder),
          fmt::format("'{}' --model '{}' --prompt hi", DS_GENERATE_BIN, folder),
          fmt::format("'{}' --model '{}' --port 0", DS_SERVE_BIN, folder)}) {
      const auto [rc, out] = run_program(cmd);
      EXPECT_EQ(rc, 1) << cmd << ": " << out;
      EXPECT_NE(out.find(c.reason), std::string::npos) << cmd << ": " << out;
      EXPECT_EQ(out.find("applies to encoder-decoders"), std::string::npos) << cmd << ": " << out;
    }
  }
}

// --dtype bf16: ds_generate decodes the tiny LLaMA fixture (an fp32 checkpoint, rounded) with bf16
// weights and cache and says so; auto keeps a float32 checkpoint in fp32; another dtype is refused
// by the option's check. Encoder-decoders decode in bf16 too (DtypeBf16DecodesEncoderDecoders).
TEST(ServeProgram, DtypeBf16Decodes) {
  const std::string llama = (std::filesystem::path(DS_FIXTURE_DIR) / "generate/llama_gqa").string();
  const std::string gen =
      fmt::format("'{}' --model '{}' --prompt Hello --max_tokens 8 --temperature 0 --threads 1 ",
                  DS_GENERATE_BIN, llama);
  auto [rc, out] = run_program(gen + "--dtype bf16");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("parameters in bf16"), std::string::npos) << out;
  EXPECT_NE(out.find("decode 7 tokens"), std::string::npos) << out;
  std::tie(rc, out) = run_program(gen + "--dtype auto");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("parameters in fp32"), std::string::npos) << out;
  std::tie(rc, out) = run_program(gen + "--dtype fp16");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--dtype"), std::string::npos) << out;
}

// A tiny BART exported as bfloat16 with the tokenizers/gpt2_bpe fixture's tokenizer (vocabulary
// 700): ds_generate decodes it in bf16 with --dtype bf16 or auto (greedy and beam search), in fp32
// with --dtype fp32, and ds_serve --dtype auto loads it in bf16 and serves ds_generate --dtype
// bf16's greedy answer.
TEST(ServeProgram, DtypeBf16DecodesEncoderDecoders) {
  using namespace ds;
  serve_test::TempDir dir("s2s_bf16");
  const std::filesystem::path bart = dir.path() / "bart";
  {
    models::Seq2SeqConfig c = serve_test::tiny_bart_config(700, 64);
    c.eos_token_id = c.decoder_start_token_id = 0;  // gpt2_bpe's <|endoftext|>
    c.forced_eos_token_id = -1;
    c.seed = 11;
    models::Seq2Seq m(c);
    {  // logits far from ties (bf16 and fp32 pick the same tokens)
      autograd::NoGradGuard no_grad;
      for (auto& [name, p] : m.named_parameters())
        if (p.dim() == 2) ops::mul_(p, 8.0f);
    }
    models::export_hf_seq2seq(m, bart, DType::bf16);
    const auto tok = std::filesystem::path(DS_FIXTURE_DIR) / "tokenizers/gpt2_bpe";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(tok / f, bart / f);
    std::ofstream(bart / "generation_config.json") << R"({"max_length": 9})";
  }
  const std::string gen = fmt::format("'{}' --model '{}' --prompt 'hello there' --threads 1 ",
                                      DS_GENERATE_BIN, bart.string());
  std::string greedy16;
  for (const std::string& opts : {"--dtype bf16", "--dtype auto", "--dtype fp32",
                                  "--dtype bf16 --num_beams 3", "--dtype auto --num_beams 3"}) {
    const auto [rc, out] = run_program(gen + opts);
    EXPECT_EQ(rc, 0) << opts << ": " << out;
    const bool fp32 = opts == "--dtype fp32";
    EXPECT_NE(out.find(fp32 ? "parameters in fp32" : "parameters in bf16"), std::string::npos)
        << opts << ": " << out;
    EXPECT_NE(out.find(opts.find("beams") != std::string::npos ? "beam search (3 beams"
                                                               : "greedy (1 beams"),
              std::string::npos)
        << opts << ": " << out;
    if (opts == "--dtype bf16") {
      const auto [rc2, text] = run_program("{ " + gen + opts + " 2>/dev/null; }");
      ASSERT_EQ(rc2, 0);
      ASSERT_FALSE(text.empty());
      greedy16 = text.substr(0, text.size() - 1);  // ds_generate ends its output with a newline
      EXPECT_FALSE(greedy16.empty());
    }
  }
  ServeProcess p(bart, dir.path() / "serve.log", "120", {"--dtype", "auto"});
  ASSERT_GT(p.port(), 0) << p.log_text();
  EXPECT_NE(p.log_text().find("parameters in bf16"), std::string::npos) << p.log_text();
  httplib::Client http("127.0.0.1", p.port());
  http.set_read_timeout(60, 0);
  const json req = {{"prompt", "hello there"}, {"temperature", 0.0}};
  auto r = http.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string served = json::parse(r->body)["choices"][0]["text"];
  EXPECT_EQ(json::parse(json(greedy16).dump(-1, ' ', false, json::error_handler_t::replace)),
            served);
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait_exit(60), 0) << p.log_text();
}
