#include "ds/train/train_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/runtime/checkpoint_files.h"

namespace ds::train {

namespace fs = std::filesystem;

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

namespace {
int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(k, 0) != 0) continue;
    try {
      return std::stoll(line.substr(k.size()));  // "  123456 kB"
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}
}  // namespace

int64_t peak_rss_bytes() {
  return status_kib("VmHWM") * 1024;
}
int64_t current_rss_bytes() {
  return status_kib("VmRSS") * 1024;
}

std::vector<fs::path> checkpoint_folders(const fs::path& dir) {
  static const std::regex re(R"(global_step(\d+))");
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, re))
      found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [n, p] : found) out.push_back(std::move(p));
  return out;
}

std::string latest_tag(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string tag;
  if (!in || !std::getline(in, tag)) return "";
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  return tag;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& dir, int64_t keep,
                                         const std::vector<std::string>& keep_always) {
  std::vector<fs::path> deleted;
  if (keep <= 0) return deleted;
  std::vector<fs::path> all;
  for (auto& p : checkpoint_folders(dir))
    if (std::find(keep_always.begin(), keep_always.end(), p.filename().string()) ==
        keep_always.end())
      all.push_back(std::move(p));
  const std::string newest_good = latest_tag(dir);
  // Count the protected one among those kept: with keep = 1 only the checkpoint in `latest`
  // survives, whatever its number.
  int64_t excess = static_cast<int64_t>(all.size()) - keep;
  for (const auto& p : all) {
    if (excess <= 0) break;
    if (p.filename().string() == newest_good) continue;
    runtime::delete_checkpoint(dir, p.filename().string());
    deleted.push_back(p);
    --excess;
  }
  return deleted;
}

fs::path export_folder(const Options& o) {
  if (o.export_hf == "none") return {};
  return o.export_hf.empty() ? fs::path(o.output_dir) / "hf_model" : fs::path(o.export_hf);
}

std::vector<fs::path> remove_stale_temporaries(const fs::path& out_dir,
                                               const fs::path& export_dir) {
  std::vector<fs::path> removed = runtime::remove_stale_checkpoint_temporaries(out_dir);
  // Our writers' temporary names: write_file_atomic's "<name>.tmp-<pid>", safetensors' and the HF
  // export's "<name>.tmp.<pid>", and the older "<name>.tmp".
  static const std::regex temp_name(R"(.+\.tmp([-.]\d+)?)");
  std::vector<fs::path> folders = {out_dir};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec))
    if (e.is_directory(ec) && e.path().filename().string()[0] != '.') folders.push_back(e.path());
  if (!export_dir.empty() && fs::is_directory(export_dir, ec)) folders.push_back(export_dir);
  for (const auto& folder : folders) {
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(folder, ec))
      if (e.is_regular_file(ec) && std::regex_match(e.path().filename().string(), temp_name))
        stale.push_back(e.path());
    for (const auto& p : stale) {
      fs::remove(p, ec);
      DS_CHECK(!ec, "[ds_train] cannot delete the stale temporary {}: {}", p.string(),
               ec.message());
      removed.push_back(p);
    }
  }
  return removed;
}

namespace {

// "a seq2seq run's (an encoder-decoder trained on a seq2seq set)", by ds_train.task.
std::string task_run_words(const std::string& task) {
  if (task == "classification")
    return "an encoder classifier run's (trained on a classification set)";
  if (task == "seq2seq") return "an encoder-decoder run's (trained on a seq2seq set)";
  if (task == "lm") return "a language-model run's (trained on token shards or an SFT set)";
  return fmt::format("a '{}' run's", task);
}

}  // namespace

void check_checkpoint_task(const fs::path& dir, const std::string& tag, const std::string& task,
                           const std::string& train_data) {
  std::string have;
  fs::path folder;
  try {
    std::string t = tag;
    if (t.empty()) t = latest_tag(dir);
    if (t.empty()) return;
    folder = dir / t;
    const safetensors::Reader r((folder / "mp_rank_00_model_states.safetensors").string());
    const auto it = r.metadata().find("ds_engine");
    if (it == r.metadata().end()) return;
    const nlohmann::json engine = nlohmann::json::parse(it->second);
    const nlohmann::json& d = engine.at("client_state").at("ds_train");
    if (!d.is_object()) return;
    have = d.value("task", std::string("lm"));
  } catch (const std::exception&) {
    return;  // not ours to judge: the load names what is wrong
  }
  DS_CHECK(have == task,
           "[ds_train] the checkpoint {} is {}, but --train_data {} is a {} set: resume it "
           "with data of its kind, or start a new run in another --output_dir",
           folder.string(), task_run_words(have), train_data,
           task == "lm" ? "language-model" : task);
}

UnigramStats unigram_stats(const data::TokenDataset& ds, uint64_t max_tokens) {
  UnigramStats s;
  const uint64_t n = std::min<uint64_t>(ds.num_tokens(), max_tokens);
  std::vector<uint64_t> counts(ds.vocab_size(), 0);
  std::vector<int32_t> buf(1 << 20), mask(ds.is_sft() ? buf.size() : 0);
  uint64_t counted = 0;
  for (uint64_t start = 0; start < n; start += buf.size()) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - start));
    ds.read_tokens(start, std::span<int32_t>(buf.data(), len));
    if (ds.is_sft()) ds.read_mask(start, std::span<int32_t>(mask.data(), len));
    for (size_t i = 0; i < len; ++i) {
      if (ds.is_sft() && mask[i] == 0) continue;
      ++counts[static_cast<size_t>(buf[i])];
      ++counted;
    }
  }
  double h = 0.0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    ++s.distinct;
    const double p = static_cast<double>(c) / static_cast<double>(counted);
    h -= p * std::log(p);
  }
  s.entropy_nats = h;
  s.tokens = counted;
  s.scanned = n;
  s.counts = std::move(counts);
  return s;
}

double unigram_cross_entropy(const UnigramStats& model, const UnigramStats& data) {
  const double V = static_cast<double>(std::max(model.counts.size(), data.counts.size()));
  const double denom = static_cast<double>(model.tokens) + 0.5 * V;
  double sum = 0.0;
  for (size_t id = 0; id < data.counts.size(); ++id) {
    if (data.counts[id] == 0) continue;
    const double c = id < model.counts.size() ? static_cast<double>(model.counts[id]) : 0.0;
    sum -= static_cast<double>(data.counts[id]) * std::log((c + 0.5) / denom);
  }
  return data.tokens > 0 ? sum / static_cast<double>(data.tokens) : 0.0;
}

}  // namespace ds::train
