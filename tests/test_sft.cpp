// Supervised fine-tuning data (sft.h): JSONL records of the three formats -> loss-masked,
// padded examples; the truncation rule; mask shards served by TokenDataset / DataLoader as -100
// targets; malformed records named by file:line and field; ds_prepare --sft and ds_train end to
// end on a tiny model, with a sequence-length mismatch refused. Tokenizer: the Qwen2-style
// fixture (tests/fixtures/tokenizers/qwen2_bpe: pad <|endoftext|> = 0, eos <|im_end|> = 2, the
// qwen2 chat template).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/chat_template.h"
#include "ds/data/dataset.h"
#include "ds/data/loader.h"
#include "ds/data/sft.h"
#include "ds/data/shard.h"
#include "ds/data/text_tokenizer.h"

namespace fs = std::filesystem;
using namespace ds::data;
using json = nlohmann::json;

namespace {

const fs::path kQwen = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "qwen2_bpe";

const TextTokenizer& qwen() {
  static const auto tok = load_tokenizer(kQwen);
  return *tok;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

// The decoded text of each maximal run of mask-1 tokens.
std::vector<std::string> trained_runs(const SftExample& e) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < e.ids.size();) {
    if (!e.mask[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < e.ids.size() && e.mask[j]) ++j;
    runs.push_back(qwen().decode(std::span<const int32_t>(e.ids.data() + i, j - i)));
    i = j;
  }
  return runs;
}

class Sft : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_sft_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!std::getenv("DS_KEEP_TEST_DIR")) fs::remove_all(dir_);
  }
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  fs::path dir_;
};

const char* kChatGLM =
    R"({"prompt": "How are you", "response": "Fine thanks", "history": [["Hello there", "Hi friend"]]})";
const char* kAlpaca =
    R"({"instruction": "Add the numbers", "input": "two and three", "output": "Five"})";
const char* kMessages =
    R"({"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye"}]})";

}  // namespace

// Each format is detected from its first record and turned into the conversation it stands for;
// the trained tokens are exactly the assistant answers plus the end-of-turn token after each.
TEST_F(Sft, MaskIsExactlyTheAssistantSpans) {
  const ChatTemplate tmpl = ChatTemplate::from_jinja(qwen().config().chat_template);
  ASSERT_EQ(tmpl.name(), "qwen2");
  const int32_t pad = sft_pad_id(qwen());
  EXPECT_EQ(pad, 0);  // <|endoftext|>, the fixture's pad token
  struct Case {
    const char* record;
    SftFormat format;
    std::vector<std::string> answers;
  };
  const Case cases[] = {
      {kChatGLM, SftFormat::kChatGLM, {"Hi friend<|im_end|>", "Fine thanks<|im_end|>"}},
      {kAlpaca, SftFormat::kAlpaca, {"Five<|im_end|>"}},
      {kMessages, SftFormat::kMessages, {"Hi there<|im_end|>", "Goodbye<|im_end|>"}},
  };
  for (const Case& c : cases) {
    const fs::path f = write("in.jsonl", std::string(c.record) + "\n");
    SftFormat detected = SftFormat::kAuto;
    const auto records = read_sft_file(f, SftFormat::kAuto, &detected);
    EXPECT_EQ(detected, c.format) << c.record;
    ASSERT_EQ(records.size(), 1u);
    const auto e = build_sft_example(qwen(), tmpl, records[0].messages, 128, pad);
    ASSERT_TRUE(e) << c.record;
    EXPECT_EQ(trained_runs(*e), c.answers) << c.record;
    // Padded to T + 1 with the pad id, never trained; the content is the template's rendering.
    ASSERT_EQ(e->ids.size(), 129u);
    ASSERT_EQ(e->mask.size(), 129u);
    EXPECT_FALSE(e->truncated);
    if (c.format != SftFormat::kAlpaca) {  // (alpaca's input is merged first, checked below)
      const ChatTokens full = tmpl.encode(qwen(), records[0].messages, false);
      ASSERT_EQ(e->length, full.ids.size());
      EXPECT_TRUE(std::equal(full.ids.begin(), full.ids.end(), e->ids.begin()));
    }
    for (size_t i = e->length; i < e->ids.size(); ++i) {
      EXPECT_EQ(e->ids[i], pad);
      EXPECT_EQ(e->mask[i], 0);
    }
  }
  // Alpaca's input joins the instruction after a blank line outside the alpaca template...
  const auto alpaca =
      read_sft_file(write("a.jsonl", std::string(kAlpaca) + "\n"), SftFormat::kAuto);
  const auto e = build_sft_example(qwen(), tmpl, alpaca[0].messages, 128, pad);
  const std::string text = qwen().decode(std::span<const int32_t>(e->ids.data(), e->length));
  EXPECT_NE(text.find("<|im_start|>user\nAdd the numbers\n\ntwo and three<|im_end|>"),
            std::string::npos)
      << text;
  // ...and is Alpaca's "### Input:" in it: only the output and eos are trained.
  const auto ea =
      build_sft_example(qwen(), ChatTemplate::by_name("alpaca"), alpaca[0].messages, 128, pad);
  ASSERT_TRUE(ea);
  EXPECT_EQ(trained_runs(*ea), std::vector<std::string>{"Five<|im_end|>"});
  const std::string atext = qwen().decode(std::span<const int32_t>(ea->ids.data(), ea->length));
  EXPECT_NE(atext.find("### Input:\ntwo and three"), std::string::npos) << atext;
  // The chatml template on the ChatGLM record: both answers trained, no system prompt added.
  const auto glm = read_sft_file(write("g.jsonl", std::string(kChatGLM) + "\n"), SftFormat::kAuto);
  const auto eg =
      build_sft_example(qwen(), ChatTemplate::by_name("chatml"), glm[0].messages, 128, pad);
  ASSERT_TRUE(eg);
  EXPECT_EQ(trained_runs(*eg),
            (std::vector<std::string>{"Hi friend<|im_end|>", "Fine thanks<|im_end|>"}));
  EXPECT_EQ(qwen().decode(std::span<const int32_t>(eg->ids.data(), eg->length)),
            "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nHi "
            "friend<|im_end|>\n<|im_start|>user\nHow are you<|im_end|>\n<|im_start|>"
            "assistant\nFine thanks<|im_end|>\n");
}

TEST_F(Sft, TruncationRule) {
  const ChatTemplate tmpl = ChatTemplate::by_name("chatml");
  const size_t T = 24;
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "word ";
  SftDrop why = SftDrop::kNone;

  // 1. The answer starts inside the window: keep the first T + 1 tokens.
  const std::vector<ChatMessage> long_answer = {{"user", "Hi"}, {"assistant", long_text}};
  auto e = build_sft_example(qwen(), tmpl, long_answer, T, 0, &why);
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->truncated);
  EXPECT_EQ(e->rounds_dropped, 0);
  EXPECT_EQ(e->length, T + 1);
  EXPECT_EQ(e->ids.size(), T + 1);
  const ChatTokens full = tmpl.encode(qwen(), long_answer, false);
  EXPECT_TRUE(std::equal(e->ids.begin(), e->ids.end(), full.ids.begin()));
  EXPECT_TRUE(std::equal(e->mask.begin(), e->mask.end(), full.assistant_mask.begin()));
  EXPECT_EQ(e->mask.back(), 1);

  // 2. A long first round hides every answer: drop the earliest rounds (the system message stays).
  const std::vector<ChatMessage> long_history = {
      {"system", "S"},     {"user", long_text}, {"assistant", "A1"}, {"user", long_text},
      {"assistant", "A2"}, {"user", "Q3"},      {"assistant", "A3"}};
  e = build_sft_example(qwen(), tmpl, long_history, T, 0, &why);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rounds_dropped, 2);
  EXPECT_FALSE(e->truncated);
  EXPECT_EQ(trained_runs(*e), std::vector<std::string>{"A3<|im_end|>"});
  EXPECT_EQ(qwen().decode(std::span<const int32_t>(e->ids.data(), e->length)),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ3<|im_end|>\n<|im_start|>"
            "assistant\nA3<|im_end|>\n");

  // 3. A single round whose prompt alone fills the window is dropped.
  e = build_sft_example(
      qwen(), tmpl, std::vector<ChatMessage>{{"user", long_text}, {"assistant", "A"}}, T, 0, &why);
  EXPECT_FALSE(e);
  EXPECT_EQ(why, SftDrop::kTooLong);
  // No assistant message at all: nothing to train.
  e = build_sft_example(qwen(), tmpl, std::vector<ChatMessage>{{"user", "Q"}}, T, 0, &why);
  EXPECT_FALSE(e);
  EXPECT_EQ(why, SftDrop::kNoResponse);

  // prepare_sft counts each case.
  json a = {{"messages", json::array()}};
  for (const auto& m : long_history)
    a["messages"].push_back({{"role", m.role}, {"content", m.content}});
  const std::string records =
      json({{"messages",
             {{{"role", "user"}, {"content", "Hi"}},
              {{"role", "assistant"}, {"content", long_text}}}}})
          .dump() +
      "\n" + a.dump() + "\n" +
      json({{"messages",
             {{{"role", "user"}, {"content", long_text}},
              {{"role", "assistant"}, {"content", "A"}}}}})
          .dump() +
      "\n" + json({{"messages", {{{"role", "user"}, {"content", "Q"}}}}}).dump() + "\n" +
      json({{"messages",
             {{{"role", "user"}, {"content", "Q"}}, {{"role", "assistant"}, {"content", "A"}}}}})
          .dump() +
      "\n";
  SftOptions o;
  o.inputs = {write("t.jsonl", records)};
  o.tokenizer_dir = kQwen;
  o.template_name = "chatml";
  o.seq_len = T;
  o.val_fraction = 0.0;
  o.output_dir = dir_ / "out";
  const SftReport r = prepare_sft(o);
  EXPECT_EQ(r.records, 5u);
  EXPECT_EQ(r.train.examples, 3u);
  EXPECT_EQ(r.truncated, 1u);
  EXPECT_EQ(r.history_trimmed, 1u);
  EXPECT_EQ(r.dropped_too_long, 1u);
  EXPECT_EQ(r.dropped_no_response, 1u);
  const json meta = json::parse(read(r.meta));
  EXPECT_EQ(meta["sft"]["dropped_too_long"], 1);
  EXPECT_EQ(meta["sft"]["truncated"], 1);
}

// The set on disk: T in meta.json, examples of T + 1 tokens, mask shards; TokenDataset and
// DataLoader serve example i as sample i with -100 on every masked target.
TEST_F(Sft, DatasetServesMaskedExamples) {
  std::string records;
  for (int i = 0; i < 10; ++i)
    records +=
        json({{"instruction", "Say " + std::to_string(i)}, {"output", std::to_string(i) + " said"}})
            .dump() +
        "\n";
  SftOptions o;
  o.inputs = {write("alpaca.jsonl", records)};
  o.tokenizer_dir = kQwen;  // its chat_template: qwen2
  o.seq_len = 40;
  o.output_dir = dir_ / "out";
  const SftReport r = prepare_sft(o);
  EXPECT_EQ(r.template_name, "qwen2");
  EXPECT_EQ(r.train.examples, 9u);  // default val_fraction 0.1: the last record
  EXPECT_EQ(r.val.examples, 1u);
  EXPECT_EQ(r.train.tokens, 9u * 41);
  const json meta = json::parse(read(r.meta));
  EXPECT_EQ(meta["sft"]["seq_len"], 40);
  EXPECT_EQ(meta["sft"]["template"], "qwen2");
  EXPECT_EQ(meta["splits"]["train"]["mask_files"], json::array({"train.mask.bin"}));
  EXPECT_EQ(meta["sft"]["input_formats"].begin().value(), "alpaca");
  const Shard mask = Shard::open(dir_ / "out" / "train.mask.bin", /*verify_checksum=*/true);
  EXPECT_TRUE(mask.is_mask());
  EXPECT_EQ(mask.header().token_bytes, 1u);
  EXPECT_EQ(mask.num_tokens(), 9u * 41);

  auto ds = std::make_shared<TokenDataset>(TokenDataset::open_split(dir_ / "out", "train", true));
  ASSERT_TRUE(ds->is_sft());
  EXPECT_EQ(ds->sft_seq_len(), 40u);
  EXPECT_EQ(ds->num_samples(40), 9u);
  const std::string err = error_of([&] { ds->num_samples(32); });
  EXPECT_NE(err.find("--seq_len 40"), std::string::npos) << err;
  EXPECT_NE(err.find("is 32"), std::string::npos) << err;

  // Expected sample i from the builder: inputs ids[0, T), targets ids[1, T] or -100 where masked.
  const ChatTemplate tmpl = ChatTemplate::by_name("qwen2");
  const auto recs = read_sft_file(dir_ / "alpaca.jsonl", SftFormat::kAuto);
  uint64_t trained = 0;
  for (uint64_t i = 0; i < 9; ++i) {
    const auto e = build_sft_example(qwen(), tmpl, recs[i].messages, 40, 0);
    ASSERT_TRUE(e);
    const Sample s = ds->get(i, 40);
    for (size_t t = 0; t < 40; ++t) {
      EXPECT_EQ(s.inputs[t], e->ids[t]) << i << " " << t;
      EXPECT_EQ(s.targets[t], e->mask[t + 1] ? e->ids[t + 1] : -100) << i << " " << t;
      trained += s.targets[t] != -100;
    }
    // The trained targets spell the answer and the end of the turn.
    std::vector<int32_t> tt;
    for (int32_t y : s.targets)
      if (y != -100) tt.push_back(y);
    EXPECT_EQ(qwen().decode(tt), std::to_string(i) + " said<|im_end|>");
  }
  EXPECT_EQ(trained, r.train.trained_tokens);

  DataLoader loader(ds, 40,
                    {.micro_batch = 3, .grad_accum = 1, .world_size = 1, .rank = 0, .seed = 7});
  const Batch b = loader.next();
  size_t masked = 0;
  for (size_t k = 0; k < b.targets.size(); ++k) {
    if (b.targets[k] == -100)
      ++masked;
    else
      EXPECT_GE(b.targets[k], 0);
  }
  EXPECT_GT(masked, b.targets.size() / 2);  // prompts and padding
  EXPECT_LT(masked, b.targets.size());

  // A damaged mask shard is caught by its checksum like a token shard.
  {
    std::fstream f(dir_ / "out" / "train.mask.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kShardHeaderBytes + 5);
    f.put(1);
  }
  EXPECT_NE(
      error_of([&] { TokenDataset::open_split(dir_ / "out", "train", true); }).find("checksum"),
      std::string::npos);
}

// Plain token shards keep their meaning: no mask, windows of stride T.
TEST_F(Sft, PlainDatasetsUnchanged) {
  std::vector<int32_t> toks(101);
  for (int i = 0; i < 101; ++i) toks[i] = i % 50;
  write_shard(dir_ / "p.bin", toks, 50);
  const TokenDataset d({dir_ / "p.bin"});
  EXPECT_FALSE(d.is_sft());
  EXPECT_EQ(d.num_samples(10), 10u);
  const Sample s = d.get(3, 10);
  EXPECT_EQ(s.inputs[0], 30);
  EXPECT_EQ(s.targets[9], 40);
  EXPECT_EQ(Shard::open(dir_ / "p.bin").header().flags, 0u);
}

TEST_F(Sft, MalformedRecordsNameFileLineAndField) {
  const fs::path f = write(
      "bad.jsonl", std::string(kChatGLM) + "\n\n" + R"({"prompt": "q", "history": []})" + "\n");
  std::string err = error_of([&] { read_sft_file(f, SftFormat::kAuto); });
  EXPECT_NE(err.find("bad.jsonl:3"), std::string::npos) << err;
  EXPECT_NE(err.find("'response'"), std::string::npos) << err;

  err = error_of([&] {
    read_sft_file(
        write("m.jsonl",
              R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]})"),
        SftFormat::kAuto);
  });
  EXPECT_NE(err.find("m.jsonl:1"), std::string::npos) << err;
  EXPECT_NE(err.find("messages[1].content"), std::string::npos) << err;

  err = error_of([&] {
    read_sft_file(
        write("a.jsonl", std::string(kAlpaca) + "\n" + R"({"instruction": 3, "output": "x"})"),
        SftFormat::kAuto);
  });
  EXPECT_NE(err.find("a.jsonl:2"), std::string::npos) << err;
  EXPECT_NE(err.find("'instruction' must be a string"), std::string::npos) << err;

  err = error_of([&] { read_sft_file(write("j.jsonl", "{\"prompt\": \n"), SftFormat::kAuto); });
  EXPECT_NE(err.find("j.jsonl:1: not valid JSON"), std::string::npos) << err;

  err = error_of([&] { read_sft_file(write("u.jsonl", R"({"text": "x"})"), SftFormat::kAuto); });
  EXPECT_NE(err.find("cannot tell the record format"), std::string::npos) << err;

  // A given format is enforced on every record.
  err =
      error_of([&] { read_sft_file(write("g.jsonl", std::string(kAlpaca)), SftFormat::kChatGLM); });
  EXPECT_NE(err.find("g.jsonl:1: field 'prompt' is missing"), std::string::npos) << err;

  // A conversation the template cannot express names the record too.
  SftOptions o;
  o.inputs = {write("sys.jsonl", std::string(kMessages) + "\n")};
  o.tokenizer_dir = kQwen;
  o.template_name = "chatglm";
  o.seq_len = 64;
  o.output_dir = dir_ / "out";
  err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("sys.jsonl:1"), std::string::npos) << err;
  EXPECT_NE(err.find("role 'system'"), std::string::npos) << err;

  // A tokenizer folder without a chat template needs --template.
  o.tokenizer_dir = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "gpt2_bpe";
  o.template_name.clear();
  err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("gpt2_bpe"), std::string::npos) << err;
  EXPECT_NE(err.find("give --template chatglm|alpaca|chatml|qwen2|llama3"), std::string::npos)
      << err;
}

// A byte order mark (then an empty first line) is not part of the first record; a parse error
// quotes the line escaped and cut, never raw bytes or megabytes of it.
TEST_F(Sft, ByteOrderMarkAndBadBytesInMessages) {
  auto recs = read_sft_file(write("bom.jsonl", "\xef\xbb\xbf\n" + std::string(kAlpaca) + "\n"),
                            SftFormat::kAuto);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].line, 2u);
  recs = read_sft_file(write("bom2.jsonl", "\xef\xbb\xbf" + std::string(kAlpaca) + "\n"),
                       SftFormat::kAuto);
  ASSERT_EQ(recs.size(), 1u);
  // Invalid UTF-8 inside a string, and a 2 MB line that is not JSON.
  std::string err = error_of([&] {
    read_sft_file(write("bad.jsonl", "{\"prompt\": \"a\xff\xfe\", \"response\": \"b\"}\n"),
                  SftFormat::kAuto);
  });
  EXPECT_NE(err.find("bad.jsonl:1"), std::string::npos) << err;
  EXPECT_EQ(err.find('\xff'), std::string::npos) << "raw byte echoed";
  EXPECT_NE(err.find("\\xff"), std::string::npos) << err;
  err = error_of([&] {
    read_sft_file(write("huge.jsonl", "{\"prompt\": \"" + std::string(2 << 20, 'x') + "\n"),
                  SftFormat::kAuto);
  });
  EXPECT_LT(err.size(), 1000u);
  EXPECT_NE(err.find("bytes in all"), std::string::npos) << err.substr(0, 600);
}

// What a byte order mark or the wrong kind of file leads to is said plainly: a file of only a mark
// and blank lines has no records (named), a mark inside the file (files joined with cat) is named
// as such instead of an invisible parse error, UTF-16 and JSON array files say how to convert.
TEST_F(Sft, ByteOrderMarksAndWrongFileKindsAreNamed) {
  const std::string bom = "\xef\xbb\xbf";
  EXPECT_TRUE(read_sft_file(write("blank.jsonl", bom + "\n  \n\n"), SftFormat::kAuto).empty());
  SftOptions o;
  o.inputs = {dir_ / "blank.jsonl"};
  o.tokenizer_dir = kQwen;
  o.template_name = "chatml";
  o.seq_len = 32;
  o.output_dir = dir_ / "out";
  std::string err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("blank.jsonl: no records (every line is empty or blank)"), std::string::npos)
      << err;

  err = error_of([&] {
    read_sft_file(write("cat.jsonl", bom + kAlpaca + "\n" + bom + kAlpaca + "\n"),
                  SftFormat::kAuto);
  });
  EXPECT_NE(err.find("cat.jsonl:2: the line starts with a UTF-8 byte order mark"),
            std::string::npos)
      << err;

  std::string utf16 = "\xff\xfe";
  for (char c : std::string(kAlpaca)) utf16 += std::string{c, '\0'};
  err = error_of([&] { read_sft_file(write("w.jsonl", utf16 + "\n"), SftFormat::kAuto); });
  EXPECT_NE(err.find("w.jsonl:1: the file is UTF-16"), std::string::npos) << err.substr(0, 300);

  for (const std::string& array :
       {"[\n  " + std::string(kAlpaca) + "\n]\n", bom + "\n[" + std::string(kAlpaca) + "]\n"}) {
    err = error_of([&] { read_sft_file(write("a.json", array), SftFormat::kAuto); });
    EXPECT_NE(err.find("the file is a JSON array, not JSON Lines"), std::string::npos) << err;
    EXPECT_NE(err.find("jq -c '.[]'"), std::string::npos) << err;
  }
}

// Every piece of a record that a message echoes (keys, a history pair, a role) is quoted escaped
// and cut: a 1 MB key or role with a terminal escape in it must not reach the terminal whole.
TEST_F(Sft, EchoedFieldsAreQuotedAndCut) {
  const std::string big = "\x1b[31m" + std::string(1 << 20, 'k');
  std::string err = error_of([&] {
    read_sft_file(write("key.jsonl", json({{big, 1}}).dump() + "\n"), SftFormat::kAuto);
  });
  EXPECT_NE(err.find("cannot tell the record format"), std::string::npos) << err.substr(0, 600);
  EXPECT_LT(err.size(), 1000u);
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << "raw escape echoed";
  EXPECT_NE(err.find("\\x1b"), std::string::npos) << err.substr(0, 600);
  json many = json::object();
  for (int i = 0; i < 100000; ++i) many["k" + std::to_string(i)] = i;
  err = error_of([&] { read_sft_file(write("keys.jsonl", many.dump() + "\n"), SftFormat::kAuto); });
  EXPECT_LT(err.size(), 1000u);
  EXPECT_NE(err.find("100000 keys in all"), std::string::npos) << err.substr(0, 600);
  err = error_of([&] {
    read_sft_file(write("hist.jsonl", json({{"prompt", "q"},
                                            {"response", "a"},
                                            {"history", json::array({json::array({1, big})})}})
                                              .dump() +
                                          "\n"),
                  SftFormat::kAuto);
  });
  EXPECT_NE(err.find("history[0]"), std::string::npos) << err.substr(0, 600);
  EXPECT_LT(err.size(), 1000u);
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << "raw escape echoed";

  // A role the template does not have, echoed by the chat template.
  SftOptions o;
  o.inputs = {write("role.jsonl",
                    json({{"messages", json::array({{{"role", big}, {"content", "q"}},
                                                    {{"role", "assistant"}, {"content", "a"}}})}})
                            .dump() +
                        "\n")};
  o.tokenizer_dir = kQwen;
  o.template_name = "chatglm";
  o.seq_len = 64;
  o.output_dir = dir_ / "out";
  err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("role.jsonl:1"), std::string::npos) << err.substr(0, 600);
  EXPECT_NE(err.find("is not allowed"), std::string::npos) << err.substr(0, 600);
  EXPECT_LT(err.size(), 1000u);
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << "raw escape echoed";
}

// Answers that are all "": a warning with counts when some are, an error when all are (the model
// would only learn to end its turn).
TEST_F(Sft, EmptyAnswersWarnWithCountsOrFail) {
  const std::string empty = json({{"prompt", "Q"}, {"response", ""}}).dump() + "\n";
  const std::string full = json({{"prompt", "Q"}, {"response", "An answer"}}).dump() + "\n";
  SftOptions o;
  o.tokenizer_dir = kQwen;
  o.template_name = "chatml";
  o.seq_len = 32;
  o.val_fraction = 0.0;
  o.output_dir = dir_ / "out";
  o.inputs = {write("some.jsonl", empty + full + empty)};
  const SftReport r = prepare_sft(o);
  EXPECT_EQ(r.empty_responses, 2u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("2 of 3 examples have an empty answer"), std::string::npos)
      << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("3 records read"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("some.jsonl:1, "), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("some.jsonl:3"), std::string::npos) << r.warnings[0];
  // Nothing to train on: an error naming the file, the counts and where to look.
  o.inputs = {write("all.jsonl", empty + "\n" + empty)};
  o.output_dir = dir_ / "out2";
  std::string err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("[sft] " + (dir_ / "all.jsonl").string() + ": every one of the 2 examples"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("2 records read"), std::string::npos) << err;
  EXPECT_NE(err.find("all.jsonl:3"), std::string::npos) << err;
  // Every record without an answer, or too long: the error names the file too.
  o.inputs = {
      write("long.jsonl", json({{"prompt", std::string(400, 'q')}, {"response", "a"}}).dump())};
  o.output_dir = dir_ / "out3";
  err = error_of([&] { prepare_sft(o); });
  EXPECT_NE(err.find("long.jsonl: no training example was written (1 records read: 1 dropped as "
                     "too long"),
            std::string::npos)
      << err;
}

// ds_prepare --sft and ds_train on the result: a tiny model trains on the masked examples, and a
// sequence length other than the prepared one is refused naming both.
TEST_F(Sft, DsPrepareAndDsTrainEndToEnd) {
  std::string glm, msgs;
  for (int i = 0; i < 24; ++i) {
    glm += json({{"prompt", "Count " + std::to_string(i)},
                 {"response", std::to_string(i) + " " + std::to_string(i + 1)},
                 {"history", json::array()}})
               .dump() +
           "\n";
    msgs += json({{"messages",
                   {{{"role", "user"}, {"content", "Name " + std::to_string(i)}},
                    {{"role", "assistant"}, {"content", "It is " + std::to_string(i)}}}}})
                .dump() +
            "\n";
  }
  write("in/a_glm.jsonl", glm);
  write("in/b_msgs.jsonl", msgs);
  auto sh = [&](const std::string& cmd, std::string* log) {
    const fs::path out = dir_ / "log.txt";
    const int status = std::system((cmd + " > " + out.string() + " 2>&1").c_str());
    *log = read(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string log;
  ASSERT_EQ(sh(std::string(DS_PREPARE_BIN) + " --sft auto --tokenizer " + kQwen.string() +
                   " --seq_len 48 --val_fraction 0.125 --output " + (dir_ / "sft").string() + " " +
                   (dir_ / "in").string(),
               &log),
            0)
      << log;
  EXPECT_NE(log.find("a_glm.jsonl: chatglm"), std::string::npos) << log;
  EXPECT_NE(log.find("b_msgs.jsonl: messages"), std::string::npos) << log;
  EXPECT_NE(log.find("48 records -> 48 examples written, 0 truncated"), std::string::npos) << log;
  EXPECT_NE(log.find("train: 42 examples"), std::string::npos) << log;
  EXPECT_NE(log.find("% of "), std::string::npos) << log;

  // Missing --seq_len and a bad record are errors (exit 1) with the reason.
  EXPECT_EQ(sh(std::string(DS_PREPARE_BIN) + " --sft auto --tokenizer " + kQwen.string() +
                   " --output " + (dir_ / "x").string() + " " + (dir_ / "in").string(),
               &log),
            1);
  EXPECT_NE(log.find("--seq_len"), std::string::npos) << log;

  std::ofstream(dir_ / "model.json")
      << R"({"preset": "test-gpt2", "vocab_size": 800, "block_size": 48})";
  const std::string train = std::string(DS_TRAIN_BIN) + " --train_data " + (dir_ / "sft").string() +
                            " --model " + (dir_ / "model.json").string() +
                            " --per_device_train_batch_size 2 --gradient_accumulation_steps 1"
                            " --learning_rate 0.01 --warmup_steps 1 --eval_batches 1 "
                            "--sample_tokens 0 --threads 1 --max_steps 16 --eval_steps 8 "
                            "--export_hf " +
                            (dir_ / "hf").string() + " --output_dir " + (dir_ / "run").string();
  ASSERT_EQ(sh(train, &log), 0) << log;
  // The export carries the template the examples were rendered with.
  {
    const json meta = json::parse(read(dir_ / "sft" / "meta.json"));
    const std::string name = meta["sft"]["template"];
    const json tc = json::parse(read(dir_ / "hf" / "tokenizer_config.json"));
    EXPECT_EQ(tc.value("chat_template", std::string()),
              std::string(ChatTemplate::by_name(name).jinja()))
        << name;
    EXPECT_NE(log.find("chat template \"" + name + "\""), std::string::npos) << log;
  }
  EXPECT_NE(log.find("42 samples of T 48"), std::string::npos) << log;
  // The context-free baseline counts only the trained tokens (answers), not prompts or padding.
  EXPECT_NE(log.find("unigram entropy of the train set's 241 trained tokens"), std::string::npos)
      << log;
  // The loss starts near ln(800) (uniform over the vocabulary) and falls: the answers are learnt.
  std::ifstream csv(dir_ / "run" / "metrics" / "Train_Samples_train_loss.csv");
  std::string header, row;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,train_loss");
  std::vector<double> losses;
  while (std::getline(csv, row)) losses.push_back(std::stod(row.substr(row.find(',') + 1)));
  ASSERT_EQ(losses.size(), 16u);
  EXPECT_NEAR(losses.front(), std::log(800.0), 0.5);
  EXPECT_LT(losses.back(), losses.front() - 1.0);

  EXPECT_EQ(sh(train + "_b --block_size 16", &log), 1) << log;
  EXPECT_NE(log.find("--seq_len 48"), std::string::npos) << log;
  EXPECT_NE(log.find("is 16"), std::string::npos) << log;
}
