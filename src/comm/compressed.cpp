// The 1-bit compressed all-reduce with error feedback (include/ds/comm/compressed.h).
#include "ds/comm/compressed.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::comm {
namespace compressed {
namespace {

constexpr int64_t kTile = 65536;  // elements per tile (a multiple of 32: tiles own whole words)

int64_t tiles(int64_t n) {
  return (n + kTile - 1) / kTile;
}

void for_tiles(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for(tiles(n), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) fn(t * kTile, std::min(n, (t + 1) * kTile));
  });
}

}  // namespace

float scale_of(const float* x, int64_t n) {
  if (n == 0) return 0.0f;
  std::vector<double> part(static_cast<size_t>(tiles(n)), 0.0);
  for_tiles(n, [&](int64_t b, int64_t e) {
    double s = 0.0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    part[static_cast<size_t>(b / kTile)] = s;
  });
  double total = 0.0;
  for (double s : part) total += s;
  return static_cast<float>(std::sqrt(total) / std::sqrt(static_cast<double>(n)));
}

void compress(const float* x, int64_t n, float scale, int32_t* bits, float* error) {
  DS_CHECK(n % 32 == 0, "[comm] compress: {} elements is not a multiple of 32", n);
  for_tiles(n, [&](int64_t b, int64_t e) {
    for (int64_t w = b / 32; w < e / 32; ++w) {
      uint32_t word = 0;
      for (int j = 0; j < 32; ++j) {
        const float v = x[w * 32 + j];
        const bool pos = !(v < 0.0f);  // torch: sign(x) + 1 -> bool; 0 and NaN count as +1
        word |= static_cast<uint32_t>(pos) << j;
        error[w * 32 + j] = v - (pos ? scale : -scale);
      }
      bits[w] = std::bit_cast<int32_t>(word);
    }
  });
}

void decompress(const int32_t* bits, int64_t n, float scale, float* out) {
  for_tiles(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const bool pos = (std::bit_cast<uint32_t>(bits[i / 32]) >> (i % 32)) & 1u;
      out[i] = pos ? scale : -scale;
    }
  });
}

}  // namespace compressed

int64_t CompressedAllReduce::padded_numel(int64_t n, int ranks) {
  const int64_t m = 32 * static_cast<int64_t>(ranks);
  return (n + m - 1) / m * m;
}

CompressedAllReduce::CompressedAllReduce(std::shared_ptr<Group> group, int64_t numel)
    : group_(std::move(group)), numel_(numel) {
  DS_CHECK(group_ != nullptr, "[comm] compressed all-reduce: null group");
  DS_CHECK(numel >= 0, "[comm] compressed all-reduce: negative size {}", numel);
  const int n = group_->size();
  padded_ = padded_numel(numel, n);
  chunk_ = padded_ / n;
  words_ = chunk_ / 32 + 1;
  send_.resize(static_cast<size_t>(words_ * n));
  recv_.resize(static_cast<size_t>(words_ * n));
  y_.resize(static_cast<size_t>(chunk_));
}

void CompressedAllReduce::run(float* buf, float* worker_error, float* server_error,
                              std::string_view ctx) {
  if (numel_ == 0) return;
  const int n = group_->size();
  const size_t w = static_cast<size_t>(words_);
  // Worker: compensate, compress, send chunk j of the bits with the scale to rank j. The
  // compensated buffer is built in worker_error itself (the padding is 0 + error already), which
  // compress() then overwrites element by element with the new error: no (padded,) scratch.
  float* x = worker_error;
  parallel_for(numel_, 65536, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = buf[i] + x[i];
  });
  const float s = compressed::scale_of(x, padded_);
  for (int r = 0; r < n; ++r) {
    int32_t* msg = send_.data() + r * w;
    compressed::compress(x + r * chunk_, chunk_, s, msg, worker_error + r * chunk_);
    msg[w - 1] = std::bit_cast<int32_t>(s);
  }
  group_->all_to_all(send_.data(), recv_.data(), w, DType::i32,
                     fmt::format("{} compressed all_to_all", ctx));
  // Server: average this rank's chunk over the workers, compensate, compress again.
  float* y = y_.data();
  std::vector<float> weight(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    weight[static_cast<size_t>(r)] = std::bit_cast<float>(recv_[r * w + w - 1]) * (1.0f / n);
  parallel_for(chunk_, 65536, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      float acc = 0.0f;
      for (int r = 0; r < n; ++r) {
        const bool pos = (std::bit_cast<uint32_t>(recv_[r * w + k / 32]) >> (k % 32)) & 1u;
        acc += pos ? weight[static_cast<size_t>(r)] : -weight[static_cast<size_t>(r)];
      }
      y[k] = acc + server_error[k];
    }
  });
  const float t = compressed::scale_of(y, chunk_);
  int32_t* mine = send_.data() + static_cast<size_t>(group_->rank()) * w;
  compressed::compress(y, chunk_, t, mine, server_error);
  mine[w - 1] = std::bit_cast<int32_t>(t);
  group_->all_gather(mine, recv_.data(), w, DType::i32,
                     fmt::format("{} compressed all_gather", ctx));
  // Every rank decompresses every server's chunk (the tail past numel is padding).
  for (int r = 0; r < n; ++r) {
    const int64_t begin = r * chunk_;
    if (begin >= numel_) break;
    const int32_t* msg = recv_.data() + r * w;
    const int64_t len = std::min(chunk_, numel_ - begin);
    compressed::decompress(msg, len, std::bit_cast<float>(msg[w - 1]), buf + begin);
  }
}

}  // namespace ds::comm
