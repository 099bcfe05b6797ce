#include "server.h"

#include "admission.h"
#include "chat_page.h"
#include "connection.h"
#include "http_server.h"
#include "metrics.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/text.h"
#include "ds/data/seq2seq_set.h"
#include "ds/models/family.h"
#include "ds/models/seq2seq_decoder.h"
#include "ds/serve/api.h"
#include "ds/serve/scheduler.h"

namespace ds::serve {

using nlohmann::json;

struct Server::Impl {
  LoadedModel m;
  ServerOptions opt;
  HttpServer http;      // connections: a thread each, deadlines and limits (http_server.h)
  Admission admission;  // up to max_batch generating + max_queue waiting
  std::atomic<bool> draining{false};    // drain(): new generation requests answer 503
  std::atomic<bool> cancel_all{false};  // drain() ran out of time: stop every generation
  Metrics metrics;
  std::atomic<uint64_t> next_id{0};
  // Response ids differ across restarts too: the counter starts from a random point.
  const uint64_t id_base = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::time_t created = std::time(nullptr);
  // The room a request has: the context (decoder-only), or the source and target limits.
  const ContextBudget limits;
  // Owns the model from here on; last, so that it stops (cancelling what runs) before the rest.
  Scheduler scheduler;

  Impl(LoadedModel model, ServerOptions o)
      : m(std::move(model)),
        opt(std::move(o)),
        http(http_options(opt), [this](const ReadResult& r) { return refused(r); }),
        admission(opt.max_batch, opt.max_queue),
        limits(ContextBudget::of(*m.make_decoder())),
        scheduler(m.make_decoder(), *m.tokenizer, scheduler_options()) {}

  SchedulerOptions scheduler_options() {
    SchedulerOptions so;
    so.max_batch = opt.max_batch;
    so.on_step = [this](int batch) { metrics.record_decode_step(batch); };
    return so;
  }

  static HttpServer::Options http_options(const ServerOptions& o) {
    HttpServer::Options h;
    h.keep_threads = o.http_threads;
    h.max_connections = o.max_connections;
    h.read.max_body_bytes = o.max_body_bytes;
    h.read.header_seconds = o.header_timeout_seconds;
    h.read.body_seconds = o.body_timeout_seconds;
    h.read.idle_seconds = o.keep_alive_seconds;
    return h;
  }

  // A request refused before routing (http_server.h): counted, logged, and its JSON error body.
  std::string refused(const ReadResult& r) {
    const std::string route = r.path.empty() ? "other" : route_label(r.path);
    metrics.count_request(route, r.status);
    if (opt.log_requests)
      std::fprintf(stderr, "ds_serve: %s %s -> %d (%s)\n",
                   r.method.empty() ? "-" : r.method.c_str(), r.path.empty() ? "-" : r.path.c_str(),
                   r.status, r.message.c_str());
    const ApiError e(r.status, r.message, r.param,
                     r.status == 503 ? "server_busy" : "invalid_request_error");
    const json body = r.path == "/" ? guide_error_body(e) : openai_error_body(e);
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  // Decoder-only: the prompt and the answer's positions; encoder-decoders: the target's.
  int64_t context() const { return limits.context; }
  // "cmpl-<16 hex>": distinct within a run (splitmix64's finalizer is a bijection) and, from a
  // random base, across restarts.
  std::string new_id(const char* prefix) {
    uint64_t z = id_base + next_id.fetch_add(1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return fmt::format("{}-{:016x}", prefix, z ^ (z >> 31));
  }

  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  // An admitted generation request: its place (held until the reply or the stream ends; a
  // streaming reply keeps the Job in its content provider) and when it was admitted, the clock of
  // its latency and time-to-first-token metrics. It also knows its client's connection: a client
  // that goes away (while waiting, in the prefill or decoding, streaming or not) cancels the job at
  // its next check, which frees its slot and its place in the queue.
  struct Job {
    Admission::Slot slot;
    ClientConnection conn;
    Clock::time_point admitted = Clock::now();
    double first_token_seconds = -1.0;  // admission to the first new token; < 0: none yet
  };
  std::shared_ptr<Job> admit(const httplib::Request& req) {
    if (draining)
      throw ApiError(503, "the server is shutting down; retry on another replica or later", "",
                     "unavailable_error", "shutting_down");
    auto job = std::make_shared<Job>();
    job->slot = admission.admit();
    job->conn = ClientConnection::of(req);
    return job;
  }

  // Runs a generation on the scheduler and waits for its end. With on_text (streams), the text
  // comes back to this thread, which writes it: the scheduler's thread never waits on a socket.
  // ping (streams): called every --sse_ping_seconds until the first text; false means the client
  // is gone. A client that goes away (a failed write, or its socket, polled by the scheduler every
  // step) cancels the generation at its next token.
  GenerationResult run(Job& job, std::vector<int32_t> ids, SamplingParams p,
                       const TextCallback& on_text = {}, bool chat = false,
                       const std::function<bool()>& ping = {}) {
    struct Pipe {  // text from the scheduler's thread to this one
      std::mutex mu;
      std::condition_variable cv;
      std::string text;
      bool finished = false;
      std::atomic<bool> gone{false};  // this side stopped reading
    };
    auto pipe = std::make_shared<Pipe>();
    GenerationRequest req;
    req.prompt = std::move(ids);
    req.params = std::move(p);
    req.eos_ids = chat ? m.chat_eos_ids : m.eos_ids;
    if (m.seq2seq) {  // generation_config.json's processors, as Seq2Seq::generate_greedy's
      const auto proc = models::Seq2SeqProcessors::of(m.seq2seq_options, m.seq2seq->config(),
                                                      req.params.max_tokens);
      req.processor = [proc](std::span<const int32_t> source, std::span<const int32_t> target,
                             std::span<float> logits) { proc.apply(source, target, logits); };
    }
    req.cancelled = [this, &job, pipe] { return cancel_all || pipe->gone || job.conn.closed(); };
    if (on_text)
      req.on_text = [pipe](std::string_view piece) {
        std::lock_guard<std::mutex> lk(pipe->mu);
        pipe->text += piece;
        pipe->cv.notify_all();
        return !pipe->gone;
      };
    req.on_finish = [pipe] {
      std::lock_guard<std::mutex> lk(pipe->mu);
      pipe->finished = true;
      pipe->cv.notify_all();
    };
    const Clock::time_point submitted = Clock::now();
    std::future<GenerationResult> done = scheduler.submit(std::move(req));
    if (on_text) {
      const auto ping_every = std::chrono::duration<double>(opt.sse_ping_seconds);
      bool any_text = false;
      std::unique_lock<std::mutex> lk(pipe->mu);
      while (!pipe->gone) {
        const auto ready = [&] { return pipe->finished || !pipe->text.empty(); };
        if (ping && !any_text && opt.sse_ping_seconds > 0) {
          if (!pipe->cv.wait_for(lk, ping_every, ready)) {
            lk.unlock();
            if (!ping()) pipe->gone = true;
            lk.lock();
            continue;
          }
        } else {
          pipe->cv.wait(lk, ready);
        }
        if (!pipe->text.empty()) {
          const std::string piece = std::move(pipe->text);
          pipe->text.clear();
          any_text = true;
          lk.unlock();
          if (!on_text(piece)) pipe->gone = true;
          lk.lock();
        } else if (pipe->finished) {
          break;
        }
      }
    }
    GenerationResult r = done.get();  // a client that left: cancelled within a step
    if (pipe->gone) r.finish_reason = "cancelled";
    if (r.first_token_seconds >= 0.0)
      job.first_token_seconds =
          seconds(job.admitted, submitted) + r.queue_seconds + r.first_token_seconds;
    return r;
  }

  // A non-streaming generation that was cancelled: by a drain that ran out of time (the client
  // is still there: 503, as for a new request while draining), or because its client went away
  // (499, nginx's "client closed request", in the log and the metrics; nobody reads it).
  void throw_if_cancelled(const GenerationResult& r) const {
    if (r.finish_reason != "cancelled") return;
    if (cancel_all)
      throw ApiError(503,
                     "the server is shutting down and cancelled this generation (it ran past "
                     "--drain_timeout); retry on another replica or later",
                     "", "unavailable_error", "shutting_down");
    throw ApiError(499, "the client closed the connection; generation cancelled", "", "cancelled");
  }

  // Metrics of a generation whose reply (or stream) is complete.
  void finished(const Job& job, const GenerationResult& r) {
    metrics.record_generation(r.prompt_tokens, r.completion_tokens,
                              seconds(job.admitted, Clock::now()), job.first_token_seconds,
                              r.finish_reason == "cancelled");
  }

  ServeGauges gauges() const {
    ServeGauges g;
    g.in_flight = admission.admitted();
    g.running = scheduler.running();
    g.waiting = std::max(0, g.in_flight - g.running);
    g.max_queue = admission.max_queue();
    g.max_batch = scheduler.max_batch();
    g.connections_open = http.open();
    g.connections_queued = http.queued();
    g.max_connections = http.max_connections();
    return g;
  }

  // A prompt text's ids: decoder-only, as the tokenizer encodes it; an encoder-decoder's source
  // as ds_generate encodes it (the tokenizer's template: BART's <s> x </s>), never cut (a source
  // over the model's positions is a 400).
  std::vector<int32_t> prompt_ids(const std::string& text) {
    const data::TextTokenizer* hf = m.tokenizer->hf();
    if (!m.seq2seq || !hf) return m.tokenizer->encode(text);
    return data::encode_seq2seq_text(*hf, text, size_t{1} << 30).ids;
  }

  // The prompt of a conversation in the model's chat format (ChatML when it has none we know;
  // an encoder-decoder without one: render_blenderbot).
  std::vector<int32_t> chat_ids(const std::vector<ChatMessage>& messages) {
    std::vector<data::ChatMessage> conv;
    for (const auto& msg : messages) conv.push_back({msg.role, msg.content});
    if (m.seq2seq) {  // the conversation is the source text
      if (!m.chat_template) return prompt_ids(render_blenderbot(messages));
      try {
        return prompt_ids(m.chat_template->render(conv, true).text);
      } catch (const ds::Error& e) {
        throw ApiError(400, e.what(), "messages");
      }
    }
    try {
      if (const data::TextTokenizer* hf = m.tokenizer->hf())
        return m.chat_template->encode(*hf, conv, /*add_generation_prompt=*/true).ids;
      return m.tokenizer->encode(m.chat_template->render(conv, true).text);
    } catch (const ds::Error& e) {  // a role or order the format cannot express
      throw ApiError(400, e.what(), "messages");
    }
  }

  // Checks the token budget and returns the max_tokens to use. `param` names the prompt field.
  int64_t budget(int64_t n_prompt, std::optional<int64_t> requested, int64_t fallback,
                 const std::string& param) {
    if (n_prompt == 0) throw ApiError(400, "the prompt encodes to no tokens", param);
    if (limits.encoder_decoder()) {  // the source and the target have their own positions
      if (n_prompt > limits.prompt_limit)
        throw ApiError(400,
                       fmt::format("the source is {} tokens; this encoder-decoder's longest source "
                                   "is {} tokens",
                                   n_prompt, limits.prompt_limit),
                       param, "invalid_request_error", "context_length_exceeded");
      const int64_t room = context() - 1;  // the decoder start token takes a position
      if (requested && *requested > room)
        throw ApiError(400,
                       fmt::format("max_tokens ({}) + the decoder start token exceed this "
                                   "encoder-decoder's longest target of {} positions; lower "
                                   "max_tokens to at most {}",
                                   *requested, context(), room),
                       "max_tokens", "invalid_request_error", "context_length_exceeded");
      return requested ? *requested : std::min(fallback, room);
    }
    if (n_prompt >= context())
      throw ApiError(400,
                     fmt::format("the prompt is {} tokens; this model's context length is {} "
                                 "tokens (room for the prompt and at least one new token)",
                                 n_prompt, context()),
                     param, "invalid_request_error", "context_length_exceeded");
    const int64_t room = context() - n_prompt;
    if (requested) {
      if (n_prompt + *requested > context())
        throw ApiError(400,
                       fmt::format("the prompt ({} tokens) + max_tokens ({}) exceed this model's "
                                   "context length of {} tokens; lower max_tokens to at most {}",
                                   n_prompt, *requested, context(), room),
                       "max_tokens", "invalid_request_error", "context_length_exceeded");
      return *requested;
    }
    return std::min(fallback, room);
  }

  // max_tokens when neither the request nor generation_config.json's max_new_tokens sets it:
  // decoder_only's, or an encoder-decoder's generation setting (max_length - 1).
  int64_t default_max_tokens(int64_t decoder_only) const {
    return m.seq2seq ? m.seq2seq_options.max_new_tokens : decoder_only;
  }

  uint64_t seed_or_random(const RequestSampling& s) {
    if (s.seed) return *s.seed;
    static thread_local std::mt19937_64 gen{std::random_device{}()};
    return gen();
  }

  static void reply_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  static json usage(const GenerationResult& r) {
    return {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  }

  static std::string sse(const json& j) {
    return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  // ---- routes ----

  void guide(const httplib::Request& req, httplib::Response& res) {
    const GuideRequest g = parse_guide_request(parse_json_body(req.body));
    std::vector<int32_t> ids;
    SamplingParams p;
    if (m.seq2seq) {  // the history and the prompt are the source; max_length bounds the target
      std::vector<ChatMessage> conv;
      for (const auto& [q, a] : g.history) {
        conv.push_back({"user", q});
        conv.push_back({"assistant", a});
      }
      conv.push_back({"user", g.prompt});
      ids = chat_ids(conv);
      if (g.max_length < 2)
        throw ApiError(400,
                       "max_length counts the decoder start token here (an encoder-decoder): it "
                       "must be at least 2",
                       "max_length");
      p.max_tokens =
          budget(static_cast<int64_t>(ids.size()), std::nullopt, g.max_length - 1, "prompt");
    } else {
      ids = m.tokenizer->encode(render_chatglm(g.history, g.prompt));
    }
    const int64_t max_len = std::min(g.max_length, context());
    const int64_t n = static_cast<int64_t>(ids.size());
    if (!m.seq2seq && n >= max_len)
      throw ApiError(400,
                     fmt::format("the prompt with its history is {} tokens, which reaches "
                                 "max_length {} (this model's context length is {})",
                                 n, max_len, context()),
                     n >= context() ? "prompt" : "max_length");
    if (!m.seq2seq) p.max_tokens = max_len - n;
    p.temperature = g.temperature;
    p.top_p = g.top_p;
    p.seed = 0;  // the guide's API has no seed: the same request gets the same answer
    const auto job = admit(req);
    const GenerationResult r = run(*job, ids, p);
    finished(*job, r);
    throw_if_cancelled(r);
    json history = json::array();
    for (const auto& [q, a] : g.history) history.push_back({q, a});
    history.push_back({g.prompt, r.text});
    reply_json(res, 200,
               {{"response", r.text},
                {"history", history},
                {"status", 200},
                {"time", local_time_string()}});
  }

  // One event's JSON for a streaming route: text (nullopt in the closing and usage chunks) and
  // finish_reason (null until the closing chunk).
  using ChunkFn = std::function<json(const std::optional<std::string>& text, json finish)>;

  // Streams a generation as OpenAI's server-sent events: `first` (when not null) before
  // generating, a chunk per piece of final text, a closing chunk with finish_reason, a usage chunk
  // (`choices: []`) when include_usage, then [DONE]. An error during generation is sent as
  // data: {"error": ...} without [DONE]. While the request waits for its turn, an SSE comment
  // (": ping") every --sse_ping_seconds keeps clients and proxies from timing the stream out (as
  // llama.cpp's server does). A client that goes away (a failed write) cancels the generation. The
  // job (its slot) stays held, by the provider's copy, until the stream ends. To an HTTP/1.0 client
  // the body is delimited by the connection's close (request_reader.h closes it), not chunked.
  void stream(const httplib::Request& req, httplib::Response& res, std::shared_ptr<Job> job,
              std::vector<int32_t> ids, SamplingParams p, bool chat, ChunkFn chunk, json first,
              bool include_usage) {
    auto provider = [this, job, ids = std::move(ids), p = std::move(p), chat,
                     chunk = std::move(chunk), first = std::move(first),
                     include_usage](size_t, httplib::DataSink& sink) {
      auto send = [&](const std::string& s) {
        return sink.is_writable() && sink.write(s.data(), s.size());
      };
      if (!first.is_null()) send(sse(first));
      try {
        const GenerationResult r = run(
            *job, ids, p,
            [&](std::string_view piece) { return send(sse(chunk(std::string(piece), nullptr))); },
            chat, [&] { return send(": ping\n\n"); });
        finished(*job, r);
        if (r.finish_reason == "cancelled") return false;
        send(sse(chunk(std::nullopt, r.finish_reason)));
        if (include_usage) {
          json u = chunk(std::nullopt, nullptr);
          u["choices"] = json::array();
          u["usage"] = usage(r);
          send(sse(u));
        }
        send("data: [DONE]\n\n");
      } catch (const std::exception& e) {
        send(sse(openai_error_body(ApiError(500, e.what(), "", "server_error"))));
      }
      sink.done();
      return true;
    };
    if (req.version == "HTTP/1.0")
      res.set_content_provider("text/event-stream", std::move(provider));
    else
      res.set_chunked_content_provider("text/event-stream", std::move(provider));
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const CompletionRequest c = parse_completion_request(parse_json_body(req.body));
    std::vector<int32_t> ids = c.prompt_ids.empty() ? prompt_ids(c.prompt) : c.prompt_ids;
    for (int32_t id : ids)
      if (id >= m.vocab_size())
        throw ApiError(
            400, fmt::format("token id {} is outside the vocabulary [0, {})", id, m.vocab_size()),
            "prompt");
    const int64_t n = static_cast<int64_t>(ids.size());
    SamplingParams p = c.sampling.resolve(m.defaults, default_max_tokens(16));
    p.max_tokens =
        budget(n, c.sampling.max_tokens ? std::optional<int64_t>(p.max_tokens) : std::nullopt,
               p.max_tokens, "prompt");
    p.seed = seed_or_random(c.sampling);
    const std::string echo = c.echo ? m.tokenizer->decode(ids) : std::string();
    auto job = admit(req);  // held until the reply (or stream) ends
    const std::string id = new_id("cmpl");
    const std::time_t now = std::time(nullptr);
    ChunkFn chunk = [this, id, now](const std::optional<std::string>& text, json finish) {
      return json{{"id", id},
                  {"object", "text_completion"},
                  {"created", now},
                  {"model", m.id},
                  {"choices",
                   {{{"text", text.value_or("")},
                     {"index", 0},
                     {"logprobs", nullptr},
                     {"finish_reason", finish}}}}};
    };
    if (c.stream) {
      stream(req, res, std::move(job), std::move(ids), std::move(p), /*chat=*/false, chunk,
             echo.empty() ? json() : chunk(echo, nullptr), c.include_usage);
      return;
    }
    const GenerationResult r = run(*job, ids, p);
    finished(*job, r);
    throw_if_cancelled(r);
    json body = chunk(echo + r.text, r.finish_reason);
    body["usage"] = usage(r);
    reply_json(res, 200, body);
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    const ChatRequest c = parse_chat_request(parse_json_body(req.body));
    std::vector<int32_t> ids = chat_ids(c.messages);
    const int64_t n = static_cast<int64_t>(ids.size());
    SamplingParams p = c.sampling.resolve(m.defaults, default_max_tokens(context()));
    p.max_tokens =
        budget(n, c.sampling.max_tokens ? std::optional<int64_t>(p.max_tokens) : std::nullopt,
               p.max_tokens, "messages");
    p.seed = seed_or_random(c.sampling);
    const std::optional<data::ChatFormat> fmt_ =
        m.chat_template ? std::optional(m.chat_template->format()) : std::nullopt;
    if (fmt_ == data::ChatFormat::kChatML || fmt_ == data::ChatFormat::kQwen2)
      p.stop.push_back(kChatStop);  // as text too: tokenizers without the special token
    if (fmt_ == data::ChatFormat::kGlm4)
      p.stop.push_back("<|user|>");  // GLM-4 ends its turn by opening the user's
    auto job = admit(req);           // held until the reply (or stream) ends
    const std::string id = new_id("chatcmpl");
    const std::time_t now = std::time(nullptr);
    if (c.stream) {
      auto chunk_of = [this, id, now](json delta, json finish) {
        return json{{"id", id},
                    {"object", "chat.completion.chunk"},
                    {"created", now},
                    {"model", m.id},
                    {"choices",
                     {{{"index", 0},
                       {"delta", std::move(delta)},
                       {"logprobs", nullptr},
                       {"finish_reason", finish}}}}};
      };
      ChunkFn chunk = [chunk_of](const std::optional<std::string>& text, json finish) {
        return chunk_of(text ? json{{"content", *text}} : json::object(), std::move(finish));
      };
      stream(req, res, std::move(job), std::move(ids), std::move(p), /*chat=*/true, chunk,
             chunk_of({{"role", "assistant"}, {"content", ""}}, nullptr), c.include_usage);
      return;
    }
    const GenerationResult r = run(*job, ids, p, {}, /*chat=*/true);
    finished(*job, r);
    throw_if_cancelled(r);
    reply_json(res, 200,
               {{"id", id},
                {"object", "chat.completion"},
                {"created", now},
                {"model", m.id},
                {"choices",
                 {{{"index", 0},
                   {"message", {{"role", "assistant"}, {"content", r.text}}},
                   {"logprobs", nullptr},
                   {"finish_reason", r.finish_reason}}}},
                {"usage", usage(r)}});
  }

  json model_object() const {
    return {{"id", m.id},
            {"object", "model"},
            {"created", created},
            {"owned_by", "deepspeed.cpp"},
            {"context_length", context()}};
  }

  void models(const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
  }

  // GET /v1/models/{id} (the openai client's models.retrieve).
  void model(const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
    if (id != m.id)
      throw ApiError(404,
                     fmt::format("the model {} does not exist; this server serves '{}'",
                                 ds::quoted_excerpt(id, 100), m.id),
                     "model", "invalid_request_error", "model_not_found");
    reply_json(res, 200, model_object());
  }

  // A JSON route's body must say it is JSON: a cross-site HTML form or a no-cors fetch can POST
  // text/plain, x-www-form-urlencoded or multipart bodies (or none) without the browser asking
  // first, but not application/json.
  static void require_json(const httplib::Request& req) {
    const std::string type = req.get_header_value("Content-Type");
    const std::string_view media = std::string_view(type).substr(0, type.find(';'));
    size_t a = 0, b = media.size();
    while (a < b && (media[a] == ' ' || media[a] == '\t')) ++a;
    while (b > a && (media[b - 1] == ' ' || media[b - 1] == '\t')) --b;
    if (!ds::iequals(media.substr(a, b - a), "application/json"))
      throw ApiError(
          415,
          fmt::format("the request body must be JSON with the header Content-Type: "
                      "application/json (got {}); with curl: -H 'Content-Type: "
                      "application/json'",
                      type.empty() ? std::string("none") : ds::quoted_excerpt(type, 100)),
          "Content-Type");
  }

  // Runs a handler; ApiError becomes its status with the route's error body. json_body: the
  // route takes a JSON body (415 for any other Content-Type).
  httplib::Server::Handler wrap(void (Impl::*fn)(const httplib::Request&, httplib::Response&),
                                bool openai, bool json_body = false) {
    return [this, fn, openai, json_body](const httplib::Request& req, httplib::Response& res) {
      try {
        if (json_body) require_json(req);
        (this->*fn)(req, res);
      } catch (const ApiError& e) {
        if (e.status == 503) res.set_header("Retry-After", "1");
        reply_json(res, e.status, openai ? openai_error_body(e) : guide_error_body(e));
      } catch (const std::exception& e) {
        const ApiError err(500, e.what(), "", "server_error");
        reply_json(res, 500, openai ? openai_error_body(err) : guide_error_body(err));
      }
    };
  }

  // The route label of /metrics: the path when it is a route, else "other" (any path a client
  // sends would otherwise become a label value).
  static std::string route_label(const std::string& path) {
    static const char* const kRoutes[] = {"/",          "/v1/completions", "/v1/chat/completions",
                                          "/v1/models", "/health",         "/v1/health",
                                          "/metrics"};
    for (const char* r : kRoutes)
      if (path == r) return r;
    if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
    return "other";
  }

  void setup() {
    http.Post("/", wrap(&Impl::guide, false, /*json_body=*/true));
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      const std::string_view page = chat_page_html();
      res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });
    http.Post("/v1/completions", wrap(&Impl::completions, true, /*json_body=*/true));
    http.Post("/v1/chat/completions", wrap(&Impl::chat, true, /*json_body=*/true));
    http.Get("/v1/models", wrap(&Impl::models, true));
    http.Get(R"(/v1/models/(.+))", wrap(&Impl::model, true));
    auto health = [this](const httplib::Request&, httplib::Response& res) {
      if (draining)
        reply_json(res, 503, {{"status", "draining"}});
      else
        reply_json(res, 200, {{"status", "ok"}});
    };
    http.Get("/health", health);
    http.Get("/v1/health", health);
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(gauges()), "text/plain; version=0.0.4; charset=utf-8");
    });
    // Statuses httplib sets itself (404 unknown route, 413 body too large, 400 bad request line)
    // get a JSON body too.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string msg;
      if (res.status == 404)
        msg = fmt::format(
            "no route {} {}; routes: GET / (chat page), POST /, POST /v1/completions, POST "
            "/v1/chat/completions, GET /v1/models, GET /v1/models/{{id}}, GET /health, GET "
            "/metrics",
            req.method, req.path);
      else if (res.status == 413)
        msg = fmt::format("the request body is larger than the limit of {} bytes",
                          opt.max_body_bytes);
      else
        msg = fmt::format("HTTP {}", res.status);
      const ApiError e(res.status, msg, res.status == 413 ? "body" : "",
                       res.status == 404 ? "not_found_error" : "invalid_request_error");
      reply_json(res, res.status, openai_error_body(e));
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            msg = e.what();
          } catch (...) {
          }
          reply_json(res, 500, openai_error_body(ApiError(500, msg, "", "server_error")));
        });
    // httplib calls the logger once per reply, after its last byte (a stream's too).
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.count_request(route_label(req.path), res.status);
      if (opt.log_requests)
        std::fprintf(stderr, "ds_serve: %s %s -> %d\n", req.method.c_str(), req.path.c_str(),
                     res.status);
    });
  }
};

Server::Server(LoadedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {
  impl_->setup();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const auto& o = impl_->opt;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    DS_CHECK(port > 0, "[ds_serve] cannot bind any port on {}", o.host);
  } else {
    DS_CHECK(impl_->http.bind_to_port(o.host, o.port),
             "[ds_serve] cannot bind {}:{} (in use? give another --port)", o.host, o.port);
  }
  DS_CHECK(impl_->http.set_backlog(o.listen_backlog),
           "[ds_serve] cannot set the listen backlog of {}:{} to {}", o.host, port,
           o.listen_backlog);
  return port;
}

void Server::run() {
  impl_->http.listen_after_bind();
}

void Server::drain(double timeout_seconds, const std::function<bool()>& force) {
  Impl& s = *impl_;
  s.draining = true;
  const auto deadline =
      Impl::Clock::now() + std::chrono::duration_cast<Impl::Clock::duration>(
                               std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
  while (s.admission.admitted() > 0) {
    if (!s.cancel_all && (Impl::Clock::now() >= deadline || (force && force()))) {
      std::fprintf(stderr, "ds_serve: cancelling %d request(s) still in flight\n",
                   s.admission.admitted());
      s.cancel_all = true;  // each stops at its next token and frees its slot
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop();
}

bool Server::draining() const {
  return impl_->draining;
}

void Server::stop() {
  if (impl_ && impl_->http.is_running()) impl_->http.stop();
}

}  // namespace ds::serve
