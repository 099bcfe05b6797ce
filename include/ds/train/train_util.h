#pragma once
// Pieces of the trainer that are not the training loop: human-readable numbers, process memory,
// checkpoint rotation, corpus statistics.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ds/data/dataset.h"
#include "ds/train/options.h"

namespace ds::train {

// ---- formatting ----
std::string human_count(double n);           // 1234567 -> "1.23M"
std::string human_duration(double seconds);  // "45s", "3m05s", "1h02m"
std::string mib(int64_t bytes);              // "61.4 MiB"

// ---- process ----
int64_t peak_rss_bytes();     // VmHWM of /proc/self/status; 0 when unavailable
int64_t current_rss_bytes();  // VmRSS

// ---- checkpoints ----
// The global_step<N> folders under dir, oldest (smallest N) first.
std::vector<std::filesystem::path> checkpoint_folders(const std::filesystem::path& dir);
// The tag named by dir/latest, or "" when there is none.
std::string latest_tag(const std::filesystem::path& dir);
// Deletes the oldest global_step<N> folders so that at most `keep` of those not in `keep_always`
// remain, never the one named in dir/latest (the newest good checkpoint) and never one named in
// `keep_always` (an earlier run's checkpoints, which this run did not write). Each is renamed away
// before it is removed, so a crash never leaves a half-deleted tag folder. Returns the folders
// deleted.
std::vector<std::filesystem::path> rotate_checkpoints(
    const std::filesystem::path& dir, int64_t keep,
    const std::vector<std::string>& keep_always = {});

// Deletes what an interrupted run left in its output folder: the checkpoint temporaries
// (runtime::remove_stale_checkpoint_temporaries) and ds_train's own half-written files
// ("<name>.tmp", "<name>.tmp-<pid>", "<name>.tmp.<pid>") in out_dir, its csv folders and
// export_dir (skipped when empty). Returns what it deleted.
std::vector<std::filesystem::path> remove_stale_temporaries(
    const std::filesystem::path& out_dir, const std::filesystem::path& export_dir);

// Refuses to resume the checkpoint dir/<tag or latest> with data of another task kind, before
// anything is loaded (a load would fail first, on the other kind's tensors): `task` is this run's
// ("lm", "classification", "seq2seq"; an LM checkpoint records none). Reads only the model-states
// file's metadata; a checkpoint it cannot read is left to the load's own errors.
void check_checkpoint_task(const std::filesystem::path& dir, const std::string& tag,
                           const std::string& task, const std::string& train_data);

// The export folder of a run: --export_hf, else output_dir/hf_model; "" for --export_hf none.
std::filesystem::path export_folder(const Options& o);

// ---- data ----
struct UnigramStats {
  double entropy_nats = 0.0;     // H = -sum p ln p over token frequencies
  uint64_t tokens = 0;           // tokens counted (a prefix of the stream when it is huge)
  uint64_t scanned = 0;          // stream tokens read (more than `tokens` for an SFT set)
  uint64_t distinct = 0;         // distinct ids seen
  std::vector<uint64_t> counts;  // per id
};
// Entropy of the token distribution over the first max_tokens tokens: the loss of the best model
// that ignores context, so a language model must go well below it to have learned anything.
// An SFT set counts only its trained tokens (mask 1): the loss is measured on those alone.
UnigramStats unigram_stats(const data::TokenDataset& ds, uint64_t max_tokens = 1ull << 26);
// The loss on `data` of the context-free model fitted on `model` (add-0.5 smoothing, so ids the
// model never saw cost a finite amount): the baseline for eval loss, which sees other text.
double unigram_cross_entropy(const UnigramStats& model, const UnigramStats& data);

// Seconds since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ds::train
