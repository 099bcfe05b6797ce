#pragma once
// Request parsing and reply building for ds_serve's HTTP APIs, without any HTTP: the server
// (tools/serve) is a thin layer over these, and tests call them directly too.
//
//   POST /                     the ChatGLM-6B guide's api.py: {prompt, history, max_length?,
//                              top_p?, temperature?} -> {response, history, status, time}
//   POST /v1/completions       OpenAI text completions
//   POST /v1/chat/completions  OpenAI chat completions (messages rendered in the model's chat
//                              format, ds/data/chat_template.h; ChatML when it has none we know)
//
// Every rejected request is an ApiError: HTTP status, a message that names the field and says what
// is accepted, the field (`param`), OpenAI's error type and code. Unknown fields are errors (a typo
// must not silently change sampling); OpenAI fields we do not implement are accepted only with the
// value that means "off" (n 1, logprobs null/false, logit_bias null/{} ...).
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/serve/sampling.h"

namespace ds::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {},
           std::string type = "invalid_request_error", std::string code = {})
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type, code;
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::json openai_error_body(const ApiError& e);
// The guide route's error body: {"status": 400, "error": message, "param": field}.
nlohmann::json guide_error_body(const ApiError& e);

// body -> JSON object; ApiError 400 (param "body") when it is not valid JSON or not an object.
nlohmann::json parse_json_body(const std::string& body);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// Sampling fields every route shares, before defaults are applied: set = given in the request.
struct RequestSampling {
  std::optional<float> temperature, top_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int64_t> top_k, max_tokens;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  // request > generation_config.json > built-in; max_tokens: request > generation_config's
  // max_new_tokens > default_max_tokens.
  SamplingParams resolve(const GenerationDefaults& d, int64_t default_max_tokens) const;
};

struct CompletionRequest {
  std::string model;
  std::string prompt;               // text, or empty when prompt_ids is used
  std::vector<int32_t> prompt_ids;  // a prompt given as token ids
  bool echo = false;
  bool stream = false, include_usage = false;
  RequestSampling sampling;
};
CompletionRequest parse_completion_request(const nlohmann::json& j);

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  bool stream = false, include_usage = false;
  RequestSampling sampling;
};
ChatRequest parse_chat_request(const nlohmann::json& j);

struct GuideRequest {
  std::string prompt;
  std::vector<std::pair<std::string, std::string>> history;  // [query, answer] rounds
  int64_t max_length = 2048;                                 // prompt + answer tokens
  float top_p = 0.7f, temperature = 0.95f;                   // api.py's defaults
};
GuideRequest parse_guide_request(const nlohmann::json& j);

// ChatML's turn end: a stop string for chat answers in the chatml/qwen2 formats.
inline constexpr const char* kChatStop = "<|im_end|>";
// ChatGLM-6B's prompt: the query alone without history, else "[Round i]\n问：q\n答：a\n" per round
// and "[Round n]\n问：{prompt}\n答：".
std::string render_chatglm(const std::vector<std::pair<std::string, std::string>>& history,
                           const std::string& prompt);

// An encoder-decoder's conversation as its source text when its tokenizer has no chat template:
// transformers 4.x's BlenderbotTokenizer default template without its final eos_token (the
// source's encoding adds the tokenizer's end token): the turns' contents joined by two spaces,
// each user turn prefixed by a space.
std::string render_blenderbot(const std::vector<ChatMessage>& messages);

// Local time as "%Y-%m-%d %H:%M:%S" (the guide's "time").
std::string local_time_string();

}  // namespace ds::serve
