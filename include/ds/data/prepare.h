#pragma once
// Corpus preparation: text files -> tokens -> token shards (shard.h) + meta.json. The tokenizer is
// GPT-2's (encoder.json + vocab.bpe), or any Hugging Face folder load_tokenizer reads
// (text_tokenizer.h: tokenizer.json of BPE, WordPiece or Unigram, tokenizer.model, ...), whose eos
// token then takes the place of <|endoftext|> below.
// The ds_prepare program is a command line over prepare_corpus(); see docs/data.md.
//
// Documents: each input file is one document (or, with split_on_eot, the literal text
// "<|endoftext|>" inside a file separates documents). Every document is written preceded by the
// <|endoftext|> token (50256), so a sample that starts a document sees the same context token.
// Files are taken in sorted path order; tokenization runs on `threads` threads but the output
// order never depends on the thread count or timing.
//
// Split rule (one of), applied to whole input files:
//   val_from_year = Y   files whose name starts with a year >= Y go to val (SOTU: 2001 -> the
//                       speeches after 2000 are validation); a file without a leading year is an
//                       error
//   val_files = GLOB    files whose name or relative path matches the glob go to val
//   val_fraction = f    the last ceil(f * files) files in sorted order go to val; the default,
//                       0.1, applies when no rule is given (with fewer than 2 files: no val)
//
// Output in output_dir: train.bin and val.bin, or with shard_tokens > 0 train_0000.bin,
// train_0001.bin, ... of at most shard_tokens tokens each; then meta.json (written last, so its
// presence means the set is complete). A split with no documents gets no files and no entry.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds::data {

struct PrepareProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t files_done = 0, files_total = 0;
  uint64_t tokens = 0;
  double seconds = 0;
};

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;  // files, or folders searched recursively
  std::string extension = ".txt";             // folders: only files ending so ("" = all files)
  std::filesystem::path tokenizer_dir;        // encoder.json + vocab.bpe, or a HF folder
  std::filesystem::path output_dir;           // created if missing
  std::optional<double> val_fraction;
  std::optional<int> val_from_year;
  std::string val_files;
  uint64_t shard_tokens = 0;  // 0: one file per split
  int threads = 0;            // 0: all hardware threads
  bool split_on_eot = false;  // GPT-2 tokenizer only
  // Called on the calling thread about every 100 ms while tokenizing, and once at the end.
  std::function<void(const PrepareProgress&)> on_progress;
};

struct InputFile {
  std::filesystem::path path;
  std::string rel;  // path relative to the input folder it was found in (a file input: its name)
  uint64_t size = 0;
};

struct SplitReport {
  std::vector<std::string> files;  // shard file names, in order, relative to output_dir
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t source_files = 0;
};

struct PrepareReport {
  SplitReport train, val;
  uint64_t bytes = 0;
  double seconds = 0;  // tokenizing and writing, excluding loading the tokenizer
  int threads = 0;
  std::string split_rule;
  std::filesystem::path meta;
};

// The input files, deduplicated and sorted by path; folders are searched recursively, skipping
// `output_dir` when it lies inside one (its meta.json and splits are not input). Throws if an
// input does not exist or nothing is found.
std::vector<InputFile> list_inputs(const std::vector<std::filesystem::path>& inputs,
                                   std::string_view extension,
                                   const std::filesystem::path& output_dir = {});

// Refuses an input that is the output folder or lies inside it: a second run would read the first
// run's meta.json and splits as input (an output folder inside an input folder is skipped by
// list_inputs instead). Paths are compared after resolving symlinks and "..". Throws "[TAG] ..."
// naming both.
void check_output_outside_inputs(const std::vector<std::filesystem::path>& inputs,
                                 const std::filesystem::path& output_dir, const char* tag);

// The longest sequence a set may be prepared for (--seq_len, --max_source_len, --max_target_len):
// the tokenizer's model_max_length when its tokenizer_config.json gives one, else 1,048,576
// (2^20) ids, past which a set of even one example is more memory than any model here can use.
// Throws "[TAG] OPTION N ..." naming the limit and where it comes from.
void check_sequence_length(const char* tag, const char* option, int64_t value,
                           int64_t model_max_length, const std::filesystem::path& tokenizer_dir);
inline constexpr int64_t kMaxPreparedLength = int64_t{1} << 20;

// For each file (in list_inputs order), whether it goes to val under the options' rule; `rule`
// receives a one-line description of the rule for meta.json and logs.
std::vector<bool> assign_val(const std::vector<InputFile>& files, const PrepareOptions& options,
                             std::string* rule = nullptr);

PrepareReport prepare_corpus(const PrepareOptions& options);

}  // namespace ds::data
