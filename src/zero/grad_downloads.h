#pragma once
// The gradient download during backward (internal to zero/; FlatStrategy with the model on a GPU,
// DeepSpeed's ZeRO-Offload copying each reduced bucket to host memory as backward produces it).
// The optimizer range is cut into pieces (HostStep's step chunks); backward reports the elements
// whose gradients are final, and a piece is sent (HostStep::download) as soon as all its elements
// are: the copy runs beside the rest of backward instead of after it.
//
//   BackwardDownloads d(numel, piece, [&](int64_t b, int64_t n) { step.download(g, b, n); });
//   d.arm();                   // the boundary micro-step's backward begins
//   d.mark_final(lo, hi);      // from the grad-ready hooks or the finished bucket reductions
//   d.disarm();                // backward over (pieces not complete are left to the step)
//
// Each element must be reported at most once per armed backward (FlatStrategy disarms when a
// parameter's gradient is completed twice). Threading: the training thread only.
#include <cstdint>
#include <functional>
#include <vector>

namespace ds::zero::detail {

class BackwardDownloads {
 public:
  // numel: the optimizer range's elements; piece (>= 1): elements per download; send(begin, n)
  // enqueues the download of [begin, begin + n).
  BackwardDownloads(int64_t numel, int64_t piece, std::function<void(int64_t, int64_t)> send);

  void arm();
  void disarm() { armed_ = false; }
  bool armed() const { return armed_; }
  // Elements [begin, end) of the optimizer range hold their final gradients (clamped to it).
  void mark_final(int64_t begin, int64_t end);

 private:
  int64_t numel_ = 0, piece_ = 1;
  std::function<void(int64_t, int64_t)> send_;
  std::vector<int64_t> left_;  // per piece: elements not yet final in this backward
  bool armed_ = false;
};

}  // namespace ds::zero::detail
