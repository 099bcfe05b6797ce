#include "ds/serve/api.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "ds/core/json_text.h"

namespace ds::serve {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(400, message, param);
}

// Typed access to a request object's fields; unknown keys are rejected at construction.
class Fields {
 public:
  Fields(const json& j, const std::vector<std::string>& allowed) : j_(j) {
    std::vector<std::string> unknown;
    for (const auto& [key, value] : j.items())
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) unknown.push_back(key);
    if (!unknown.empty()) {
      const auto near = nearest_name(unknown.front(), allowed);
      throw bad(
          unknown.front(),
          fmt::format("unknown field{} {}{}; accepted fields: {}", unknown.size() > 1 ? "s" : "",
                      fmt::format("'{}'", fmt::join(unknown, "', '")),
                      near ? fmt::format(" (did you mean '{}'?)", *near) : "",
                      fmt::join(allowed, ", ")));
    }
  }
  const json* get(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<double> number(const std::string& key, double lo, double hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number())
      throw bad(key, fmt::format("'{}' must be a number, got {}", key, json_kind(*v)));
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      throw bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x));
    return x;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (v->is_number_float()) {
      // A whole number past int64 (2^64, 1e30) is parsed as a double: out of range, not a
      // fraction.
      const double x = v->get<double>();
      if (x == std::floor(x) && (x < static_cast<double>(lo) || x > static_cast<double>(hi)))
        throw bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v->dump()));
      throw bad(key, fmt::format("'{}' must be an integer, got {}", key,
                                 x == std::floor(x) ? v->dump() : "a fraction"));
    }
    if (!v->is_number_integer())
      throw bad(key, fmt::format("'{}' must be an integer, got {}", key, json_kind(*v)));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      throw bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v->dump()));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
      throw bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x));
    return x;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      throw bad(key, fmt::format("'{}' must be true or false, got {}", key, json_kind(*v)));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string())
      throw bad(key, fmt::format("'{}' must be a string, got {}", key, json_kind(*v)));
    return v->get<std::string>();
  }
  // An OpenAI field we do not implement: accepted only when absent, null or `off`.
  void off_only(const std::string& key, const std::function<bool(const json&)>& is_off,
                const std::string& accepted) const {
    const json* v = get(key);
    if (v && !is_off(*v))
      throw bad(key,
                fmt::format("'{}' is not supported by this server; accepted: {}", key, accepted));
  }

 private:
  const json& j_;
};

const std::vector<std::string> kSamplingFields = {
    "max_tokens",       "temperature",       "top_p", "top_k", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed",  "stop"};

RequestSampling parse_sampling(const Fields& f) {
  RequestSampling s;
  constexpr int64_t kMaxTok = int64_t{1} << 30;
  if (auto v = f.number("temperature", 0.0, 100.0)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v == 0.0) throw bad("top_p", "'top_p' must be in (0, 1], got 0");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", 0, kMaxTok)) s.top_k = *v;
  if (auto v = f.number("repetition_penalty", 0.0, 100.0)) {
    if (*v == 0.0) throw bad("repetition_penalty", "'repetition_penalty' must be > 0 (1 = off)");
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0))
    s.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max()))
    s.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("max_tokens", 0, kMaxTok)) s.max_tokens = *v;
  if (const json* v = f.get("stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 4) throw bad("stop", "'stop' takes at most 4 strings");
      for (const auto& e : *v) {
        if (!e.is_string())
          throw bad("stop", fmt::format("'stop' entries must be strings, got {}", json_kind(e)));
        s.stop.push_back(e.get<std::string>());
      }
    } else {
      throw bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}",
                                    json_kind(*v)));
    }
    for (const auto& st : s.stop)
      if (st.empty()) throw bad("stop", "'stop' strings must not be empty");
  }
  return s;
}

void parse_stream(const Fields& f, bool& stream, bool& include_usage) {
  stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object())
      throw bad("stream_options", "'stream_options' must be an object {\"include_usage\": bool}");
    Fields sf(*so, {"include_usage"});
    include_usage = sf.boolean("include_usage").value_or(false);
  }
}

void reject_unsupported(const Fields& f) {
  f.off_only(
      "n", [](const json& v) { return v == 1; }, "1");
  f.off_only(
      "best_of", [](const json& v) { return v == 1; }, "1");
  f.off_only(
      "logprobs", [](const json& v) { return v == false || v == 0; }, "null or false");
  f.off_only(
      "top_logprobs", [](const json& v) { return v == 0; }, "null or 0");
  f.off_only(
      "logit_bias", [](const json& v) { return v.is_object() && v.empty(); }, "null or {}");
  f.off_only(
      "suffix", [](const json& v) { return v == ""; }, "null");
  f.off_only(
      "tools", [](const json& v) { return v.is_array() && v.empty(); }, "null or []");
  f.off_only(
      "tool_choice", [](const json& v) { return v == "none"; }, "null or \"none\"");
  f.off_only(
      "response_format",
      [](const json& v) { return v.is_object() && v.size() == 1 && v.value("type", "") == "text"; },
      "null or {\"type\": \"text\"}");
  if (auto u = f.get("user"); u && !u->is_string()) throw bad("user", "'user' must be a string");
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kOpenAIExtra = {
    "model",    "stream",       "stream_options", "n",   "best_of",
    "logprobs", "top_logprobs", "logit_bias",     "user"};

}  // namespace

json openai_error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json guide_error_body(const ApiError& e) {
  return {{"status", e.status},
          {"error", e.what()},
          {"param", e.param.empty() ? json(nullptr) : json(e.param)}};
}

namespace {

// Where a parse error happened, as a field path ("temperature", "messages[0].content"): a SAX pass
// that tracks the path, run only after a parse failed (a number too large for a double is a
// parse error in nlohmann/json, and its message names no field).
class PathSax {
 public:
  std::string path;  // at the error; empty at the top level

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) {
    stack_.push_back({false, "", 0});
    return true;
  }
  bool key(std::string& k) {
    stack_.back().key = k;
    return true;
  }
  bool end_object() { return end(); }
  bool start_array(std::size_t) {
    stack_.push_back({true, "", 0});
    return true;
  }
  bool end_array() { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    for (const Frame& f : stack_) {
      if (f.array)
        path += fmt::format("[{}]", f.index);
      else
        path += (path.empty() ? "" : ".") + f.key;
    }
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    size_t index;
  };
  bool value() {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return true;
  }
  bool end() {
    stack_.pop_back();
    return value();
  }
  std::vector<Frame> stack_;
};

}  // namespace

json parse_json_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::out_of_range& e) {  // 406: a number that overflows a double (1e309)
    PathSax where;
    json::sax_parse(body, &where);
    const std::string param = where.path.empty() ? "body" : where.path;
    throw ApiError(400,
                   fmt::format("'{}' holds a number too large to represent (it overflows a "
                               "double): {}",
                               param, e.what()),
                   param);
  } catch (const json::exception& e) {
    // Where it failed, when inside a field: NaN, Infinity and -Infinity are no JSON numbers
    // (Python's json.dumps writes them), and the field they were meant for is named.
    PathSax where;
    json::sax_parse(body, &where);
    const std::string param = where.path.empty() ? "body" : where.path;
    const bool non_finite =
        body.find("NaN") != std::string::npos || body.find("Infinity") != std::string::npos;
    throw ApiError(
        400,
        fmt::format("the request body is not valid JSON{}: {}{}",
                    where.path.empty() ? "" : fmt::format(" at '{}'", where.path), e.what(),
                    non_finite && !where.path.empty()
                        ? fmt::format(" ('{}' must be a finite number: NaN and "
                                      "Infinity are not JSON)",
                                      where.path)
                        : ""),
        param);
  }
  if (!j.is_object())
    throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", json_kind(j)),
                   "body");
  return j;
}

SamplingParams RequestSampling::resolve(const GenerationDefaults& d,
                                        int64_t default_max_tokens) const {
  SamplingParams p;
  p.max_tokens = default_max_tokens;
  p = d.apply(p);
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (top_k) p.top_k = *top_k;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  if (presence_penalty) p.presence_penalty = *presence_penalty;
  if (frequency_penalty) p.frequency_penalty = *frequency_penalty;
  if (seed) p.seed = *seed;
  if (max_tokens) p.max_tokens = *max_tokens;
  p.stop = stop;
  return p;
}

CompletionRequest parse_completion_request(const json& j) {
  Fields f(j, with(with(kSamplingFields, kOpenAIExtra), {"prompt", "echo", "suffix"}));
  reject_unsupported(f);
  CompletionRequest r;
  r.model = f.string("model").value_or("");
  const json* p = f.get("prompt");
  if (!p) throw bad("prompt", "'prompt' is required (a string, or an array of token ids)");
  auto ids_of = [](const json& a) {
    std::vector<int32_t> ids;
    for (const auto& e : a) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() > std::numeric_limits<int32_t>::max())
        throw bad("prompt", "'prompt' as an array must hold token ids (non-negative integers)");
      ids.push_back(e.get<int32_t>());
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
    r.prompt_ids = ids_of((*p)[0]);
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    r.prompt_ids = ids_of(*p);
  } else if (p->is_array() && p->size() > 1) {
    throw bad("prompt", "'prompt' with several prompts is not supported; send one per request");
  } else {
    throw bad("prompt", fmt::format("'prompt' must be a string or an array of token ids, got {}",
                                    json_kind(*p)));
  }
  if (r.prompt.empty() && r.prompt_ids.empty()) throw bad("prompt", "'prompt' is empty");
  r.echo = f.boolean("echo").value_or(false);
  parse_stream(f, r.stream, r.include_usage);
  r.sampling = parse_sampling(f);
  return r;
}

ChatRequest parse_chat_request(const json& j) {
  Fields f(j, with(with(kSamplingFields, kOpenAIExtra),
                   {"messages", "max_completion_tokens", "tools", "tool_choice", "response_format",
                    "parallel_tool_calls"}));
  reject_unsupported(f);
  ChatRequest r;
  r.model = f.string("model").value_or("");
  const json* m = f.get("messages");
  if (!m || !m->is_array() || m->empty())
    throw bad("messages", "'messages' is required: a non-empty array of {\"role\", \"content\"}");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!e.is_object()) throw bad(where, fmt::format("'{}' must be an object", where));
    Fields mf(e, {"role", "content", "name"});
    auto role = mf.string("role");
    if (!role ||
        (*role != "system" && *role != "user" && *role != "assistant" && *role != "developer"))
      throw bad(where + ".role",
                fmt::format("'{}.role' must be \"system\", \"developer\", \"user\" or "
                            "\"assistant\"",
                            where));
    ChatMessage msg{*role == "developer" ? "system" : *role, ""};
    const json* c = mf.get("content");
    if (c && c->is_string()) {
      msg.content = c->get<std::string>();
    } else if (c && c->is_array()) {  // [{"type": "text", "text": ...}, ...]
      for (const auto& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw bad(where + ".content",
                    fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": ...}} "
                                "(text only)",
                                where));
        msg.content += part["text"].get<std::string>();
      }
    } else {
      throw bad(where + ".content",
                fmt::format("'{}.content' must be a string or an array of text parts", where));
    }
    r.messages.push_back(std::move(msg));
  }
  parse_stream(f, r.stream, r.include_usage);
  r.sampling = parse_sampling(f);
  if (auto v = f.integer("max_completion_tokens", 0, int64_t{1} << 30)) {
    if (r.sampling.max_tokens && *r.sampling.max_tokens != *v)
      throw bad("max_completion_tokens",
                "'max_tokens' and 'max_completion_tokens' disagree; give one of them");
    r.sampling.max_tokens = *v;
  }
  if (auto v = f.get("parallel_tool_calls"); v && !v->is_boolean())
    throw bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
  return r;
}

GuideRequest parse_guide_request(const json& j) {
  Fields f(j, {"prompt", "history", "max_length", "top_p", "temperature"});
  GuideRequest r;
  auto prompt = f.string("prompt");
  if (!prompt) throw bad("prompt", "'prompt' is required: a string");
  r.prompt = *prompt;
  if (const json* h = f.get("history")) {
    if (!h->is_array()) throw bad("history", "'history' must be an array of [query, answer] pairs");
    for (size_t i = 0; i < h->size(); ++i) {
      const json& e = (*h)[i];
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
        throw bad(fmt::format("history[{}]", i),
                  fmt::format("'history[{}]' must be a [query, answer] pair of strings", i));
      r.history.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  // api.py: `max_length if max_length else 2048` (so 0 means the default too).
  if (auto v = f.integer("max_length", 0, int64_t{1} << 30); v && *v > 0) r.max_length = *v;
  if (auto v = f.number("top_p", 0.0, 1.0); v && *v > 0.0) r.top_p = static_cast<float>(*v);
  if (auto v = f.number("temperature", 0.0, 100.0)) {
    if (*v > 0.0) r.temperature = static_cast<float>(*v);  // api.py: 0 falls back to 0.95
  }
  return r;
}

std::string render_chatglm(const std::vector<std::pair<std::string, std::string>>& history,
                           const std::string& prompt) {
  if (history.empty()) return prompt;
  std::string s;
  for (size_t i = 0; i < history.size(); ++i)
    s += fmt::format("[Round {}]\n问：{}\n答：{}\n", i, history[i].first, history[i].second);
  return s + fmt::format("[Round {}]\n问：{}\n答：", history.size(), prompt);
}

std::string render_blenderbot(const std::vector<ChatMessage>& messages) {
  std::string s;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") s += ' ';
    s += messages[i].content;
    if (i + 1 < messages.size()) s += "  ";
  }
  return s;
}

std::string local_time_string() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace ds::serve
