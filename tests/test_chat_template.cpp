// Chat templates (chat_template.h) against transformers' apply_chat_template on the same
// conversations (tests/fixtures/tokenizers/cases.json, tests/fixtures/generators/gen_hf_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/chat_template.h"
#include "ds/data/text_tokenizer.h"

namespace fs = std::filesystem;
using namespace ds::data;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "tokenizers";

const json& chat_cases() {
  static const json j = [] {
    std::ifstream in(kFixtures / "cases.json");
    EXPECT_TRUE(in.good()) << "missing " << kFixtures / "cases.json";
    return json::parse(in)["chat"];
  }();
  return j;
}

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) out.push_back({m["role"], m["content"]});
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ChatTemplate, MatchesApplyChatTemplate) {
  for (const auto& [name, fmt] : chat_cases().items()) {
    const ChatTemplate t = ChatTemplate::from_jinja(fmt["jinja"].get<std::string>());
    EXPECT_EQ(t.name(), name);
    EXPECT_EQ(ChatTemplate::by_name(name).format(), t.format());
    auto tok = load_tokenizer(kFixtures / fmt["tokenizer"].get<std::string>());
    for (const json& c : fmt["cases"]) {
      const auto msgs = messages_of(c["messages"]);
      const bool gen = c["add_generation_prompt"];
      const RenderedChat r = t.render(msgs, gen, ChatSpecialTokens::of(*tok));
      EXPECT_EQ(r.text, c["text"].get<std::string>()) << name;
      const ChatTokens ct = t.encode(*tok, msgs, gen);
      EXPECT_EQ(ct.ids, c["ids"].get<std::vector<int32_t>>()) << name << ": " << r.text;
    }
  }
}

TEST(ChatTemplate, RecognisesTokenizerConfigTemplates) {
  EXPECT_EQ(
      ChatTemplate::from_jinja(load_tokenizer(kFixtures / "llama3_bpe")->config().chat_template)
          .name(),
      "llama3");
  EXPECT_EQ(
      ChatTemplate::from_jinja(load_tokenizer(kFixtures / "qwen2_bpe")->config().chat_template)
          .name(),
      "qwen2");
  // Layout does not matter: whitespace, trim markers, quote style.
  std::string chatml(ChatTemplate::by_name("chatml").jinja());
  std::string relaid;
  for (char c : chatml) {
    relaid += c == '\'' ? '"' : c;
    if (c == '}') relaid += "\n  ";
  }
  for (size_t p = 0; (p = relaid.find("{%", p)) != std::string::npos; p += 3)
    relaid.insert(p + 2, "-");
  EXPECT_EQ(ChatTemplate::from_jinja(relaid).name(), "chatml");
  // Anything else is an error naming the supported formats.
  const std::string msg =
      error_of([] { ChatTemplate::from_jinja("{{ messages[0]['content'] }}"); });
  EXPECT_NE(msg.find("chatglm, alpaca, chatml, qwen2, llama3"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { ChatTemplate::by_name("vicuna"); }).find("chatml"), std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::from_jinja(""); }).find("no chat_template"),
            std::string::npos);
}

TEST(ChatTemplate, AssistantSpansAndTokenMasks) {
  auto tok = load_tokenizer(kFixtures / "llama3_bpe");
  const ChatTemplate t = ChatTemplate::by_name("llama3");
  const std::vector<ChatMessage> conv = {{"system", "Be brief."},
                                         {"user", "Hi"},
                                         {"assistant", " Hello there! "},
                                         {"user", "2+2?"},
                                         {"assistant", "4"}};
  const RenderedChat r = t.render(conv, false, ChatSpecialTokens::of(*tok));
  ASSERT_EQ(r.assistant.size(), 2u);
  auto span_text = [&](const ChatSpan& s) { return r.text.substr(s.begin, s.end - s.begin); };
  EXPECT_EQ(span_text(r.assistant[0]), "Hello there!<|eot_id|>");  // trimmed, as the template does
  EXPECT_EQ(span_text(r.assistant[1]), "4<|eot_id|>");
  const ChatTokens ct = t.encode(*tok, conv, false);
  ASSERT_EQ(ct.assistant_mask.size(), ct.ids.size());
  std::vector<int32_t> masked;
  for (size_t i = 0; i < ct.ids.size(); ++i)
    if (ct.assistant_mask[i]) masked.push_back(ct.ids[i]);
  EXPECT_EQ(tok->decode(masked), "Hello there!<|eot_id|>4<|eot_id|>");
  EXPECT_EQ(ct.ids.front(), tok->config().bos_id);  // exactly one BOS: the template's
  EXPECT_NE(ct.ids[1], tok->config().bos_id);

  // ChatGLM: the final answer ends with EOS; earlier answers are followed by "\n".
  auto gpt2 = load_tokenizer(kFixtures / "gpt2_bpe");
  const RenderedChat g = ChatTemplate::by_name("chatglm").render(
      {{{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}}}, false,
      ChatSpecialTokens::of(*gpt2));
  EXPECT_EQ(g.text, "[Round 0]\n问：Q1\n答：A1\n[Round 1]\n问：Q2\n答：A2<|endoftext|>");
  ASSERT_EQ(g.assistant.size(), 2u);
  EXPECT_EQ(g.text.substr(g.assistant[1].begin), "A2<|endoftext|>");
}

// GLM-4's roles. The expected texts are what transformers' Jinja (jinja2) renders from
// ChatTemplate::by_name("glm4").jinja() for the same conversation.
TEST(ChatTemplate, Glm4RolesAndPrefix) {
  const ChatTemplate t = ChatTemplate::by_name("glm4");
  EXPECT_EQ(ChatTemplate::from_jinja(t.jinja()).format(), ChatFormat::kGlm4);
  const std::vector<ChatMessage> conv = {{"system", "Be brief"},
                                         {"user", "Hello"},
                                         {"assistant", "Hi there"},
                                         {"user", "Bye"},
                                         {"assistant", "Goodbye"}};
  const ChatSpecialTokens special{"", "<|endoftext|>"};
  const RenderedChat r = t.render(conv, false, special);
  EXPECT_EQ(r.text,
            "[gMASK]<sop><|system|>\nBe brief<|user|>\nHello<|assistant|>\nHi there<|user|>\nBye"
            "<|assistant|>\nGoodbye<|endoftext|>");
  ASSERT_EQ(r.assistant.size(), 2u);
  auto span_text = [&](const ChatSpan& s) { return r.text.substr(s.begin, s.end - s.begin); };
  EXPECT_EQ(span_text(r.assistant[0]), "Hi there");
  EXPECT_EQ(span_text(r.assistant[1]), "Goodbye<|endoftext|>");
  const std::vector<ChatMessage> prompt(conv.begin(), conv.begin() + 4);
  EXPECT_EQ(t.render(prompt, true, special).text,
            "[gMASK]<sop><|system|>\nBe brief<|user|>\nHello<|assistant|>\nHi there<|user|>\nBye"
            "<|assistant|>\n");
  EXPECT_NE(error_of([&] { t.render({{{"tool", "x"}}}, true); }).find("glm4: role"),
            std::string::npos);
}

TEST(ChatTemplate, RoleErrors) {
  const std::vector<ChatMessage> with_system = {{"system", "s"}, {"user", "q"}};
  EXPECT_NE(error_of([&] {
              ChatTemplate::by_name("chatglm").render(with_system, true);
            }).find("role 'system'"),
            std::string::npos);
  const std::vector<ChatMessage> two_turns = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_NE(error_of([&] {
              ChatTemplate::by_name("alpaca").render(two_turns, true);
            }).find("single-turn"),
            std::string::npos);
  const std::vector<ChatMessage> out_of_order = {{"assistant", "a"}};
  EXPECT_NE(error_of([&] {
              ChatTemplate::by_name("chatglm").render(out_of_order, true);
            }).find("expected 'user'"),
            std::string::npos);
}
