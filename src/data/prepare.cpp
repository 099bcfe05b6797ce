#include "ds/data/prepare.h"

#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/shard.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer.h"

namespace ds::data {

namespace fs = std::filesystem;

namespace {

// Files are tokenized in chunks of about this many bytes: bounds memory (token vectors of one
// chunk) while giving every thread plenty of files.
constexpr uint64_t kChunkBytes = 64ull << 20;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), "[prepare] cannot read '{}'", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  DS_CHECK(!in.bad(), "[prepare] error while reading '{}'", path.string());
  return std::move(ss).str();
}

// Leading 4-digit year of a file name ("1790_george_washington_n.txt" -> 1790), or -1.
int leading_year(const std::string& name) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (name.size() < 4 || !std::all_of(name.begin(), name.begin() + 4, digit)) return -1;
  if (name.size() > 4 && digit(name[4])) return -1;
  return std::stoi(name.substr(0, 4));
}

// Writes one split, rotating to a new shard file every shard_tokens tokens when asked.
class SplitWriter {
 public:
  SplitWriter(std::string name, fs::path dir, uint64_t shard_tokens, uint32_t vocab)
      : name_(std::move(name)), dir_(std::move(dir)), shard_tokens_(shard_tokens), vocab_(vocab) {}

  void write_document(std::span<const int32_t> tokens, uint64_t documents) {
    report_.tokens += tokens.size();
    report_.documents += documents;
    report_.source_files += 1;
    bool counted = false;
    do {
      if (!writer_) open_next();
      if (!counted) {
        writer_->add_documents(documents);  // counted in the shard where the file starts
        counted = true;
      }
      size_t n = tokens.size();
      if (shard_tokens_ > 0) n = std::min<uint64_t>(n, shard_tokens_ - writer_->num_tokens());
      writer_->write(tokens.first(n));
      tokens = tokens.subspan(n);
      if (shard_tokens_ > 0 && writer_->num_tokens() == shard_tokens_) close();
    } while (!tokens.empty());
  }

  SplitReport finish() {
    close();
    return report_;
  }

 private:
  void open_next() {
    const std::string file = shard_tokens_ == 0
                                 ? name_ + ".bin"
                                 : fmt::format("{}_{:04d}.bin", name_, report_.files.size());
    report_.files.push_back(file);
    writer_ = std::make_unique<ShardWriter>(dir_ / file, vocab_);
  }
  void close() {
    if (writer_) writer_->finish();
    writer_.reset();
  }

  std::string name_;
  fs::path dir_;
  uint64_t shard_tokens_;
  uint32_t vocab_;
  std::unique_ptr<ShardWriter> writer_;
  SplitReport report_;
};

nlohmann::json split_json(const SplitReport& s) {
  return {{"files", s.files},
          {"tokens", s.tokens},
          {"documents", s.documents},
          {"source_files", s.source_files}};
}

}  // namespace

void check_output_outside_inputs(const std::vector<fs::path>& inputs, const fs::path& output_dir,
                                 const char* tag) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output_dir, ec), ec);
  // Whether `inner` is `outer` or inside it (component-wise prefix).
  auto within = [](const fs::path& inner, const fs::path& outer) {
    auto i = inner.begin();
    for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
      if (o->empty() && std::next(o) == outer.end()) break;  // "a/b/" ends with an empty name
      if (i == inner.end() || *i != *o) return false;
    }
    return true;
  };
  for (const fs::path& in : inputs) {
    const fs::path p = fs::weakly_canonical(fs::absolute(in, ec), ec);
    DS_CHECK(!within(p, out),
             "[{}] the input {} {} the output folder {}: a run would read its own meta.json and "
             "split files as input; give the source files, or another --output",
             tag, in.string(), p == out ? "is" : "is inside", output_dir.string());
  }
}

void check_sequence_length(const char* tag, const char* option, int64_t value,
                           int64_t model_max_length, const fs::path& tokenizer_dir) {
  DS_CHECK(value > 0, "[{}] {} must be positive, got {}", tag, option, value);
  const bool by_tokenizer = model_max_length > 0 && model_max_length < kMaxPreparedLength;
  const int64_t limit = by_tokenizer ? model_max_length : kMaxPreparedLength;
  DS_CHECK(value <= limit, "[{}] {} {} exceeds {}; give at most {}", tag, option, value,
           by_tokenizer ? fmt::format("the tokenizer's model_max_length {} ({}/"
                                      "tokenizer_config.json: the model's longest input)",
                                      model_max_length, tokenizer_dir.string())
                        : fmt::format("the largest length a set is prepared for ({} ids)",
                                      kMaxPreparedLength),
           limit);
}

std::vector<InputFile> list_inputs(const std::vector<fs::path>& inputs,
                                   std::string_view extension, const fs::path& output_dir) {
  DS_CHECK(!inputs.empty(), "[prepare] no inputs given; pass text files or folders");
  std::error_code ec;
  const fs::path skip =
      output_dir.empty() ? fs::path() : fs::weakly_canonical(fs::absolute(output_dir, ec), ec);
  std::vector<InputFile> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p, std::string rel) {
    const fs::path canon = fs::weakly_canonical(p);
    if (!seen.insert(canon).second) return;
    files.push_back({p, std::move(rel), fs::file_size(p)});
  };
  for (const auto& in : inputs) {
    DS_CHECK(fs::exists(in), "[prepare] input '{}' does not exist", in.string());
    if (fs::is_directory(in)) {
      for (auto it = fs::recursive_directory_iterator(
               in, fs::directory_options::follow_directory_symlink);
           it != fs::recursive_directory_iterator(); ++it) {
        const auto& e = *it;
        // The output folder inside an input folder: its meta.json and splits are not input.
        if (!skip.empty() && e.is_directory(ec) && fs::weakly_canonical(e.path(), ec) == skip) {
          it.disable_recursion_pending();
          continue;
        }
        if (!e.is_regular_file()) continue;
        const std::string name = e.path().filename().string();
        if (name.starts_with(".")) continue;  // stamps, editor files
        if (!extension.empty() && !name.ends_with(extension)) continue;
        add(e.path(), fs::relative(e.path(), in).generic_string());
      }
    } else {
      add(in, in.filename().string());
    }
  }
  DS_CHECK(!files.empty(), "[prepare] no input files found{}; check the paths and --ext",
           extension.empty() ? std::string() : fmt::format(" ending in '{}'", extension));
  std::sort(files.begin(), files.end(),
            [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
  return files;
}

std::vector<bool> assign_val(const std::vector<InputFile>& files, const PrepareOptions& o,
                             std::string* rule) {
  const int rules = (o.val_fraction ? 1 : 0) + (o.val_from_year ? 1 : 0) + !o.val_files.empty();
  DS_CHECK(rules <= 1,
           "[prepare] give at most one split rule (val_fraction, val_from_year, val_files)");
  std::vector<bool> val(files.size(), false);
  std::string desc;
  if (o.val_from_year) {
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string name = files[i].path.filename().string();
      const int year = leading_year(name);
      DS_CHECK(year >= 0,
               "[prepare] --val_from_year needs file names that start with a year, but '{}' does "
               "not; use --val_files or --val_fraction instead",
               files[i].path.string());
      val[i] = year >= *o.val_from_year;
    }
    desc = fmt::format("val_from_year={}: files named from year {} on are validation",
                       *o.val_from_year, *o.val_from_year);
  } else if (!o.val_files.empty()) {
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string name = files[i].path.filename().string();
      val[i] = fnmatch(o.val_files.c_str(), name.c_str(), 0) == 0 ||
               fnmatch(o.val_files.c_str(), files[i].rel.c_str(), FNM_PATHNAME) == 0;
    }
    desc = fmt::format("val_files='{}': matching files are validation", o.val_files);
  } else {
    const double f = o.val_fraction.value_or(0.1);
    DS_CHECK(f >= 0 && f < 1, "[prepare] val_fraction must be in [0, 1), got {}", f);
    size_t n_val = static_cast<size_t>(std::ceil(f * static_cast<double>(files.size())));
    if (!o.val_fraction && files.size() < 2) n_val = 0;  // the default never takes the only file
    DS_CHECK(n_val < files.size(),
             "[prepare] val_fraction {} would put all {} files in validation; give more files or "
             "a smaller fraction",
             f, files.size());
    for (size_t i = files.size() - n_val; i < files.size(); ++i) val[i] = true;
    desc = fmt::format("val_fraction={}: the last {} of {} files in path order are validation", f,
                       n_val, files.size());
  }
  if (rule) *rule = desc;
  return val;
}

namespace {

// The corpus tokenizer: GPT-2's encoder.json + vocab.bpe (the reference encoder, memoised words),
// or any Hugging Face folder load_tokenizer reads; documents are preceded by its eos token.
struct CorpusTokenizer {
  std::optional<Tokenizer> gpt2;
  std::unique_ptr<TextTokenizer> hf;
  int32_t sep_id = -1, vocab_size = 0;
  std::string name = "gpt2";

  explicit CorpusTokenizer(const PrepareOptions& o) {
    if (fs::exists(o.tokenizer_dir / "encoder.json") || !has_tokenizer_files(o.tokenizer_dir)) {
      gpt2.emplace(Tokenizer::load_gpt2(o.tokenizer_dir));
      sep_id = gpt2->eot_id();
      vocab_size = gpt2->vocab_size();
      return;
    }
    hf = load_tokenizer(o.tokenizer_dir);
    sep_id = hf->config().eos_id;
    if (sep_id < 0) sep_id = hf->token_to_id("<|endoftext|>");  // GPT-2 files, no config
    DS_CHECK(sep_id >= 0,
             "[prepare] tokenizer folder '{}' names no eos_token (tokenizer_config.json); language-"
             "model shards put it before every document. Add \"eos_token\" there",
             o.tokenizer_dir.string());
    DS_CHECK(!o.split_on_eot,
             "[prepare] split_on_eot splits on GPT-2's <|endoftext|>; it needs the GPT-2 tokenizer "
             "folder (encoder.json + vocab.bpe), not '{}'",
             o.tokenizer_dir.string());
    vocab_size = hf->vocab_size();
    name = std::string(hf->kind());
  }

  // A file's text, preceded by the separator, appended to `tokens`; returns its documents.
  uint64_t encode(const std::string& text, std::vector<int32_t>& tokens, WordCache& cache,
                  SpecialTokens special) const {
    tokens.push_back(sep_id);
    if (!gpt2) {
      hf->encode(text, /*add_special_tokens=*/false, tokens);
      return 1;
    }
    gpt2->encode(text, tokens, cache, special);
    return std::count(tokens.begin(), tokens.end(), sep_id);
  }
};

// One file's tokens and documents.
struct FileTokens {
  std::vector<int32_t> tokens;
  uint64_t documents = 0;
};

// Counters the workers update and the progress callback reads.
struct CorpusProgress {
  std::atomic<uint64_t> bytes{0}, tokens{0}, files{0};
};

// Files [begin, end) tokenized on `caches.size()` threads (one word cache each); the first error
// stops the others and is rethrown. `tick` runs every 100 ms while they work.
std::vector<FileTokens> tokenize_chunk(const std::vector<InputFile>& files, size_t begin,
                                       size_t end, const CorpusTokenizer& tok, bool split_on_eot,
                                       std::vector<WordCache>& caches, CorpusProgress& counters,
                                       const std::function<void()>& tick) {
  const SpecialTokens special = split_on_eot ? SpecialTokens::kAllow : SpecialTokens::kAsText;
  std::vector<FileTokens> results(end - begin);
  std::atomic<size_t> next{begin};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  int running = static_cast<int>(caches.size());
  auto work = [&](int t) {
    try {
      for (size_t i; !failed && (i = next++) < end;) {
        std::string text = read_text(files[i].path);
        FileTokens& r = results[i - begin];
        if (split_on_eot && std::string_view(text).ends_with(Tokenizer::kEndOfText))
          text.resize(text.size() - Tokenizer::kEndOfText.size());
        if (!text.empty()) {
          r.tokens.reserve(text.size() / 4 + 16);
          r.documents = tok.encode(text, r.tokens, caches[static_cast<size_t>(t)], special);
        }
        counters.bytes += files[i].size;
        counters.tokens += r.tokens.size();
        ++counters.files;
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
    std::lock_guard lock(mu);
    if (--running == 0) cv.notify_all();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < static_cast<int>(caches.size()); ++t) pool.emplace_back(work, t);
  {
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return running == 0; })) {
      lock.unlock();
      tick();
      lock.lock();
    }
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  return results;
}

nlohmann::json corpus_meta(const PrepareOptions& o, const CorpusTokenizer& tok,
                           const PrepareReport& report) {
  nlohmann::json meta = {
      {"format", "DSTOKENS"},
      {"version", kShardVersion},
      {"token_dtype", token_bytes_for_vocab(tok.vocab_size) == 2 ? "uint16" : "uint32"},
      {"tokenizer", {{"name", tok.name}, {"vocab_size", tok.vocab_size}, {"eot_id", tok.sep_id}}},
      {"documents", tok.gpt2 ? "each document is preceded by the <|endoftext|> token"
                             : "each document is preceded by the tokenizer's eos token"},
      {"split_rule", report.split_rule},
      {"shard_tokens", o.shard_tokens},
      {"source_bytes", report.bytes},
      {"created_by", "ds_prepare"},
      {"splits", nlohmann::json::object()}};
  if (report.train.tokens > 0) meta["splits"]["train"] = split_json(report.train);
  if (report.val.tokens > 0) meta["splits"]["val"] = split_json(report.val);
  return meta;
}

}  // namespace

PrepareReport prepare_corpus(const PrepareOptions& o) {
  check_output_outside_inputs(o.inputs, o.output_dir, "prepare");
  const std::vector<InputFile> files = list_inputs(o.inputs, o.extension, o.output_dir);
  PrepareReport report;
  const std::vector<bool> is_val = assign_val(files, o, &report.split_rule);
  const CorpusTokenizer tok(o);
  DS_CHECK(!o.output_dir.empty(), "[prepare] no output folder given");
  fs::create_directories(o.output_dir);
  const auto vocab = static_cast<uint32_t>(tok.vocab_size);
  SplitWriter train("train", o.output_dir, o.shard_tokens, vocab);
  SplitWriter val("val", o.output_dir, o.shard_tokens, vocab);
  report.threads = o.threads > 0
                       ? o.threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<WordCache> caches(static_cast<size_t>(report.threads));
  PrepareProgress progress;
  progress.files_total = files.size();
  for (const auto& f : files) progress.bytes_total += f.size;
  CorpusProgress counters;
  const auto t0 = Clock::now();
  auto report_progress = [&] {
    if (!o.on_progress) return;
    progress.bytes_done = counters.bytes.load();
    progress.tokens = counters.tokens.load();
    progress.files_done = counters.files.load();
    progress.seconds = seconds_since(t0);
    o.on_progress(progress);
  };
  for (size_t begin = 0; begin < files.size();) {
    // Chunk [begin, end): at least one file, at most about kChunkBytes.
    size_t end = begin;
    uint64_t chunk_bytes = 0;
    while (end < files.size() && (end == begin || chunk_bytes + files[end].size <= kChunkBytes))
      chunk_bytes += files[end++].size;
    std::vector<FileTokens> results =
        tokenize_chunk(files, begin, end, tok, o.split_on_eot, caches, counters, report_progress);
    // Write in file order: the output is independent of which thread finished first.
    for (size_t i = begin; i < end; ++i) {
      FileTokens& r = results[i - begin];
      if (r.tokens.empty()) continue;
      (is_val[i] ? val : train).write_document(r.tokens, r.documents);
      std::vector<int32_t>().swap(r.tokens);
    }
    begin = end;
  }
  report.train = train.finish();
  report.val = val.finish();
  report.bytes = progress.bytes_total;
  report.seconds = seconds_since(t0);
  report_progress();
  report.meta = o.output_dir / "meta.json";
  ds::write_file_atomic(report.meta, corpus_meta(o, tok, report).dump(2) + "\n");
  return report;
}

}  // namespace ds::data
