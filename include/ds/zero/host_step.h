#pragma once
// The optimizer step of a ZeRO strategy over its optimizer range when the optimizer state is in
// host memory, as one part of the strategy (it owns one; the NVMe-offloaded step streams
// sub-groups through the StateStore instead: Strategy::step_chunks).
//
//   HostStep step;
//   step.run(opt, master, grads, 1.0f / 1024, params16, DType::bf16);          // all in RAM
//   step.run_for_device(opt, master, grads, scale, device_params, DType::bf16, sub_group);
//
// run: fp32 gradients in one optimizer call (Lamb's trust ratios need the whole range); 16-bit
// gradients (data_types.grad_accum_dtype, fp16) are read a 1 MiB slice at a time by an
// elementwise optimizer (begin_step + step_slice: bitwise one step), so no fp32 copy is kept;
// Lamb and SGD, which step whole tensors, get one fp32 copy, made on first use.
// run_for_device: parameters on a GPU (ZeRO-Offload's layout): gradients come down to page-locked
// host buffers chunk by chunk while the CPU optimizer steps the chunk before and the new
// parameters of the one before that go up (a copy queue per direction), bitwise the synchronous
// order's results. download() sends ranges of those gradients down earlier, while backward still
// runs (FlatStrategy, as each range becomes final): run_for_device then waits for those copies
// and downloads only the rest.
//
// Ownership: the scratch and staging buffers and the copy queues (declared last, so destroyed and
// waited for first). Threading: the training thread; widen() may be called from stage 3's step
// worker, never at the same time as the training thread uses this object.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/core/tensor.h"
#include "ds/optim/optimizer.h"

namespace ds::backend {
class TransferQueue;
}  // namespace ds::backend

namespace ds::zero {

class HostStep {
 public:
  HostStep();
  ~HostStep();
  HostStep(const HostStep&) = delete;
  HostStep& operator=(const HostStep&) = delete;

  // master: at least n fp32 elements; grads (n,) fp32 or 16-bit; params16: where the new parameters rounded to
  // `train` go (nullptr in fp32 training, where master is the parameters).
  void run(optim::Optimizer& opt, const Tensor& master, const Tensor& grads, float grad_scale,
           void* params16, DType train);
  // The same with the working parameters (n,) of `train` dtype on a GPU; chunks of at most
  // sub_group_size elements.
  void run_for_device(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                      float grad_scale, const Tensor& device_params, DType train,
                      int64_t sub_group_size);
  // Enqueues the copy of grads[begin, begin + numel) (grads: the (n,) gradients on the device that
  // the next run_for_device() receives) into the staging buffer, after every kernel enqueued so
  // far; the caller guarantees these elements do not change on the device until that step. The
  // ranges of one step must not overlap. The host does not wait.
  void download(const Tensor& grads, int64_t begin, int64_t numel);
  // Forgets the downloads not yet used by a step (gradients discarded: zero_grads, a skipped
  // step, a checkpoint load, a backward that was not followed by a step), after they are done.
  void discard_downloads();
  // Bytes download() has sent since construction.
  int64_t bytes_sent_in_backward() const { return bytes_sent_in_backward_; }
  // fp32 copy of grads[begin, begin + numel) in a reused scratch buffer.
  const float* widen(const Tensor& grads, int64_t begin, int64_t numel);
  // Elements per chunk of run_for_device's pipelined step.
  static int64_t step_chunk(int64_t sub_group_size) {
    return std::min(kDeviceStepChunk, sub_group_size);
  }
  // Bytes of the fp32 gradient copy kept for whole-tensor optimizers (0 when none).
  int64_t scratch_bytes() const;

 private:
  // Elements per chunk of the pipelined device step (16 MiB of fp32 gradients; sub_group_size when
  // smaller): small enough that the first and last copies, which nothing overlaps, are short;
  // large enough that the CPU optimizer's threads each get a long run.
  static constexpr int64_t kDeviceStepChunk = int64_t{1} << 22;

  void run_16bit(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                 float grad_scale, void* params16, DType train);
  // host_grads_ as (numel,) of dtype in page-locked memory of device's backend, and the queues.
  void prepare_download(Device device, int64_t numel, DType dtype);
  // Enqueues the copies of every chunk's gradients that download() did not send; returns, per
  // chunk, the ticket to wait for before that chunk's gradients are on the host.
  std::vector<uint64_t> downloads_for_step(const Tensor& grads, int64_t chunk);

  // One download() of this step: grads[begin, begin + numel) is on its way as `ticket`.
  struct Sent {
    int64_t begin = 0, numel = 0;
    uint64_t ticket = 0;
  };
  std::vector<Sent> sent_;
  const void* sent_from_ = nullptr;  // the device gradients sent_ was read from
  int64_t bytes_sent_in_backward_ = 0;

  Tensor grads32_;     // fp32 copy of 16-bit gradients for whole-tensor optimizers
  Tensor grad_chunk_;  // widen()'s scratch
  Tensor host_grads_;  // (n,) host, gradients' dtype: the device step's staging
  Tensor host16_;      // (n,) training dtype, host: the rounded new parameters
  // The device step's copies (declared after every buffer they touch: destroyed, and so waited
  // for, first; the strategy declares its HostStep after its master weights for the same reason).
  std::unique_ptr<backend::TransferQueue> to_host_, to_device_;
};

}  // namespace ds::zero
