#pragma once
// XXH64 (xxHash, 64-bit, seed 0 by default): the checksum of token shards and checkpoint files. Chosen because
// it runs at memory speed (a multi-GB corpus verifies in about a second per GB) and has published
// test vectors, so a shard can be checked by any xxhash implementation (e.g. `xxh64sum`).
#include <cstddef>
#include <cstdint>

namespace ds {

// Streaming form: update() any number of times, then digest() (which does not reset the state).
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t len);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_len_ = 0;
  unsigned char buf_[32];
  size_t buf_len_ = 0;
};

// One-shot form.
uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0);

}  // namespace ds
