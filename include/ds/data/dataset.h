#pragma once
// A token dataset: one or more shards (see shard.h) read through mmap as one concatenated stream
// of N tokens. Nothing is read up front beyond the 64-byte headers; a sample touches only the
// pages that hold its tokens, so corpora far larger than memory work.
//
// Samples for a sequence length T are non-overlapping windows of T + 1 tokens:
//   sample i = tokens [i*T, i*T + T + 1)    inputs = first T, targets = last T (shifted by one)
//   num_samples(T) = (N - 1) / T            the last window ends at or before token N
// Windows may cross shard boundaries (shards are just pieces of one stream).
//
// Supervised fine-tuning sets (ds_prepare --sft, sft.h) are different: the stream is a sequence of
// fixed-length examples of T_sft + 1 tokens each, with a parallel mask stream (mask shards, one
// byte per token), and
//   sample i = example i = tokens [i*(T+1), (i+1)*(T+1))   (T must equal T_sft; anything else is
//                                                          an error naming both lengths)
//   targets[t] = tokens[i*(T+1) + t + 1], or -100 where that token's mask is 0 (prompt, padding)
//   num_samples(T) = N / (T + 1)
// so a sample never spans two examples and no example sees another one's tokens.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "ds/data/shard.h"

namespace ds::data {

struct Sample {
  std::vector<int32_t> inputs;   // (T,)
  std::vector<int32_t> targets;  // (T,)
};

class TokenDataset {
 public:
  // The shards in `files`, concatenated in the given order. All must share one vocab_size.
  // verify_checksums reads every shard once to check its payload checksum: recommended after
  // copying a corpus, but it costs a full read (about a second per GB), so it is off by default;
  // headers and file sizes are always checked.
  explicit TokenDataset(const std::vector<std::filesystem::path>& files,
                        bool verify_checksums = false);
  // An SFT set: token shards, their mask shards (kShardFlagMask; the two streams must have the
  // same length, a multiple of sft_seq_len + 1) and the sequence length it was prepared for.
  TokenDataset(const std::vector<std::filesystem::path>& files,
               const std::vector<std::filesystem::path>& mask_files, size_t sft_seq_len,
               bool verify_checksums = false);

  // The split `split` ("train", "val") of a folder written by ds_prepare, via its meta.json (an
  // SFT set when meta.json has an "sft" entry).
  static TokenDataset open_split(const std::filesystem::path& dir, std::string_view split,
                                 bool verify_checksums = false);

  uint64_t num_tokens() const { return total_tokens_; }
  uint32_t vocab_size() const { return vocab_size_; }
  // (N - 1) / T non-overlapping windows; 0 when the dataset is shorter than T + 1 tokens.
  // SFT sets: N / (T + 1) examples; throws when T is not the prepared sequence length.
  uint64_t num_samples(size_t seq_len) const;
  // The sequence length an SFT set was prepared for; 0 for plain token streams.
  size_t sft_seq_len() const { return sft_seq_len_; }
  bool is_sft() const { return sft_seq_len_ > 0; }
  // Throws ds::Error naming both lengths when this is an SFT set prepared for another length.
  void check_seq_len(size_t seq_len) const;

  // Copy tokens [start, start + out.size()) of the concatenated stream into out.
  void read_tokens(uint64_t start, std::span<int32_t> out) const;
  // Copy mask values (0/1) [start, start + out.size()) of an SFT set's mask stream into out.
  void read_mask(uint64_t start, std::span<int32_t> out) const;
  // Sample i for sequence length T into caller buffers of T ints each (SFT sets: ignored targets
  // are -100).
  void get(uint64_t i, size_t seq_len, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  Sample get(uint64_t i, size_t seq_len) const;

  const std::vector<Shard>& shards() const { return shards_; }
  const std::vector<Shard>& mask_shards() const { return masks_; }
  void verify() const;

 private:
  std::vector<Shard> shards_;
  std::vector<uint64_t> starts_;  // starts_[k]: index of shard k's first token in the stream
  uint64_t total_tokens_ = 0;
  uint32_t vocab_size_ = 0;
  std::vector<Shard> masks_;           // SFT: mask shards, a stream of total_tokens_ values
  std::vector<uint64_t> mask_starts_;  // like starts_, for masks_
  size_t sft_seq_len_ = 0;             // 0: a plain token stream
};

}  // namespace ds::data
