#include "ds/data/sft.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/text.h"
#include "ds/data/prepare.h"
#include "ds/data/shard.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct FormatName {
  SftFormat format;
  std::string_view name;
};
constexpr FormatName kFormats[] = {{SftFormat::kAuto, "auto"},
                                   {SftFormat::kChatGLM, "chatglm"},
                                   {SftFormat::kAlpaca, "alpaca"},
                                   {SftFormat::kMessages, "messages"}};

// Where a record came from, for messages: "data/train.jsonl:12".
struct Where {
  const fs::path& file;
  size_t line;
};

template <typename... Args>
[[noreturn]] void fail(const Where& w, fmt::format_string<Args...> f, Args&&... args) {
  DS_THROW("[sft] {}:{}: {}", w.file.string(), w.line, fmt::format(f, std::forward<Args>(args)...));
}

const char* expected_fields(SftFormat f) {
  switch (f) {
    case SftFormat::kChatGLM:
      return "chatglm records are {\"prompt\", \"response\", \"history\": [[q, a], ...]}";
    case SftFormat::kAlpaca:
      return "alpaca records are {\"instruction\", \"input\", \"output\"}";
    default:
      return "messages records are {\"messages\": [{\"role\", \"content\"}, ...]}";
  }
}

// The string field `key` of object j; throws naming it when missing (unless optional) or not a
// string.
std::optional<std::string> string_field(const json& j, const char* key, SftFormat f, const Where& w,
                                        bool optional = false) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (optional) return std::nullopt;
    fail(w, "field '{}' is missing ({}); fix the record or give the right --sft format", key,
         expected_fields(f));
  }
  if (!it->is_string())
    fail(w, "field '{}' must be a string, not {} ({})", key, it->type_name(), expected_fields(f));
  return it->get<std::string>();
}

SftFormat detect(const json& j, const Where& w) {
  if (j.contains("messages")) return SftFormat::kMessages;
  if (j.contains("instruction") || j.contains("output")) return SftFormat::kAlpaca;
  if (j.contains("prompt") || j.contains("response")) return SftFormat::kChatGLM;
  // The keys are the user's bytes: each quoted escaped and cut, and at most 8 of them.
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) {
    if (keys.size() == 8) {
      keys.push_back(fmt::format("... {} keys in all", j.size()));
      break;
    }
    keys.push_back(quoted_excerpt(k, 60));
  }
  fail(w,
       "cannot tell the record format from its fields ({}): expected \"messages\" (messages), "
       "\"instruction\"/\"output\" (alpaca) or \"prompt\"/\"response\" (chatglm); convert the "
       "file or give --sft FORMAT",
       fmt::join(keys, ", "));
}

std::vector<ChatMessage> to_messages(const json& j, SftFormat f, const Where& w) {
  std::vector<ChatMessage> out;
  switch (f) {
    case SftFormat::kChatGLM: {
      const auto h = j.find("history");
      if (h != j.end() && !h->is_null()) {
        if (!h->is_array())
          fail(w, "field 'history' must be a list of [question, answer] pairs, not {}",
               h->type_name());
        for (size_t i = 0; i < h->size(); ++i) {
          const json& pair = (*h)[i];
          if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
            fail(w, "field 'history[{}]' must be a [question, answer] pair of strings, not {}", i,
                 quoted_excerpt(pair.dump(), 80));
          out.push_back({"user", pair[0].get<std::string>()});
          out.push_back({"assistant", pair[1].get<std::string>()});
        }
      }
      out.push_back({"user", *string_field(j, "prompt", f, w)});
      out.push_back({"assistant", *string_field(j, "response", f, w)});
      break;
    }
    case SftFormat::kAlpaca: {
      out.push_back({"user", *string_field(j, "instruction", f, w)});
      const auto input = string_field(j, "input", f, w, /*optional=*/true);
      if (input && !input->empty()) out.push_back({"input", *input});
      out.push_back({"assistant", *string_field(j, "output", f, w)});
      break;
    }
    case SftFormat::kMessages: {
      const auto m = j.find("messages");
      if (m == j.end() || m->is_null())
        fail(w, "field 'messages' is missing ({})", expected_fields(f));
      if (!m->is_array() || m->empty())
        fail(w, "field 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects");
      for (size_t i = 0; i < m->size(); ++i) {
        const json& msg = (*m)[i];
        if (!msg.is_object())
          fail(w, "field 'messages[{}]' must be an object {{\"role\", \"content\"}}, not {}", i,
               msg.type_name());
        const std::string at = fmt::format("messages[{}]", i);
        for (const char* key : {"role", "content"}) {
          const auto it = msg.find(key);
          if (it == msg.end() || it->is_null())
            fail(w, "field '{}.{}' is missing ({})", at, key, expected_fields(f));
          if (!it->is_string())
            fail(w, "field '{}.{}' must be a string, not {}", at, key, it->type_name());
        }
        out.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
      }
      break;
    }
    case SftFormat::kAuto:
      DS_THROW("[sft] internal: format not resolved");
  }
  return out;
}

// Alpaca's "input" role exists only in the alpaca template; elsewhere it joins the instruction.
std::vector<ChatMessage> adapt(const ChatTemplate& tmpl, std::span<const ChatMessage> messages) {
  std::vector<ChatMessage> out;
  for (const ChatMessage& m : messages) {
    if (m.role == "input" && tmpl.format() != ChatFormat::kAlpaca && !out.empty() &&
        out.back().role == "user") {
      out.back().content += "\n\n" + m.content;
      continue;
    }
    out.push_back(m);
  }
  return out;
}

// Index of the first message of each round: a round starts at every user message after the
// leading system messages (anything before the first user message belongs to the first round).
std::vector<size_t> round_starts(std::span<const ChatMessage> messages) {
  size_t i = 0;
  while (i < messages.size() && messages[i].role == "system") ++i;
  std::vector<size_t> starts;
  if (i < messages.size()) starts.push_back(i);
  for (size_t k = i + 1; k < messages.size(); ++k)
    if (messages[k].role == "user") starts.push_back(k);
  return starts;
}

// The input files for a message: the one path, or the first three and how many more.
std::string files_named(const std::vector<InputFile>& files) {
  if (files.size() == 1) return files[0].path.string();
  std::vector<std::string> shown;
  for (size_t i = 0; i < files.size() && i < 3; ++i) shown.push_back(files[i].path.string());
  return fmt::format("{} input files ({}{})", files.size(), fmt::join(shown, ", "),
                     files.size() > 3 ? ", ..." : "");
}

class SplitOut {
 public:
  SplitOut(std::string name, const fs::path& dir, uint32_t vocab)
      : name_(std::move(name)), dir_(dir), vocab_(vocab) {}

  void write(const SftExample& e) {
    if (!tokens_) {
      report_.files = {name_ + ".bin"};
      report_.mask_files = {name_ + ".mask.bin"};
      tokens_ = std::make_unique<ShardWriter>(dir_ / report_.files[0], vocab_);
      mask_ = std::make_unique<ShardWriter>(dir_ / report_.mask_files[0], 2, kShardFlagMask);
    }
    tokens_->write(e.ids);
    std::vector<int32_t> m(e.mask.begin(), e.mask.end());
    mask_->write(m);
    tokens_->add_documents(1);
    mask_->add_documents(1);
    report_.examples += 1;
    report_.tokens += e.ids.size();
    report_.trained_tokens += std::count(e.mask.begin() + 1, e.mask.end(), 1);
  }

  SftSplitReport finish() {
    if (tokens_) {
      tokens_->finish();
      mask_->finish();
    }
    return report_;
  }

 private:
  std::string name_;
  fs::path dir_;
  uint32_t vocab_;
  std::unique_ptr<ShardWriter> tokens_, mask_;
  SftSplitReport report_;
};

json split_json(const SftSplitReport& s) {
  return {{"files", s.files},       {"mask_files", s.mask_files},
          {"tokens", s.tokens},     {"documents", s.examples},
          {"examples", s.examples}, {"trained_tokens", s.trained_tokens}};
}

}  // namespace

SftFormat parse_sft_format(std::string_view name) {
  for (const FormatName& f : kFormats)
    if (f.name == name) return f.format;
  DS_THROW("[sft] unknown SFT record format '{}'; use auto, chatglm, alpaca or messages", name);
}

std::string_view sft_format_name(SftFormat f) {
  for (const FormatName& n : kFormats)
    if (n.format == f) return n.name;
  return "?";
}

std::vector<SftRecord> read_sft_file(const fs::path& path, SftFormat format, SftFormat* detected) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), "[sft] cannot read '{}'", path.string());
  std::vector<SftRecord> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Editors on Windows start a file with a byte order mark: not part of the first record.
    const Where w{path, n};
    if (n == 1) {
      line.erase(0, line.size() - strip_utf8_bom(line).size());
      if (line.starts_with("\xFF\xFE") || line.starts_with("\xFE\xFF"))
        fail(w, "the file is UTF-16 (it starts with the byte order mark {}); save it as UTF-8",
             quoted_excerpt(line.substr(0, 2)));
    } else if (line.size() != strip_utf8_bom(line).size()) {
      // Invisible in any message: say what it is (files joined with cat keep each one's mark).
      fail(w,
           "the line starts with a UTF-8 byte order mark (bytes EF BB BF), which only the first "
           "line of a file may carry (were files joined with cat?); remove it");
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    // A JSON array file (alpaca_data.json is one) is not JSON Lines: say how to convert it.
    if (out.empty() && line[line.find_first_not_of(" \t")] == '[')
      fail(w,
           "the file is a JSON array, not JSON Lines (one record object per line); convert it "
           "with: jq -c '.[]' {} > records.jsonl",
           path.string());
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      // The parser's "last read: '...'" echoes the input raw (invalid UTF-8, or a whole 50 MB
      // string): keep its reason, and show the line escaped and cut.
      std::string why = e.what();
      if (const auto cut = why.find("; last read"); cut != std::string::npos) why.resize(cut);
      fail(w, "not valid JSON ({}); each line must be one JSON object; the line is {}",
           quoted_excerpt(why, 200), quoted_excerpt(line, 200));
    }
    if (!j.is_object()) fail(w, "a record must be a JSON object, not {}", j.type_name());
    if (format == SftFormat::kAuto) format = detect(j, w);
    out.push_back({to_messages(j, format, w), n});
  }
  DS_CHECK(!in.bad(), "[sft] error while reading '{}'", path.string());
  if (detected) *detected = format;
  return out;
}

int32_t sft_pad_id(const TextTokenizer& tok) {
  const TokenizerConfig& c = tok.config();
  if (c.pad_id >= 0) return c.pad_id;
  DS_CHECK(c.eos_id >= 0,
           "[sft] the tokenizer names neither a pad nor an eos token (tokenizer_config.json "
           "pad_token / eos_token); add one so examples can be padded");
  return c.eos_id;
}

std::optional<SftExample> build_sft_example(const TextTokenizer& tok, const ChatTemplate& tmpl,
                                            std::span<const ChatMessage> messages, size_t seq_len,
                                            int32_t pad_id, SftDrop* why) {
  DS_CHECK(seq_len > 0, "[sft] seq_len must be positive");
  const size_t L = seq_len + 1;
  if (why) *why = SftDrop::kNone;
  std::vector<ChatMessage> msgs = adapt(tmpl, messages);
  if (std::none_of(msgs.begin(), msgs.end(),
                   [](const ChatMessage& m) { return m.role == "assistant"; })) {
    if (why) *why = SftDrop::kNoResponse;
    return std::nullopt;
  }
  SftExample e;
  for (;;) {
    ChatTokens t = tmpl.encode(tok, msgs, /*add_generation_prompt=*/false);
    const size_t n = std::min(t.ids.size(), L);
    // Token 0 is never a target: a trained token must lie in [1, n).
    const bool trains = std::any_of(t.assistant_mask.begin() + std::min<size_t>(1, n),
                                    t.assistant_mask.begin() + n, [](uint8_t m) { return m; });
    if (trains) {
      e.truncated = t.ids.size() > L;
      e.length = n;
      e.ids.assign(t.ids.begin(), t.ids.begin() + n);
      e.mask.assign(t.assistant_mask.begin(), t.assistant_mask.begin() + n);
      e.ids.resize(L, pad_id);
      e.mask.resize(L, 0);
      return e;
    }
    const std::vector<size_t> rounds = round_starts(msgs);
    if (t.ids.size() <= L || rounds.size() < 2) {
      if (why) *why = t.ids.size() <= L ? SftDrop::kNoResponse : SftDrop::kTooLong;
      return std::nullopt;
    }
    msgs.erase(msgs.begin() + rounds[0], msgs.begin() + rounds[1]);
    e.rounds_dropped += 1;
  }
}

namespace {

struct LoadedSft {
  size_t file;
  SftRecord record;
};

// The folder's template unless one is named; says which flag picks one when it cannot be used.
ChatTemplate pick_template(const SftOptions& o, const TextTokenizer& tok) {
  if (!o.template_name.empty()) return ChatTemplate::by_name(o.template_name);
  try {
    return ChatTemplate::from_jinja(tok.config().chat_template);
  } catch (const ds::Error& e) {
    DS_THROW("[sft] cannot use the chat template of '{}': {}; give --template {}",
             o.tokenizer_dir.string(), e.what(), fmt::join(ChatTemplate::names(), "|"));
  }
}

// Every record of every file, in file order (each file's format detected or as given).
std::vector<LoadedSft> read_records(const std::vector<InputFile>& files, SftFormat format,
                                    SftReport& report) {
  std::vector<LoadedSft> records;
  for (size_t i = 0; i < files.size(); ++i) {
    SftFormat used = format;
    for (SftRecord& r : read_sft_file(files[i].path, format, &used))
      records.push_back({i, std::move(r)});
    report.file_formats.emplace_back(files[i].path.string(), sft_format_name(used));
  }
  report.records = records.size();
  DS_CHECK(!records.empty(),
           "[sft] {}: no records (every line is empty or blank); each line must be one JSON "
           "object: check that this is the right file",
           files_named(files));
  return records;
}

// The fraction rule: records [first, end) are validation.
size_t first_val_record(std::optional<double> val_fraction, size_t records, SftReport& report) {
  const double f = val_fraction.value_or(0.1);
  DS_CHECK(f >= 0 && f < 1, "[sft] val_fraction must be in [0, 1), got {}", f);
  size_t n_val = static_cast<size_t>(std::ceil(f * static_cast<double>(records)));
  if (!val_fraction && records < 2) n_val = 0;
  DS_CHECK(n_val < records,
           "[sft] val_fraction {} would put all {} records in validation; give more records or "
           "a smaller fraction",
           f, records);
  report.split_rule = fmt::format(
      "val_fraction={}: the last {} of {} records (files in path order) are validation", f, n_val,
      records);
  return records - n_val;
}

// Whether every assistant answer of the record is empty (or only spaces): such an example still
// trains its end-of-turn token, so the model would learn to stop at once.
bool empty_answer(const SftRecord& r) {
  return std::all_of(r.messages.begin(), r.messages.end(), [](const ChatMessage& m) {
    return m.role != "assistant" || m.content.find_first_not_of(" \t\r\n") == std::string::npos;
  });
}

// Nothing to learn from is an error naming the input; some empty answers are a warning with the
// counts and where the first ones are.
void check_written(const SftReport& r, const SftOptions& o, const std::vector<InputFile>& files,
                   const std::vector<std::string>& empty_where, std::vector<std::string>& warnings) {
  const uint64_t written = r.train.examples + r.val.examples;
  DS_CHECK(written == 0 || r.empty_responses < written,
           "[sft] {}: every one of the {} examples ({} records read) has an empty answer "
           "(assistant content \"\" or only spaces; first at {}): training on them would only "
           "teach the model to end its turn at once. Fill in the answer field (response, output, "
           "or the assistant messages)",
           files_named(files), written, r.records, fmt::join(empty_where, ", "));
  if (r.empty_responses > 0)
    warnings.push_back(fmt::format(
        "warning: {} of {} examples have an empty answer (assistant content \"\" or only "
        "spaces; {} records read; first at {}); each trains only its end-of-turn token. Check "
        "the answer field of those records",
        r.empty_responses, written, r.records, fmt::join(empty_where, ", ")));
  DS_CHECK(r.train.examples > 0,
           "[sft] {}: no training example was written ({} records read: {} dropped as too long "
           "for --seq_len {}, {} without an assistant answer, {} in validation); raise --seq_len, "
           "lower the validation share or check the data",
           files_named(files), r.records, r.dropped_too_long, o.seq_len, r.dropped_no_response,
           r.val.examples);
}

// meta.json: the shards' format, the tokenizer, the SFT counts and the splits.
json sft_meta(const SftOptions& o, const TextTokenizer& tok, const SftReport& report) {
  const TokenizerConfig& tc = tok.config();
  const auto vocab = static_cast<uint32_t>(tok.vocab_size());
  json meta = {
      {"format", "DSTOKENS"},
      {"version", kShardVersion},
      {"token_dtype", token_bytes_for_vocab(vocab) == 2 ? "uint16" : "uint32"},
      {"tokenizer",
       {{"name", fs::absolute(o.tokenizer_dir).lexically_normal().filename().string()},
        {"path", o.tokenizer_dir.string()},
        {"kind", std::string(tok.kind())},
        {"vocab_size", vocab},
        {"eos_id", tc.eos_id},
        {"pad_id", report.pad_id}}},
      {"documents", "each example is one document of exactly seq_len + 1 tokens"},
      {"sft",
       {{"seq_len", o.seq_len},
        {"example_tokens", o.seq_len + 1},
        {"template", report.template_name},
        {"pad_id", report.pad_id},
        {"mask",
         "mask_files: one byte per token, 1 = trained as a target (assistant answers and their "
         "end-of-turn token), 0 = target -100 (prompt, padding)"},
        {"records", report.records},
        {"truncated", report.truncated},
        {"history_trimmed", report.history_trimmed},
        {"dropped_too_long", report.dropped_too_long},
        {"dropped_no_response", report.dropped_no_response},
        {"empty_responses", report.empty_responses},
        {"input_formats", json::object()}}},
      {"split_rule", report.split_rule},
      {"created_by", "ds_prepare --sft"},
      {"splits", json::object()}};
  for (const auto& [file, format] : report.file_formats)
    meta["sft"]["input_formats"][file] = format;
  if (report.train.examples > 0) meta["splits"]["train"] = split_json(report.train);
  if (report.val.examples > 0) meta["splits"]["val"] = split_json(report.val);
  return meta;
}

}  // namespace

SftReport prepare_sft(const SftOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  DS_CHECK(o.seq_len > 0, "[sft] --seq_len is required: every example is seq_len + 1 tokens");
  check_sequence_length("sft", "--seq_len", static_cast<int64_t>(o.seq_len), 0, {});
  DS_CHECK(!o.output_dir.empty(), "[sft] no output folder given");
  check_output_outside_inputs(o.inputs, o.output_dir, "sft");
  const std::vector<InputFile> files = list_inputs(o.inputs, o.extension, o.output_dir);
  SftReport report;
  // Whole-file rules come from prepare.h; the fraction rule applies to records, below.
  const bool by_files = o.val_from_year || !o.val_files.empty();
  DS_CHECK(!(by_files && o.val_fraction),
           "[sft] give at most one split rule (val_fraction, val_from_year, val_files)");
  std::vector<bool> file_is_val(files.size(), false);
  if (by_files) {
    PrepareOptions po;
    po.val_from_year = o.val_from_year;
    po.val_files = o.val_files;
    file_is_val = assign_val(files, po, &report.split_rule);
  }
  const auto tok = load_tokenizer(o.tokenizer_dir);
  check_sequence_length("sft", "--seq_len", static_cast<int64_t>(o.seq_len),
                        tok->config().model_max_length, o.tokenizer_dir);
  const ChatTemplate tmpl = pick_template(o, *tok);
  report.template_name = tmpl.name();
  report.pad_id = sft_pad_id(*tok);
  const std::vector<LoadedSft> records = read_records(files, o.format, report);
  const size_t first_val = by_files ? records.size()
                                    : first_val_record(o.val_fraction, records.size(), report);

  fs::create_directories(o.output_dir);
  const auto vocab = static_cast<uint32_t>(tok->vocab_size());
  SplitOut train("train", o.output_dir, vocab), val("val", o.output_dir, vocab);
  std::vector<std::string> empty_where;  // the first few records with an empty answer
  for (size_t k = 0; k < records.size(); ++k) {
    const LoadedSft& r = records[k];
    SftDrop why = SftDrop::kNone;
    std::optional<SftExample> e;
    try {
      e = build_sft_example(*tok, tmpl, r.record.messages, o.seq_len, report.pad_id, &why);
    } catch (const ds::Error& err) {
      DS_THROW("[sft] {}:{}: {}", files[r.file].path.string(), r.record.line, err.what());
    }
    if (!e) {
      (why == SftDrop::kTooLong ? report.dropped_too_long : report.dropped_no_response) += 1;
      continue;
    }
    const bool empty = empty_answer(r.record);
    report.empty_responses += empty;
    if (empty && empty_where.size() < 3)
      empty_where.push_back(fmt::format("{}:{}", files[r.file].path.string(), r.record.line));
    report.truncated += e->truncated;
    report.history_trimmed += e->rounds_dropped > 0;
    const bool is_val = by_files ? file_is_val[r.file] : k >= first_val;
    (is_val ? val : train).write(*e);
  }
  report.train = train.finish();
  report.val = val.finish();
  check_written(report, o, files, empty_where, report.warnings);
  report.meta = o.output_dir / "meta.json";
  ds::write_file_atomic(report.meta, sft_meta(o, *tok, report).dump(2) + "\n");
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ds::data
