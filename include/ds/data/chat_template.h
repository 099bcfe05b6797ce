#pragma once
// Built-in chat formats: render a conversation to the text a model is trained on / prompted with,
// and say which bytes (and tokens) are the assistant's, for SFT loss masking.
//
//   auto tmpl = ds::data::ChatTemplate::from_jinja(tok->config().chat_template);  // or
//   by_name("chatml") std::vector<ds::data::ChatMessage> conv = {{"user", "Hi"}, {"assistant",
//   "Hello!"}}; ds::data::RenderedChat r = tmpl.render(conv, /*add_generation_prompt=*/false,
//                                          ds::data::ChatSpecialTokens::of(*tok));
//   ds::data::ChatTokens t = tmpl.encode(*tok, conv, false);   // ids + assistant mask
//
// Formats (names for by_name):
//   chatglm  ChatGLM-6B's prompt/history format: "[Round i]\n问：{q}\n答：{a}\n" per earlier round,
//            then "[Round n]\n问：{q}\n答：" (+ "{a}{eos}" when the last message is the answer);
//            roles alternate user/assistant, no system.
//   alpaca   Stanford Alpaca's prompt ("Below is an instruction ... ### Response:") +
//   "{output}{eos}";
//            single turn: an optional "system" (replaces the preamble), "user" (the instruction),
//            an optional "input" (Alpaca's input field), an optional "assistant" (the output).
//   chatml   "<|im_start|>{role}\n{content}<|im_end|>\n" per message.
//   qwen2    chatml, plus the default system prompt "You are a helpful assistant." when the first
//            message is not a system message (Qwen2-Instruct's template).
//   glm4     GLM-4's roles: "[gMASK]<sop>", then "<|{role}|>\n{content}" per message (system, user,
//            assistant), the final answer followed by the eos token; the generation prompt is
//            "<|assistant|>\n". [gMASK], <sop> and the role markers are the GLM-4 tokenizer's added
//            tokens (tokenizer.json).
//   llama3   "{bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>" per
//            message (Meta-Llama-3-Instruct's template; BOS is in the text: encode without adding
//            another one).
// add_generation_prompt appends the opening of an assistant turn (chatglm and alpaca prompts always
// end with it when the last message is the user's).
//
// Hugging Face folders carry a Jinja template (tokenizer_config.json "chat_template" or
// chat_template.jinja). from_jinja recognises the published sources of the formats above (compared
// after removing whitespace and Jinja's '-' trim markers and unifying quotes) and throws a
// ds::Error naming the supported formats otherwise: there is no Jinja interpreter here. jinja()
// returns a source for each format, so an exported folder renders the same in transformers.
//
// Thread safety: a ChatTemplate is an immutable value.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/data/text_tokenizer.h"

namespace ds::data {

enum class ChatFormat { kChatGLM, kAlpaca, kChatML, kQwen2, kLlama3, kGlm4 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (alpaca also "input")
  std::string content;
};

// Byte range [begin, end) of RenderedChat::text.
struct ChatSpan {
  size_t begin = 0, end = 0;
};

struct RenderedChat {
  std::string text;
  // One span per assistant message, in order: its content as rendered (trimmed for llama3) plus
  // the turn's end marker (<|im_end|>, <|eot_id|>, or the eos token for chatglm/alpaca's final
  // answer): what SFT trains the model to produce. ChatGLM's own recipe trains only the last one
  // (spans.back()); earlier answers are part of its prompt.
  std::vector<ChatSpan> assistant;
};

// Tokens of a rendered conversation; assistant_mask[i] is 1 when token i overlaps an assistant
// span.
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant_mask;
};

// The special-token strings templates insert (Jinja's bos_token / eos_token).
struct ChatSpecialTokens {
  std::string bos, eos;
  static ChatSpecialTokens of(const TextTokenizer& tok) {
    return {tok.config().bos_token, tok.config().eos_token};
  }
};

class ChatTemplate {
 public:
  // "chatglm", "alpaca", "chatml", "qwen2", "llama3" or "glm4"; anything else throws, naming them.
  static ChatTemplate by_name(std::string_view name);
  // The format whose published Jinja source this is (see above); throws naming the formats.
  static ChatTemplate from_jinja(std::string_view source);
  static std::vector<std::string> names();

  ChatFormat format() const { return format_; }
  std::string_view name() const;
  // A Jinja source that renders this format in transformers' apply_chat_template.
  std::string_view jinja() const;

  // Throws ds::Error on a role the format does not allow or an order it cannot express.
  RenderedChat render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                      const ChatSpecialTokens& special = {}) const;

  // render (with tok's bos/eos strings and contents passed through tok.normalize), then encode
  // the text; add_special_tokens as in TextTokenizer::encode (llama3 already has its BOS).
  ChatTokens encode(const TextTokenizer& tok, std::span<const ChatMessage> messages,
                    bool add_generation_prompt, bool add_special_tokens = false) const;

 private:
  explicit ChatTemplate(ChatFormat f) : format_(f) {}
  ChatFormat format_;
};

}  // namespace ds::data
