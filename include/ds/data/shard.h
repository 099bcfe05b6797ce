#pragma once
// Token shards: a flat file of token ids behind a 64-byte header, read through mmap.
//
// Layout (little-endian; version 1):
//   offset size  field
//        0    8  magic            "DSTOKENS"
//        8    4  version          1
//       12    4  token_bytes      2 (uint16 ids, vocab_size <= 65536) or 4 (uint32 ids);
//                                 1 in a mask shard (see flags)
//       16    8  num_tokens
//       24    4  vocab_size       every id is < vocab_size
//       28    4  flags            0 for token shards; kShardFlagMask (1) for a loss-mask shard:
//                                 one byte per token, 0 or 1, vocab_size 2 (SFT data, sft.h);
//                                 other bits are reserved and refused
//       32    8  payload_checksum XXH64 (seed 0) of the num_tokens * token_bytes payload bytes
//       40    8  num_documents    how many documents the writer was told about (informational)
//       48    8  reserved         0
//       56    8  header_checksum  XXH64 (seed 0) of bytes [0, 56)
//       64       payload          num_tokens ids; the file size is exactly 64 + payload
// The header checksum and the exact file size are checked on every open (cheap); the payload
// checksum only on request (Shard::verify), since it means reading the whole file.
//
// Files are written atomically: to "<path>.tmp-<pid>", fsync'd, renamed over <path>, and the
// folder fsync'd, so a crash never leaves a truncated shard under the final name.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "ds/core/checksum.h"

namespace ds::data {

inline constexpr char kShardMagic[8] = {'D', 'S', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;
// Header flag of a loss-mask shard: value i is 1 when token i of the parallel token shard is
// trained as a target, 0 when its target is ignored (-100). token_bytes 1, vocab_size 2.
inline constexpr uint32_t kShardFlagMask = 1;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t num_tokens;
  uint32_t vocab_size;
  uint32_t flags;
  uint64_t payload_checksum;
  uint64_t num_documents;
  uint64_t reserved;
  uint64_t header_checksum;
};
static_assert(sizeof(ShardHeader) == kShardHeaderBytes);

// 2 when every id of a vocab_size vocabulary fits in uint16, else 4.
inline uint32_t token_bytes_for_vocab(uint64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

// Streams tokens into a new shard. Nothing appears under `path` until finish() returns; a writer
// destroyed without finish() (an exception on the way) removes its temporary file.
class ShardWriter {
 public:
  ShardWriter(std::filesystem::path path, uint32_t vocab_size);
  // A writer with header flags: kShardFlagMask writes a mask shard (1 byte per value, values 0/1;
  // vocab_size must be 2).
  ShardWriter(std::filesystem::path path, uint32_t vocab_size, uint32_t flags);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Append tokens; throws if one is outside [0, vocab_size).
  void write(std::span<const int32_t> tokens);
  // Count n more documents in the header's num_documents.
  void add_documents(uint64_t n) { num_documents_ += n; }
  // Write the header, fsync, rename into place. Returns the final header.
  ShardHeader finish();

  uint64_t num_tokens() const { return num_tokens_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void flush();

  std::filesystem::path path_, tmp_path_;
  int fd_ = -1;
  uint32_t vocab_size_;
  uint32_t token_bytes_;
  uint32_t flags_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t num_documents_ = 0;
  std::vector<unsigned char> buf_;
  size_t buf_used_ = 0;
  Xxh64 checksum_;
};

// Write a whole shard in one call.
ShardHeader write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens,
                        uint32_t vocab_size, uint64_t num_documents = 0);

// A read-only, memory-mapped shard. Only the pages a reader touches are brought into memory.
class Shard {
 public:
  // Maps the file and validates its header (magic, version, header checksum, size); with
  // verify_checksum also reads the payload once to check it. Errors name the file.
  static Shard open(const std::filesystem::path& path, bool verify_checksum = false);
  Shard(Shard&& other) noexcept;
  Shard& operator=(Shard&& other) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  // Recompute the payload checksum; throws ds::Error naming the file on a mismatch.
  void verify() const;

  // Copy tokens [start, start + out.size()) into out, widened to int32.
  void read(uint64_t start, std::span<int32_t> out) const;
  int32_t at(uint64_t i) const;

  const ShardHeader& header() const { return header_; }
  uint64_t num_tokens() const { return header_.num_tokens; }
  uint32_t vocab_size() const { return header_.vocab_size; }
  bool is_mask() const { return (header_.flags & kShardFlagMask) != 0; }
  const std::filesystem::path& path() const { return path_; }
  // The mapped payload (num_tokens ids of header().token_bytes each).
  const void* payload() const {
    return static_cast<const unsigned char*>(map_) + kShardHeaderBytes;
  }

 private:
  Shard() = default;
  std::filesystem::path path_;
  ShardHeader header_{};
  void* map_ = nullptr;
  size_t map_len_ = 0;
};


}  // namespace ds::data
