// The gradient download during backward (grad_downloads.h).
#include "grad_downloads.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::zero::detail {

BackwardDownloads::BackwardDownloads(int64_t numel, int64_t piece,
                                     std::function<void(int64_t, int64_t)> send)
    : numel_(numel), piece_(piece), send_(std::move(send)) {
  DS_CHECK(numel >= 0 && piece >= 1, "[zero] internal: {} elements in pieces of {}", numel, piece);
}

void BackwardDownloads::arm() {
  const int64_t pieces = (numel_ + piece_ - 1) / piece_;
  left_.resize(static_cast<size_t>(pieces));
  for (int64_t p = 0; p < pieces; ++p)
    left_[static_cast<size_t>(p)] = std::min(piece_, numel_ - p * piece_);
  armed_ = true;
}

void BackwardDownloads::mark_final(int64_t begin, int64_t end) {
  if (!armed_) return;
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, numel_);
  for (int64_t p = begin / piece_; begin < end; ++p) {
    const int64_t piece_end = std::min((p + 1) * piece_, numel_);
    const int64_t n = std::min(end, piece_end) - begin;
    int64_t& left = left_[static_cast<size_t>(p)];
    DS_CHECK(left >= n, "[zero] internal: gradients [{}, {}) reported final twice", begin,
             begin + n);
    left -= n;
    if (left == 0) send_(p * piece_, piece_end - p * piece_);
    begin += n;
  }
}

}  // namespace ds::zero::detail
