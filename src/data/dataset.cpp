#include "ds/data/dataset.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::data {

namespace fs = std::filesystem;

TokenDataset::TokenDataset(const std::vector<fs::path>& files, bool verify_checksums) {
  DS_CHECK(!files.empty(), "[dataset] no shard files given; create them with ds_prepare");
  shards_.reserve(files.size());
  for (const auto& f : files) {
    Shard s = Shard::open(f, verify_checksums);
    if (shards_.empty()) vocab_size_ = s.vocab_size();
    DS_CHECK(s.vocab_size() == vocab_size_,
             "[dataset] '{}' has vocab_size {} but '{}' has {}; shards of one dataset must come "
             "from the same tokenizer",
             f.string(), s.vocab_size(), files.front().string(), vocab_size_);
    starts_.push_back(total_tokens_);
    total_tokens_ += s.num_tokens();
    shards_.push_back(std::move(s));
  }
}

TokenDataset TokenDataset::open_split(const fs::path& dir, std::string_view split,
                                      bool verify_checksums) {
  const fs::path meta_path = dir / "meta.json";
  std::ifstream in(meta_path);
  DS_CHECK(in.good(), "[dataset] cannot open '{}'; prepare the corpus with ds_prepare --output {}",
           meta_path.string(), dir.string());
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[dataset] '{}' is not valid JSON ({}); re-run ds_prepare", meta_path.string(),
             e.what());
  }
  const auto& splits = meta.value("splits", nlohmann::json::object());
  if (!splits.contains(std::string(split))) {
    std::vector<std::string> have;
    for (const auto& [k, v] : splits.items()) have.push_back(k);
    DS_THROW(
        "[dataset] '{}' has no split '{}' (it has: {}); check the split rule given to "
        "ds_prepare",
        meta_path.string(), split, fmt::join(have, ", "));
  }
  std::vector<fs::path> files;
  for (const auto& f : splits[std::string(split)].at("files"))
    files.push_back(dir / f.get<std::string>());
  return TokenDataset(files, verify_checksums);
}

uint64_t TokenDataset::num_samples(size_t seq_len) const {
  DS_CHECK(seq_len > 0, "[dataset] sequence length must be positive");
  return total_tokens_ == 0 ? 0 : (total_tokens_ - 1) / seq_len;
}

void TokenDataset::read_tokens(uint64_t start, std::span<int32_t> out) const {
  DS_CHECK(start <= total_tokens_ && out.size() <= total_tokens_ - start,
           "[dataset] tokens [{}, {}) are past the end of the dataset ({} tokens)", start,
           start + out.size(), total_tokens_);
  // Shard holding `start`: the last one starting at or before it (skipping empty shards).
  size_t k = std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1;
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = start + done;
    while (pos - starts_[k] >= shards_[k].num_tokens()) ++k;
    const uint64_t offset = pos - starts_[k];
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(out.size() - done, shards_[k].num_tokens() - offset));
    shards_[k].read(offset, out.subspan(done, n));
    done += n;
  }
}

void TokenDataset::get(uint64_t i, size_t seq_len, std::span<int32_t> inputs,
                       std::span<int32_t> targets) const {
  const uint64_t n = num_samples(seq_len);
  DS_CHECK(i < n, "[dataset] sample {} is out of range: {} samples of length {}", i, n, seq_len);
  DS_CHECK(inputs.size() == seq_len && targets.size() == seq_len,
           "[dataset] buffers hold {} and {} tokens, expected {} each", inputs.size(),
           targets.size(), seq_len);
  // One read of T + 1 tokens: the first T are inputs, targets are the same window shifted by one.
  read_tokens(i * seq_len, inputs);
  std::copy(inputs.begin() + 1, inputs.end(), targets.begin());
  read_tokens(i * seq_len + seq_len, targets.subspan(seq_len - 1, 1));
}

Sample TokenDataset::get(uint64_t i, size_t seq_len) const {
  Sample s{std::vector<int32_t>(seq_len), std::vector<int32_t>(seq_len)};
  get(i, seq_len, s.inputs, s.targets);
  return s;
}

void TokenDataset::verify() const {
  for (const auto& s : shards_) s.verify();
}

}  // namespace ds::data
