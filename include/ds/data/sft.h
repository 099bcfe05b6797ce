#pragma once
// Supervised fine-tuning (SFT) data: JSONL conversations -> fixed-length, loss-masked examples ->
// token shards + mask shards + meta.json. ds_prepare --sft is a command line over prepare_sft();
// see docs/data.md ("Supervised fine-tuning sets").
//
// Input records, one JSON object per line (blank lines and a leading UTF-8 BOM are skipped):
//   chatglm   {"prompt": q, "response": a, "history": [[q0, a0], [q1, a1], ...]}  (history
//             optional) -> user q0, assistant a0, ..., user q, assistant a
//   alpaca    {"instruction": i, "input": x, "output": o}  ("input" optional, "" = none)
//             -> user i, input x (role "input"), assistant o; with a template other than alpaca
//             the input is appended to the user message after a blank line
//   messages  {"messages": [{"role": r, "content": c}, ...]}  (OpenAI / TRL)
// The format is detected per file from its first record (or given). A missing or mistyped field
// is a ds::Error naming "file:line" and the field.
//
// Examples: the conversation is rendered with a ChatTemplate (chat_template.h) and tokenized in
// one piece (no BOS is added: templates that want one write it). A token is trained (mask 1) when
// it overlaps an assistant message as rendered, including the end-of-turn token the template puts
// after it (<|im_end|>, <|eot_id|>, eos); every other token, and padding, has mask 0. Each example
// is exactly T + 1 tokens (T = seq_len): shorter ones are padded at the end with pad_id (the
// tokenizer's pad token, else its eos), so example i is TokenDataset sample i at sequence length T
// (dataset.h) and attention never crosses examples.
//
// Truncation, for an example longer than T + 1 tokens:
//   1. if a trained token lies within tokens [1, T] (a target of the first T + 1 tokens), keep
//      the first T + 1 tokens ("truncated");
//   2. otherwise drop the earliest round (a user message and the replies up to the next user
//      message; leading system messages stay) while more than one round is left, and try again
//      ("history trimmed");
//   3. an example with no trained token left in its first T + 1 tokens is dropped and counted.
// Records without any assistant message are dropped too (counted apart).
//
// Thread safety: free functions over their arguments; nothing is shared.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/data/chat_template.h"
#include "ds/data/text_tokenizer.h"

namespace ds::data {

enum class SftFormat { kAuto, kChatGLM, kAlpaca, kMessages };

// "auto", "chatglm", "alpaca", "messages"; anything else throws naming them.
SftFormat parse_sft_format(std::string_view name);
std::string_view sft_format_name(SftFormat f);

// One conversation and where it came from.
struct SftRecord {
  std::vector<ChatMessage> messages;
  size_t line = 0;  // 1-based line in its file
};

// The records of one JSONL file. format kAuto detects it from the first record; `detected`
// receives the format used. Throws ds::Error "[sft] FILE:LINE: ..." on a malformed record.
std::vector<SftRecord> read_sft_file(const std::filesystem::path& path, SftFormat format,
                                     SftFormat* detected = nullptr);

// One fixed-length example.
struct SftExample {
  std::vector<int32_t> ids;   // (T + 1,) padded with pad_id after `length` tokens
  std::vector<uint8_t> mask;  // (T + 1,) 1 = trained as a target; 0 on prompt and padding
  size_t length = 0;          // tokens before padding
  bool truncated = false;     // cut to T + 1 tokens (rule 1)
  int rounds_dropped = 0;     // earliest rounds dropped (rule 2)
};

enum class SftDrop { kNone, kNoResponse, kTooLong };

// The example of one conversation at sequence length seq_len (see the rules above), or nullopt
// with *why set when it is dropped. Template errors (a role the format does not allow) throw.
std::optional<SftExample> build_sft_example(const TextTokenizer& tok, const ChatTemplate& tmpl,
                                            std::span<const ChatMessage> messages, size_t seq_len,
                                            int32_t pad_id, SftDrop* why = nullptr);

// The pad id prepare_sft uses: the tokenizer's pad token, else its eos; throws when it has
// neither.
int32_t sft_pad_id(const TextTokenizer& tok);

struct SftOptions {
  std::vector<std::filesystem::path> inputs;  // JSONL files, or folders searched recursively
  std::string extension = ".jsonl";           // folders: only files ending so ("" = all)
  std::filesystem::path tokenizer_dir;        // a Hugging Face folder (load_tokenizer)
  std::string template_name;                  // "" = the folder's chat_template (from_jinja)
  SftFormat format = SftFormat::kAuto;
  size_t seq_len = 0;  // T: every example is T + 1 tokens
  std::filesystem::path output_dir;
  // Split rule (at most one): val_fraction f puts the last ceil(f * records) records (files in
  // sorted path order, records in line order) in val, default 0.1 (with fewer than 2 records: no
  // val); val_files / val_from_year choose whole files as for plain text (prepare.h).
  std::optional<double> val_fraction;
  std::optional<int> val_from_year;
  std::string val_files;
};

struct SftSplitReport {
  std::vector<std::string> files, mask_files;  // relative to output_dir
  uint64_t examples = 0;
  uint64_t tokens = 0;          // examples * (T + 1)
  uint64_t trained_tokens = 0;  // targets that are not -100
};

struct SftReport {
  SftSplitReport train, val;
  uint64_t records = 0;
  uint64_t truncated = 0;         // kept their first T + 1 tokens (rule 1)
  uint64_t history_trimmed = 0;   // lost earliest rounds (rule 2)
  uint64_t dropped_too_long = 0;  // rule 3
  uint64_t dropped_no_response = 0;
  uint64_t empty_responses = 0;  // written, but every answer is "" (trains only end-of-turn)
  std::vector<std::string> warnings;  // for the caller to print
  std::vector<std::pair<std::string, std::string>> file_formats;  // (file, detected format)
  std::string template_name, split_rule;
  int32_t pad_id = -1;
  double seconds = 0;
  std::filesystem::path meta;
};

// Read, build, split and write: train.bin + train.mask.bin, val.bin + val.mask.bin (a split with
// no example gets no files), then meta.json, written last. Errors name the file and line.
SftReport prepare_sft(const SftOptions& options);

}  // namespace ds::data
