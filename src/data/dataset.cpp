#include "ds/data/dataset.h"

#include <algorithm>
#include <array>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/data/set_file.h"

namespace ds::data {

namespace fs = std::filesystem;

namespace {

// Copy values [start, start + out.size()) of the stream that `shards` form (shard k starting at
// starts[k]) into out.
void read_stream(const std::vector<Shard>& shards, const std::vector<uint64_t>& starts,
                 uint64_t start, std::span<int32_t> out) {
  // Shard holding `start`: the last one starting at or before it (skipping empty shards).
  size_t k = std::upper_bound(starts.begin(), starts.end(), start) - starts.begin() - 1;
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = start + done;
    while (pos - starts[k] >= shards[k].num_tokens()) ++k;
    const uint64_t offset = pos - starts[k];
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(out.size() - done, shards[k].num_tokens() - offset));
    shards[k].read(offset, out.subspan(done, n));
    done += n;
  }
}

}  // namespace

TokenDataset::TokenDataset(const std::vector<fs::path>& files,
                           const std::vector<fs::path>& mask_files, size_t sft_seq_len,
                           bool verify_checksums)
    : TokenDataset(files, verify_checksums) {
  DS_CHECK(sft_seq_len > 0, "[dataset] an SFT set needs a positive sequence length");
  DS_CHECK(!mask_files.empty(),
           "[dataset] an SFT set needs its mask shards; re-run ds_prepare --sft");
  uint64_t n = 0;
  for (const auto& f : mask_files) {
    Shard s = Shard::open(f, verify_checksums);
    DS_CHECK(s.is_mask(),
             "[dataset] '{}' is not a mask shard (its header lacks the mask flag); re-run "
             "ds_prepare --sft",
             f.string());
    mask_starts_.push_back(n);
    n += s.num_tokens();
    masks_.push_back(std::move(s));
  }
  DS_CHECK(n == total_tokens_,
           "[dataset] the mask shards hold {} values but the token shards {} tokens ('{}'); the "
           "set is incomplete, re-run ds_prepare --sft",
           n, total_tokens_, mask_files.front().string());
  DS_CHECK(total_tokens_ % (sft_seq_len + 1) == 0,
           "[dataset] {} tokens is not a whole number of examples of {} tokens (seq_len {} + 1) "
           "('{}'); re-run ds_prepare --sft",
           total_tokens_, sft_seq_len + 1, sft_seq_len, files.front().string());
  sft_seq_len_ = sft_seq_len;
}

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
  DS_CHECK(!meta.is_object() || meta.value("kind", std::string()) != "classification",
           "[dataset] '{}' is a classification set (ds_prepare --task classification), not "
           "language-model tokens: it trains an encoder classifier (ds_train --init_from an "
           "encoder folder: bert, roberta, deberta-v2; or --model bert-tiny; docs/training.md)",
           meta_path.string());
  DS_CHECK(!meta.is_object() || !meta.contains("kind"),
           "[dataset] '{}' holds {}, not language-model tokens: train it on its own (ds_train "
           "--train_data), or prepare language-model tokens with ds_prepare",
           meta_path.string(), set_kind_words(meta));
  const auto& splits = meta.value("splits", nlohmann::json::object());
  if (!splits.contains(std::string(split))) {
    std::vector<std::string> have;
    for (const auto& [k, v] : splits.items()) have.push_back(k);
    DS_THROW(
        "[dataset] '{}' has no split '{}' (it has: {}); check the split rule given to "
        "ds_prepare",
        meta_path.string(), split, fmt::join(have, ", "));
  }
  std::vector<fs::path> files, mask_files;
  const auto& entry = splits[std::string(split)];
  for (const auto& f : entry.at("files")) files.push_back(dir / f.get<std::string>());
  if (!meta.contains("sft")) return TokenDataset(files, verify_checksums);
  const auto& sft = meta["sft"];
  DS_CHECK(sft.is_object() && sft.contains("seq_len") && sft["seq_len"].is_number_unsigned() &&
               entry.contains("mask_files"),
           "[dataset] '{}': the \"sft\" entry needs \"seq_len\" and split '{}' needs "
           "\"mask_files\"; re-run ds_prepare --sft",
           meta_path.string(), split);
  for (const auto& f : entry["mask_files"]) mask_files.push_back(dir / f.get<std::string>());
  return TokenDataset(files, mask_files, sft["seq_len"].get<size_t>(), verify_checksums);
}

void TokenDataset::check_seq_len(size_t seq_len) const {
  DS_CHECK(seq_len > 0, "[dataset] sequence length must be positive");
  DS_CHECK(sft_seq_len_ == 0 || seq_len == sft_seq_len_,
           "[dataset] this SFT set was prepared with --seq_len {} (examples of {} tokens), but the "
           "sequence length asked for is {}; train with --block_size {}, or re-run ds_prepare "
           "--sft ... --seq_len {}",
           sft_seq_len_, sft_seq_len_ + 1, seq_len, sft_seq_len_, seq_len);
}

uint64_t TokenDataset::num_samples(size_t seq_len) const {
  check_seq_len(seq_len);
  if (sft_seq_len_ > 0) return total_tokens_ / (seq_len + 1);
  return total_tokens_ == 0 ? 0 : (total_tokens_ - 1) / seq_len;
}

void TokenDataset::read_tokens(uint64_t start, std::span<int32_t> out) const {
  DS_CHECK(start <= total_tokens_ && out.size() <= total_tokens_ - start,
           "[dataset] tokens [{}, {}) are past the end of the dataset ({} tokens)", start,
           start + out.size(), total_tokens_);
  read_stream(shards_, starts_, start, out);
}

void TokenDataset::read_mask(uint64_t start, std::span<int32_t> out) const {
  DS_CHECK(!masks_.empty(), "[dataset] this is not an SFT set: it has no mask");
  DS_CHECK(start <= total_tokens_ && out.size() <= total_tokens_ - start,
           "[dataset] mask values [{}, {}) are past the end of the dataset ({} tokens)", start,
           start + out.size(), total_tokens_);
  read_stream(masks_, mask_starts_, start, out);
}

void TokenDataset::get(uint64_t i, size_t seq_len, std::span<int32_t> inputs,
                       std::span<int32_t> targets) const {
  const uint64_t n = num_samples(seq_len);
  DS_CHECK(i < n, "[dataset] sample {} is out of range: {} samples of length {}", i, n, seq_len);
  DS_CHECK(inputs.size() == seq_len && targets.size() == seq_len,
           "[dataset] buffers hold {} and {} tokens, expected {} each", inputs.size(),
           targets.size(), seq_len);
  if (sft_seq_len_ > 0) {
    // Example i: tokens [s, s + T + 1); targets whose token is masked out are ignored (-100).
    const uint64_t s = i * (seq_len + 1);
    read_tokens(s, inputs);
    read_tokens(s + 1, targets);
    // The targets' mask in chunks through a stack buffer: no allocation per sample.
    std::array<int32_t, 256> mask;
    for (size_t t0 = 0; t0 < seq_len; t0 += mask.size()) {
      const size_t n = std::min(mask.size(), seq_len - t0);
      read_mask(s + 1 + t0, std::span<int32_t>(mask.data(), n));
      for (size_t t = 0; t < n; ++t)
        if (mask[t] == 0) targets[t0 + t] = -100;
    }
    return;
  }
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
  for (const auto& s : masks_) s.verify();
}

}  // namespace ds::data
