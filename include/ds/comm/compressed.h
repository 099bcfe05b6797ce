#pragma once
// The 1-bit compressed all-reduce with error feedback of DeepSpeed's 1-bit optimizers
// (deepspeed/runtime/comm/nccl.py and mpi.py, compressed_allreduce; the 1-bit Adam paper,
// arXiv:2102.02888). Every rank ends with the same approximation of the average of the ranks'
// buffers, having sent about 1/32 of the bytes of an fp32 all-reduce (bus bytes):
//
//   CompressedAllReduce car(group, n);          // n elements; sizes fixed here
//   std::vector<float> we(car.padded_numel()), se(car.chunk_numel());   // zeros, kept per rank
//   car.run(buf, we.data(), se.data(), "step 17 exp_avg");             // buf: (n,) in and out
//
// The algorithm (P = padded_numel(), a multiple of 32 * N; C = P / N the server chunk):
//   worker  x = pad(buf, P) + worker_error                        (P,)
//           s = ||x|| / sqrt(P);  b_i = !(x_i < 0)  (sign with 0 -> +1, as DeepSpeed)
//           worker_error = x - s * (b ? 1 : -1)
//           all_to_all: chunk j of the packed bits (C / 8 bytes) and s to rank j
//   server  y_k = sum over ranks r, in rank order, of (b_rk ? 1 : -1) * (s_r * (1 / N))
//           y += server_error                                     (C,)
//           t = ||y|| / sqrt(C);  server_error = y - t * sign(y)
//           all_gather: every rank's packed sign bits of y (C / 8 bytes) and t
//   result  buf[j * C + k] = (bit ? 1 : -1) * t_j  for j * C + k < n
// Norms are summed in double over fixed 64 Ki-element tiles in order, so results do not depend
// on the thread count. Bits are packed 32 to an int32 word, element i at bit i % 32 of word i / 32
// (the Group has no byte dtype); each message carries its float scale as one extra word.
//
// Traffic per call (comms_logger): one all_to_all and one all_gather of N * (C / 32 + 1) words.
//
// Memory: besides the caller's error buffers, scratch of 2 x (P / 8) bytes of messages and the
// (C,) server chunk.
//
// Threading: run() is called from one thread at a time (it owns scratch buffers); it issues
// collectives on the group, so every rank calls it in the same order with the same n.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ds/comm/group.h"

namespace ds::comm {

class CompressedAllReduce {
 public:
  // numel: elements of the buffers run() will reduce (>= 0). The group must outlive this object.
  CompressedAllReduce(std::shared_ptr<Group> group, int64_t numel);

  int64_t numel() const { return numel_; }
  // numel rounded up to a multiple of 32 * group size: the worker_error length.
  int64_t padded_numel() const { return padded_; }
  // padded_numel() / group size: the server_error length.
  int64_t chunk_numel() const { return chunk_; }
  // The padding rule alone: n rounded up to a multiple of 32 * ranks.
  static int64_t padded_numel(int64_t n, int ranks);

  // buf (numel,) fp32 in place; worker_error (padded_numel,) and server_error (chunk_numel,) fp32,
  // this rank's error-feedback state, updated in place. A collective on the group (two
  // operations); ctx names them in timeout reports. On a size-1 group the same arithmetic runs
  // (the result is the compressed buffer), with no communication.
  void run(float* buf, float* worker_error, float* server_error, std::string_view ctx = {});

 private:
  std::shared_ptr<Group> group_;
  int64_t numel_ = 0, padded_ = 0, chunk_ = 0;
  int64_t words_ = 0;  // int32 words per chunk message: chunk_ / 32 sign words + 1 scale word
  std::vector<int32_t> send_, recv_;  // (N, words) messages: sign words then the scale
  std::vector<float> y_;              // (chunk,) the compensated server chunk
};

// The pieces run() is made of (tests check them against plain loops). Each runs over fixed
// tiles in parallel and gives the same result for any thread count.
namespace compressed {
// ||x|| / sqrt(n), the sum of squares taken in double over fixed tiles in order.
float scale_of(const float* x, int64_t n);
// bits (n / 32 words) of !(x_i < 0); error = x - scale * (bit ? 1 : -1). n a multiple of 32.
void compress(const float* x, int64_t n, float scale, int32_t* bits, float* error);
// out_i = (bit_i ? 1 : -1) * scale for i < n.
void decompress(const int32_t* bits, int64_t n, float scale, float* out);
}  // namespace compressed

}  // namespace ds::comm
