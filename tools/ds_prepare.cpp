// ds_prepare: tokenize text files with GPT-2's tokenizer into token shards for training.
//
//   scripts/fetch_data.sh
//   ds_prepare --tokenizer .cache/data/gpt2 --output data/sotu --val_from_year 2001
//   .cache/data/sotu
//
// Supervised fine-tuning sets (JSONL conversations -> loss-masked, fixed-length examples):
//
//   ds_prepare --sft auto --tokenizer hf_model --seq_len 512 --output data/sft train.jsonl
//
// Sentence(-pair) classification sets (GLUE TSV or JSONL -> ids, token types, labels) for an
// encoder classifier:
//
//   ds_prepare --task classification --tokenizer bert_folder --seq_len 128 --val_files 'dev*'
//              --output data/mrpc train.tsv dev.tsv
//
// Sequence-to-sequence sets (JSONL source/target records -> source ids and labels) for an
// encoder-decoder (BART, BlenderBot):
//
//   ds_prepare --task seq2seq --tokenizer bart_folder --max_source_len 128 --max_target_len 64
//              --output data/chat train.jsonl
//
// See docs/data.md for the shard format and ds/data/prepare.h, ds/data/sft.h,
// ds/data/classification_set.h, ds/data/seq2seq_set.h for the rules.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/classification_set.h"
#include "ds/data/prepare.h"
#include "ds/data/seq2seq_set.h"
#include "ds/data/sft.h"

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

// A progress bar redrawn in place on a terminal; on a pipe or file, a plain line every 10%.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(::isatty(STDERR_FILENO) == 1) {}

  void operator()(const ds::data::PrepareProgress& p) {
    const double frac = p.bytes_total ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
    const double tps = p.seconds > 0 ? p.tokens / p.seconds : 0;
    const double eta = frac > 0 ? p.seconds * (1 - frac) / frac : 0;
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(frac * kWidth);
      fmt::print(stderr, "\r[{}{}] {:5.1f}%  {}/{} files  {} tokens  {} tok/s  ETA {:.0f}s   ",
                 std::string(filled, '#'), std::string(kWidth - filled, '.'), 100 * frac,
                 p.files_done, p.files_total, human_count(p.tokens), human_count(tps), eta);
      std::fflush(stderr);
      if (p.files_done == p.files_total && !ended_) {
        ended_ = true;
        fmt::print(stderr, "\n");
      }
    } else {
      const int decile = static_cast<int>(frac * 10);
      if (decile > last_decile_) {
        last_decile_ = decile;
        fmt::print(stderr, "ds_prepare: {:3.0f}%  {}/{} files  {} tokens  {} tok/s\n", 100 * frac,
                   p.files_done, p.files_total, human_count(p.tokens), human_count(tps));
      }
    }
  }

 private:
  bool tty_;
  bool ended_ = false;
  int last_decile_ = 0;
};

int run_sft(const ds::data::SftOptions& o) {
  try {
    const ds::data::SftReport r = ds::data::prepare_sft(o);
    for (const auto& [file, format] : r.file_formats)
      fmt::print("ds_prepare: {}: {} records\n", file, format);
    fmt::print("ds_prepare: template {}, seq_len {} (examples of {} tokens, padded with id {})\n",
               r.template_name, o.seq_len, o.seq_len + 1, r.pad_id);
    fmt::print("ds_prepare: split rule: {}\n", r.split_rule);
    const uint64_t written = r.train.examples + r.val.examples;
    fmt::print(
        "ds_prepare: {} records -> {} examples written, {} truncated (kept their first {} "
        "tokens), {} with earliest rounds dropped, {} dropped (too long: {}, no answer: {})\n",
        r.records, written, r.truncated, o.seq_len + 1, r.history_trimmed,
        r.dropped_too_long + r.dropped_no_response, r.dropped_too_long, r.dropped_no_response);
    for (const auto& [name, s] : {std::pair{"train", &r.train}, std::pair{"val", &r.val}}) {
      if (s->examples == 0) {
        fmt::print("ds_prepare: {:5}: empty (no examples)\n", name);
        continue;
      }
      const double targets = static_cast<double>(s->examples * o.seq_len);
      fmt::print(
          "ds_prepare: {:5}: {} examples, {} tokens, {} trained targets ({:.1f}% of {} targets) "
          "-> {}\n",
          name, s->examples, s->tokens, s->trained_tokens, 100.0 * s->trained_tokens / targets,
          static_cast<uint64_t>(targets), fmt::join(s->files, ", "));
    }
    for (const auto& w : r.warnings) fmt::print(stderr, "ds_prepare: {}\n", w);
    fmt::print("ds_prepare: {:.2f}s; wrote {}\n", r.seconds, r.meta.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "ds_prepare: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

int run_classification(const ds::data::ClassificationPrepareOptions& o) {
  try {
    const ds::data::ClassificationPrepareReport r = ds::data::prepare_classification(o);
    for (const auto& [file, n] : r.files) fmt::print("ds_prepare: {}: {} records\n", file, n);
    fmt::print("ds_prepare: {} task, {} labels ({}), seq_len {} (padded with id {})\n",
               r.pair ? "sentence-pair" : "single-sentence", r.labels.size(),
               fmt::join(r.labels, ", "), o.seq_len, r.pad_id);
    fmt::print("ds_prepare: split rule: {}\n", r.split_rule);
    for (const auto& [name, s] : {std::pair{"train", &r.train}, std::pair{"val", &r.val}}) {
      if (s->examples == 0) {
        fmt::print("ds_prepare: {:5}: empty (no examples)\n", name);
        continue;
      }
      std::vector<std::string> counts;
      for (size_t c = 0; c < r.labels.size(); ++c)
        counts.push_back(fmt::format("{}: {}", r.labels[c], s->label_counts[c]));
      fmt::print("ds_prepare: {:5}: {} examples (per label: {}), {} truncated -> {}\n", name,
                 s->examples, fmt::join(counts, ", "), s->truncated, s->file);
    }
    for (const std::string& n : r.notes) fmt::print(stderr, "ds_prepare: {}\n", n);
    fmt::print("ds_prepare: {:.2f}s; wrote {}\n", r.seconds, r.meta.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "ds_prepare: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

int run_seq2seq(const ds::data::Seq2SeqPrepareOptions& o) {
  try {
    const ds::data::Seq2SeqPrepareReport r = ds::data::prepare_seq2seq(o);
    for (const auto& [file, n] : r.files) fmt::print("ds_prepare: {}: {} records\n", file, n);
    fmt::print(
        "ds_prepare: seq2seq task, fields '{}' -> '{}', source <= {} ids (padded with id {}), "
        "labels <= {} ids (ending with eos {}, padded with -100), decoder start id {}\n",
        r.source_field, r.target_field, o.max_source_len, r.pad_id, o.max_target_len, r.eos_id,
        r.decoder_start_id);
    fmt::print("ds_prepare: split rule: {}\n", r.split_rule);
    for (const auto& [name, s] : {std::pair{"train", &r.train}, std::pair{"val", &r.val}}) {
      if (s->examples == 0) {
        fmt::print("ds_prepare: {:5}: empty (no examples)\n", name);
        continue;
      }
      fmt::print("ds_prepare: {:5}: {} examples ({} sources and {} targets truncated) -> {}\n",
                 name, s->examples, s->truncated_source, s->truncated_target, s->file);
    }
    fmt::print("ds_prepare: {:.2f}s; wrote {}\n", r.seconds, r.meta.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "ds_prepare: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

// Every option's value, and the options whose presence matters (which task they belong to).
struct Args {
  ds::data::PrepareOptions o;
  std::vector<std::string> inputs;
  std::string tokenizer, output, sft_format, chat_template, task = "lm", source_field,
      target_field, labels;
  double val_fraction = 0.1;
  int val_from_year = 0;
  bool quiet = false;
  int64_t seq_len = 0;  // signed: CLI11 would wrap "-1" into a huge size_t
  int64_t max_source_len = 128, max_target_len = 128;
  CLI::Option *sft = nullptr, *seq = nullptr, *task_opt = nullptr, *src_len = nullptr,
              *tgt_len = nullptr, *src_field = nullptr, *tgt_field = nullptr, *labels_opt = nullptr,
              *tmpl = nullptr, *frac = nullptr, *year = nullptr, *glob = nullptr, *shard = nullptr,
              *ext = nullptr, *eot = nullptr;
};

// Inputs, tokenizer, output and the choice of task.
void add_common_options(CLI::App& app, Args& a) {
  app.add_option("inputs", a.inputs,
                 "Text files or folders (searched recursively); with --sft, JSONL files")
      ->required();
  app.add_option("--tokenizer", a.tokenizer,
                 "Folder holding encoder.json and vocab.bpe (scripts/fetch_data.sh puts them in "
                 ".cache/data/gpt2), or a Hugging Face folder (tokenizer.json, tokenizer.model or "
                 "vocab.json + merges.txt; documents are then preceded by its eos token)")
      ->required();
  a.task_opt =
      app.add_option("--task", a.task,
                     "lm (language-model token shards, the default) or classification "
                     "(GLUE TSV / JSONL sentence(-pair) records for an encoder classifier) or "
                     "seq2seq (JSONL source/target records for an encoder-decoder); docs/data.md")
          ->check(CLI::IsMember({"lm", "classification", "seq2seq"}));
  app.add_option("--output", a.output, "Output folder for the shards and meta.json")->required();
  a.seq = app.add_option("--seq_len", a.seq_len,
                         "--sft: sequence length T; every example is T + 1 tokens "
                         "(train with ds_train --block_size T); --task classification: "
                         "ids per example after truncation and padding (default 128)");
  app.add_flag("-q,--quiet", a.quiet, "No progress output");
}

// --sft, --task seq2seq and --task classification.
void add_task_options(CLI::App& app, Args& a) {
  a.sft = app.add_option(
                 "--sft", a.sft_format,
                 "Supervised fine-tuning set from JSONL records: auto (detect per file), chatglm "
                 "({prompt, response, history}), alpaca ({instruction, input, output}) or messages "
                 "({messages: [{role, content}]}); see docs/data.md")
              ->check(CLI::IsMember({"auto", "chatglm", "alpaca", "messages"}));
  a.src_len = app.add_option("--max_source_len", a.max_source_len,
                             "--task seq2seq: source ids per example after truncation "
                             "(special tokens included; default 128)");
  a.tgt_len = app.add_option("--max_target_len", a.max_target_len,
                             "--task seq2seq: label ids per example after truncation "
                             "(eos included; default 128)");
  a.src_field = app.add_option(
      "--source_field", a.source_field,
      "--task seq2seq: the JSONL field holding the source text (default: source, src, prompt, "
      "input or question, whichever pair the first record has)");
  a.tgt_field =
      app.add_option("--target_field", a.target_field,
                     "--task seq2seq: the JSONL field holding the target text (default: target, "
                     "tgt, response, output or answer)");
  a.labels_opt = app.add_option(
      "--labels", a.labels,
      "--task classification: the label names in class-id order, comma-separated (default: "
      "integer labels as they are, or the sorted distinct names)");
  a.tmpl = app.add_option("--template", a.chat_template,
                          "--sft: chat format chatglm, alpaca, chatml, qwen2, llama3 or glm4 "
                          "(default: the tokenizer folder's chat_template)");
  a.labels_opt->needs(a.task_opt);
  for (CLI::Option* s2s : {a.src_len, a.tgt_len, a.src_field, a.tgt_field}) s2s->needs(a.task_opt);
  a.tmpl->needs(a.sft);
}

// The validation split and the language-model shards' options.
void add_split_options(CLI::App& app, Args& a) {
  a.frac = app.add_option("--val_fraction", a.val_fraction,
                          "Last fraction of files (in path order) used for validation; "
                          "the default rule when no other is given")
               ->capture_default_str()
               ->check(CLI::Range(0.0, 1.0));
  a.year = app.add_option("--val_from_year", a.val_from_year,
                          "Files whose name starts with a year >= this go to validation "
                          "(SOTU: 2001)");
  a.glob = app.add_option("--val_files", a.o.val_files,
                          "Glob (on file name or relative path) selecting validation files");
  a.frac->excludes(a.year)->excludes(a.glob);
  a.year->excludes(a.glob);
  a.shard =
      app.add_option(
             "--shard_tokens", a.o.shard_tokens,
             "Split each split into files of at most this many tokens (0: one file per split)")
          ->capture_default_str();
  app.add_option("--threads", a.o.threads, "Tokenizer threads (0: all hardware threads)")
      ->capture_default_str();
  a.ext = app.add_option("--ext", a.o.extension,
                         "In folders, take only files ending so ('' for all; --sft: default "
                         ".jsonl)")
              ->capture_default_str();
  a.eot = app.add_flag("--split_on_eot", a.o.split_on_eot,
                       "Treat the literal text <|endoftext|> inside files as a document separator");
  a.sft->excludes(a.shard)->excludes(a.eot);
}

// "ds_prepare: error: <option> does not apply to --task <task> (its options: ...)" for the first
// given option of `others`; 0 when none is given.
int refuse_others(std::initializer_list<CLI::Option*> others, const char* task,
                  const char* its_options) {
  for (CLI::Option* other : others)
    if (other->count()) {
      fmt::print(stderr, "ds_prepare: error: {} does not apply to --task {} (its options: {})\n",
                 other->get_name(), task, its_options);
      return 2;
    }
  return 0;
}

int seq2seq_task(const Args& a) {
  if (int rc = refuse_others({a.sft, a.tmpl, a.year, a.shard, a.eot, a.ext, a.seq, a.labels_opt},
                             "seq2seq",
                             "--tokenizer, --output, --max_source_len, --max_target_len, "
                             "--source_field, --target_field, --val_fraction, --val_files"))
    return rc;
  ds::data::Seq2SeqPrepareOptions so;
  for (const auto& in : a.inputs) so.inputs.emplace_back(in);
  so.tokenizer_dir = a.tokenizer;
  so.output_dir = a.output;
  so.max_source_len = static_cast<size_t>(a.max_source_len);
  so.max_target_len = static_cast<size_t>(a.max_target_len);
  so.source_field = a.source_field;
  so.target_field = a.target_field;
  if (a.frac->count()) so.val_fraction = a.val_fraction;
  so.val_files = a.o.val_files;
  return run_seq2seq(so);
}

int classification_task(const Args& a) {
  // Options of the other formats would be ignored: refuse them by name.
  if (int rc = refuse_others({a.sft, a.tmpl, a.year, a.shard, a.eot, a.ext}, "classification",
                             "--tokenizer, --output, --seq_len, --labels, --val_fraction, "
                             "--val_files"))
    return rc;
  ds::data::ClassificationPrepareOptions co;
  for (const auto& in : a.inputs) co.inputs.emplace_back(in);
  co.tokenizer_dir = a.tokenizer;
  co.output_dir = a.output;
  if (a.seq->count()) co.seq_len = static_cast<size_t>(a.seq_len);
  if (a.frac->count()) co.val_fraction = a.val_fraction;
  co.val_files = a.o.val_files;
  for (size_t at = 0; a.labels_opt->count() && at <= a.labels.size();) {
    const size_t comma = std::min(a.labels.find(',', at), a.labels.size());
    co.labels.push_back(a.labels.substr(at, comma - at));
    at = comma + 1;
  }
  return run_classification(co);
}

int sft_task(const Args& a) {
  ds::data::SftOptions so;
  for (const auto& in : a.inputs) so.inputs.emplace_back(in);
  if (a.ext->count()) so.extension = a.o.extension;
  so.tokenizer_dir = a.tokenizer;
  so.template_name = a.chat_template;
  so.format = ds::data::parse_sft_format(a.sft_format);
  so.output_dir = a.output;
  if (!a.seq->count()) {
    fmt::print(stderr, "ds_prepare: error: --sft needs --seq_len T (examples of T + 1 tokens)\n");
    return 1;
  }
  so.seq_len = static_cast<size_t>(a.seq_len);
  if (a.frac->count()) so.val_fraction = a.val_fraction;
  if (a.year->count()) so.val_from_year = a.val_from_year;
  so.val_files = a.o.val_files;
  return run_sft(so);
}

int lm_task(Args& a) {
  ds::data::PrepareOptions& o = a.o;
  for (const auto& in : a.inputs) o.inputs.emplace_back(in);
  o.tokenizer_dir = a.tokenizer;
  o.output_dir = a.output;
  if (a.frac->count()) o.val_fraction = a.val_fraction;
  if (a.year->count()) o.val_from_year = a.val_from_year;
  ProgressPrinter printer;
  if (!a.quiet) o.on_progress = [&](const ds::data::PrepareProgress& p) { printer(p); };
  try {
    const ds::data::PrepareReport r = ds::data::prepare_corpus(o);
    const double tps = r.seconds > 0 ? (r.train.tokens + r.val.tokens) / r.seconds : 0;
    fmt::print("ds_prepare: split rule: {}\n", r.split_rule);
    for (const auto& [name, s] : {std::pair{"train", &r.train}, std::pair{"val", &r.val}}) {
      if (s->tokens == 0) {
        fmt::print("ds_prepare: {:5}: empty (no files)\n", name);
        continue;
      }
      fmt::print("ds_prepare: {:5}: {} tokens, {} documents, {} source files -> {}\n", name,
                 s->tokens, s->documents, s->source_files, fmt::join(s->files, ", "));
    }
    fmt::print("ds_prepare: {} in {:.2f}s on {} threads: {} tokens/s ({}/s)\n",
               human_bytes(r.bytes), r.seconds, r.threads, human_count(tps),
               human_bytes(r.seconds > 0 ? r.bytes / r.seconds : 0));
    fmt::print("ds_prepare: wrote {}\n", r.meta.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "ds_prepare: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

// The task the options ask for, after the checks that apply across tasks.
int dispatch(Args& a) {
  if (a.task == "seq2seq") return seq2seq_task(a);
  for (CLI::Option* s2s : {a.src_len, a.tgt_len, a.src_field, a.tgt_field})
    if (s2s->count()) {
      fmt::print(stderr, "ds_prepare: error: {} needs --task seq2seq\n", s2s->get_name());
      return 2;
    }
  if (a.task == "classification") return classification_task(a);
  if (a.seq->count() && !a.sft->count()) {
    fmt::print(stderr, "ds_prepare: error: --seq_len needs --sft or --task classification\n");
    return 2;
  }
  if (a.labels_opt->count()) {
    fmt::print(stderr, "ds_prepare: error: --labels needs --task classification\n");
    return 2;
  }
  return a.sft->count() ? sft_task(a) : lm_task(a);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Tokenize text files with the GPT-2 tokenizer (or a Hugging Face folder's) into token shards "
      "(train/val) plus a meta.json.\nEach file is one document, preceded by <|endoftext|> (the "
      "folder's eos token). Files are taken in "
      "sorted path order.\nExample:\n  ds_prepare --tokenizer .cache/data/gpt2 --output "
      "data/sotu --val_from_year 2001 .cache/data/sotu",
      "ds_prepare"};
  Args a;
  add_common_options(app, a);
  add_task_options(app, a);
  add_split_options(app, a);
  CLI11_PARSE(app, argc, argv);
  // Lengths are bounded before anything is read: a huge one would allocate (or write) gigabytes.
  for (auto [opt, v] : {std::pair{a.seq, a.seq_len}, std::pair{a.src_len, a.max_source_len},
                        std::pair{a.tgt_len, a.max_target_len}})
    if (opt->count() && (v <= 0 || v > ds::data::kMaxPreparedLength)) {
      fmt::print(stderr, "ds_prepare: error: {} {} is outside [1, {}]\n", opt->get_name(), v,
                 ds::data::kMaxPreparedLength);
      return 2;
    }
  // What an earlier ds_prepare killed mid-write left in the output folder.
  try {
    for (const auto& p : ds::remove_dead_temporaries(a.output))
      fmt::print(stderr, "ds_prepare: removed {} (left by an interrupted earlier run)\n",
                 p.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "ds_prepare: error: {}\n", e.what());
    return 1;
  }
  return dispatch(a);
}
