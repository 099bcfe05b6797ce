#include "ds/data/chat_template.h"

#include <array>

#include "ds/core/error.h"
#include "ds/core/text.h"
#include "ds/data/unicode.h"

namespace ds::data {

namespace {

// Published sources (Meta-Llama-3-8B-Instruct, Qwen2-7B-Instruct, the transformers docs' ChatML),
// and our own for the two formats that have none (checked against apply_chat_template by
// tests/fixtures/generators/gen_hf_tokenizer_fixtures.py).
constexpr std::string_view kChatMLJinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";
constexpr std::string_view kQwen2Jinja =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr std::string_view kLlama3Jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
constexpr std::string_view kChatGLMJinja =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[Round ' ~ (loop.index0 // "
    "2) ~ ']\\n问：' ~ message['content'] ~ '\\n答：' }}{% elif message['role'] == 'assistant' "
    "%}{{ "
    "message['content'] }}{% if loop.last %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% else "
    "%}{{ raise_exception('chatglm: roles must be user/assistant') }}{% endif %}{% endfor %}";
constexpr std::string_view kGlm4Jinja =
    "[gMASK]<sop>{% for message in messages %}{% if message['role'] not in ['system', 'user', "
    "'assistant'] %}{{ raise_exception('glm4: roles must be system/user/assistant') }}{% endif "
    "%}{{ '<|' + message['role'] + '|>\\n' + message['content'] }}{% if message['role'] == "
    "'assistant' and loop.last %}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|assistant|>\\n' }}{% endif %}";
constexpr std::string_view kAlpacaJinja =
    "{% set ns = namespace(system=none, instruction='', input=none, output=none) %}{% for m in "
    "messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% elif m['role'] "
    "== 'user' %}{% set ns.instruction = m['content'] %}{% elif m['role'] == 'input' %}{% set "
    "ns.input = m['content'] %}{% elif m['role'] == 'assistant' %}{% set ns.output = m['content'] "
    "%}{% endif %}{% endfor %}{% if ns.system is none %}{% if ns.input is none %}{% set ns.system "
    "= "
    "'Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.' %}{% else %}{% set ns.system = 'Below is an instruction that describes a task, "
    "paired with an input that provides further context. Write a response that appropriately "
    "completes the request.' %}{% endif %}{% endif %}{{ ns.system ~ '\\n\\n### Instruction:\\n' ~ "
    "ns.instruction }}{% if ns.input is not none %}{{ '\\n\\n### Input:\\n' ~ ns.input }}{% endif "
    "%}{{ '\\n\\n### Response:' }}{% if ns.output is not none %}{{ ns.output ~ eos_token }}{% "
    "endif %}";

constexpr std::string_view kAlpacaPreamble =
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.";
constexpr std::string_view kAlpacaPreambleInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.";

struct Known {
  ChatFormat format;
  std::string_view name;
  std::string_view jinja;
};
constexpr std::array<Known, 6> kKnown = {{
    {ChatFormat::kChatGLM, "chatglm", kChatGLMJinja},
    {ChatFormat::kAlpaca, "alpaca", kAlpacaJinja},
    {ChatFormat::kChatML, "chatml", kChatMLJinja},
    {ChatFormat::kQwen2, "qwen2", kQwen2Jinja},
    {ChatFormat::kLlama3, "llama3", kLlama3Jinja},
    {ChatFormat::kGlm4, "glm4", kGlm4Jinja},
}};

const Known& known(ChatFormat f) {
  for (const Known& k : kKnown)
    if (k.format == f) return k;
  DS_THROW("[chat] unknown format {}", static_cast<int>(f));
}

// The source without whitespace outside string literals, without Jinja's '-' trim markers, with
// one kind of quote and with newlines/tabs inside literals written as escapes: equal for templates
// that differ only in layout (a literal newline and '\n' render the same).
std::string normalize_jinja(std::string_view s) {
  std::string out;
  char quote = 0;  // the open string literal's delimiter
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\' && i + 1 < s.size()) {
        out += c;
        out += s[++i];
      } else if (c == quote) {
        out += '\'';
        quote = 0;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else {
        out += c == '\'' ? std::string("\\'") : std::string(1, c);
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (c == '\'' || c == '"') {
      quote = c;
      out += '\'';
      continue;
    }
    if (c == '-' && !out.empty() && (out.back() == '%' || out.back() == '{') && out.size() >= 2 &&
        out[out.size() - 2] == '{')
      continue;  // "{%-" / "{{-"
    if (c == '-' && i + 1 < s.size() && (s[i + 1] == '%' || s[i + 1] == '}')) continue;  // "-%}"
    out.push_back(c);
  }
  return out;
}

// Jinja's trim (Python str.strip()): whitespace at both ends.
std::string_view trim(std::string_view s) {
  auto is_space = [](char32_t cp) {
    return classify(cp) == CharClass::kSpace || (cp >= 0x1C && cp <= 0x1F);
  };
  while (!s.empty()) {
    const Utf8Char c = utf8_decode(s, 0);
    if (!c.valid || !is_space(c.cp)) break;
    s.remove_prefix(c.len);
  }
  while (!s.empty()) {  // step back over one UTF-8 character
    size_t k = s.size() - 1;
    while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
    const Utf8Char c = utf8_decode(s, k);
    if (!c.valid || k + c.len != s.size() || !is_space(c.cp)) break;
    s.remove_suffix(c.len);
  }
  return s;
}

void check_role(const ChatMessage& m, std::string_view format,
                std::initializer_list<std::string_view> roles) {
  for (std::string_view r : roles)
    if (m.role == r) return;
  // The role comes from the user's data: quoted escaped and cut, whatever its bytes or size.
  DS_THROW("[chat] {}: role {} is not allowed (allowed: {})", format, quoted_excerpt(m.role),
           fmt::join(roles, ", "));
}

}  // namespace

ChatTemplate ChatTemplate::by_name(std::string_view name) {
  for (const Known& k : kKnown)
    if (k.name == name) return ChatTemplate(k.format);
  DS_THROW("[chat] unknown chat format '{}'; built-in formats: {}", name, fmt::join(names(), ", "));
}

ChatTemplate ChatTemplate::from_jinja(std::string_view source) {
  DS_CHECK(!source.empty(),
           "[chat] the tokenizer has no chat_template; choose a built-in format by name ({})",
           fmt::join(names(), ", "));
  const std::string norm = normalize_jinja(source);
  for (const Known& k : kKnown)
    if (normalize_jinja(k.jinja) == norm) return ChatTemplate(k.format);
  DS_THROW(
      "[chat] the chat_template (Jinja, {} bytes, starting '{}') is not one of the built-in "
      "formats ({}); there is no general Jinja interpreter: choose a format by name",
      source.size(), source.substr(0, 60), fmt::join(names(), ", "));
}

std::vector<std::string> ChatTemplate::names() {
  std::vector<std::string> out;
  for (const Known& k : kKnown) out.emplace_back(k.name);
  return out;
}

std::string_view ChatTemplate::name() const {
  return known(format_).name;
}
std::string_view ChatTemplate::jinja() const {
  return known(format_).jinja;
}

RenderedChat ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                  const ChatSpecialTokens& special) const {
  RenderedChat r;
  std::string& t = r.text;
  // Append an assistant answer followed by its end marker, recording the span.
  auto answer = [&](std::string_view content, std::string_view end_marker) {
    const size_t begin = t.size();
    t += content;
    t += end_marker;
    r.assistant.push_back({begin, t.size()});
  };
  switch (format_) {
    case ChatFormat::kChatML:
    case ChatFormat::kQwen2: {
      if (format_ == ChatFormat::kQwen2 && !messages.empty() && messages[0].role != "system")
        t += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
      for (const ChatMessage& m : messages) {
        t += "<|im_start|>" + m.role + "\n";
        if (m.role == "assistant") {
          answer(m.content, "<|im_end|>");
        } else {
          t += m.content + "<|im_end|>";
        }
        t += "\n";
      }
      if (add_generation_prompt) t += "<|im_start|>assistant\n";
      break;
    }
    case ChatFormat::kLlama3: {
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (i == 0) t += special.bos;
        t += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        if (m.role == "assistant") {
          answer(trim(m.content), "<|eot_id|>");
        } else {
          t += trim(m.content);
          t += "<|eot_id|>";
        }
      }
      if (add_generation_prompt) t += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFormat::kChatGLM: {
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        check_role(m, "chatglm", {"user", "assistant"});
        const char* expected = i % 2 == 0 ? "user" : "assistant";
        DS_CHECK(m.role == expected,
                 "[chat] chatglm: message {} has role {}, expected '{}' (turns alternate user, "
                 "assistant)",
                 i, quoted_excerpt(m.role), expected);
        if (m.role == "user") {
          t += fmt::format("[Round {}]\n问：{}\n答：", i / 2, m.content);
        } else if (i + 1 == messages.size()) {
          answer(m.content, special.eos);
        } else {
          answer(m.content, "");
          t += "\n";
        }
      }
      break;
    }
    case ChatFormat::kGlm4: {
      t += "[gMASK]<sop>";
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        check_role(m, "glm4", {"system", "user", "assistant"});
        t += "<|" + m.role + "|>\n";
        if (m.role == "assistant") {
          answer(m.content, i + 1 == messages.size() ? std::string_view(special.eos) : "");
        } else {
          t += m.content;
        }
      }
      if (add_generation_prompt) t += "<|assistant|>\n";
      break;
    }
    case ChatFormat::kAlpaca: {
      const ChatMessage *system = nullptr, *user = nullptr, *input = nullptr, *output = nullptr;
      for (const ChatMessage& m : messages) {
        check_role(m, "alpaca", {"system", "user", "input", "assistant"});
        const ChatMessage** slot = m.role == "system"  ? &system
                                   : m.role == "user"  ? &user
                                   : m.role == "input" ? &input
                                                       : &output;
        DS_CHECK(*slot == nullptr,
                 "[chat] alpaca is single-turn: at most one '{}' message (use chatml or llama3 for "
                 "conversations)",
                 m.role);
        *slot = &m;
      }
      t += system ? std::string_view(system->content)
                  : (input ? kAlpacaPreambleInput : kAlpacaPreamble);
      t += "\n\n### Instruction:\n";
      if (user) t += user->content;
      if (input) t += "\n\n### Input:\n" + input->content;
      t += "\n\n### Response:";
      if (output) answer(output->content, special.eos);
      break;
    }
  }
  return r;
}

ChatTokens ChatTemplate::encode(const TextTokenizer& tok, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, bool add_special_tokens) const {
  std::vector<ChatMessage> normalized(messages.begin(), messages.end());
  for (ChatMessage& m : normalized) m.content = tok.normalize(m.content);
  const RenderedChat r = render(normalized, add_generation_prompt, ChatSpecialTokens::of(tok));
  ChatTokens out;
  std::vector<TokenSpan> spans;
  tok.encode(r.text, add_special_tokens, out.ids, &spans);
  out.assistant_mask.resize(out.ids.size(), 0);
  // Spans and tokens are both in text order: one sweep.
  size_t a = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const TokenSpan s = spans[i];
    while (a < r.assistant.size() && r.assistant[a].end <= s.begin) ++a;
    if (a < r.assistant.size() && s.end > s.begin && s.begin < r.assistant[a].end &&
        s.end > r.assistant[a].begin)
      out.assistant_mask[i] = 1;
  }
  return out;
}

}  // namespace ds::data
