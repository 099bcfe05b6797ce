// The optimizer step with its state in host memory (ds/zero/host_step.h).
#include "ds/zero/host_step.h"

#include <algorithm>
#include <vector>

#include "ds/backend/backend.h"
#include "ds/core/error.h"

namespace ds::zero {

HostStep::HostStep() = default;
HostStep::~HostStep() = default;

int64_t HostStep::scratch_bytes() const {
  return grads32_.defined() ? static_cast<int64_t>(grads32_.nbytes()) : 0;
}

const float* HostStep::widen(const Tensor& grads, int64_t begin, int64_t numel) {
  if (!grad_chunk_.defined() || grad_chunk_.numel() < numel) grad_chunk_ = Tensor::empty({numel});
  grad_chunk_.flat_range(0, numel).copy_from(grads.flat_range(begin, numel));
  return grad_chunk_.data<float>();
}

void HostStep::run(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                   float grad_scale, void* params16, DType train) {
  if (grads.dtype() != DType::f32) return run_16bit(opt, master, grads, grad_scale, params16, train);
  opt.step(master.data<float>(), grads.data<float>(), grads.numel(), grad_scale, params16,
           train != DType::f32 ? train : DType::bf16);
}

void HostStep::run_16bit(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                         float grad_scale, void* params16, DType train) {
  const DType out16_dtype = train != DType::f32 ? train : DType::bf16;
  const int64_t n = grads.numel();
  char* p16 = static_cast<char*>(params16);
  float* m = master.data<float>();
  if (!opt.steps_in_slices()) {
    if (!grads32_.defined()) grads32_ = Tensor::empty({n}, DType::f32);
    grads32_.copy_from(grads);
    opt.step(m, grads32_.data<float>(), n, grad_scale, p16, out16_dtype);
    return;
  }
  // 256K elements: 1 MiB of fp32 scratch, large enough that each slice runs at full speed.
  constexpr int64_t kChunk = int64_t{1} << 18;
  std::vector<float> g32(static_cast<size_t>(std::min(kChunk, n)));
  const std::vector<optim::StateBuffer> states = opt.state_buffers();
  std::vector<float*> at(states.size());
  const char* pg = static_cast<const char*>(grads.raw_data());
  const int64_t gs = static_cast<int64_t>(dtype_size(grads.dtype()));
  const int64_t ps = static_cast<int64_t>(dtype_size(out16_dtype));
  opt.begin_step();
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    convert(pg + off * gs, grads.dtype(), g32.data(), DType::f32, static_cast<size_t>(len));
    for (size_t i = 0; i < states.size(); ++i) at[i] = states[i].data + off;
    opt.step_slice(m + off, g32.data(), at.data(), len, grad_scale, p16 ? p16 + off * ps : nullptr,
                   out16_dtype);
  }
}

void HostStep::run_for_device(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                              float grad_scale, const Tensor& device_params, DType train,
                              int64_t sub_group_size) {
  const DType out16_dtype = train != DType::f32 ? train : DType::bf16;
  const int64_t numel = grads.numel();
  // Page-locked staging buffers where the device offers them: the copies run at the link's speed
  // and, being page-locked, asynchronously.
  backend::Backend& be = backend::get(device_params.device());
  auto staging = [&](DType dt) {
    return Tensor::from_storage(be.host_staging(static_cast<size_t>(numel) * dtype_size(dt)),
                                {numel}, dt);
  };
  // The gradients come down in their own dtype: 16-bit ones (data_types.grad_accum_dtype) move
  // half the bytes and are widened on the host, exactly, a chunk at a time.
  const bool wide = grads.dtype() == DType::f32;
  if (!host_grads_.defined() || host_grads_.dtype() != grads.dtype())
    host_grads_ = staging(grads.dtype());
  if (train != DType::f32 && !host16_.defined()) host16_ = staging(train);
  const Tensor& up = train == DType::f32 ? master : host16_;  // what goes back to the GPU
  if (!opt.steps_in_slices()) {
    // Lamb's trust ratios need whole tensors: every gradient down, one step, everything up.
    host_grads_.copy_from(grads);  // waits for the backward that produced them
    const Tensor g32 = wide ? host_grads_ : host_grads_.to(DType::f32);
    opt.step(master.data<float>(), g32.data<float>(), numel, grad_scale,
             train != DType::f32 ? host16_.raw_data() : nullptr, out16_dtype);
    device_params.copy_from(up);
    return;
  }
  // Elementwise optimizers (Adam, AdamW) step chunk by chunk while the copies run beside them:
  // chunk i+1's gradients come down and chunk i-1's parameters go up (two queues: a GPU has a
  // copy engine per direction) while the CPU steps chunk i. Slices make one step equal to a whole
  // step(), so the results are bitwise those of the synchronous order.
  if (!to_host_) {
    to_host_ = be.transfer_queue();
    to_device_ = be.transfer_queue();
  }
  opt.init_state(numel);
  const std::vector<optim::StateBuffer> bufs = opt.state_buffers();
  const int64_t chunk = std::min(kDeviceStepChunk, sub_group_size);
  const int64_t chunks = (numel + chunk - 1) / chunk;
  to_host_->after_kernels();  // the gradients are final once backward's kernels are done
  std::vector<uint64_t> arrived(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * chunk, n = std::min(chunk, numel - b);
    arrived[static_cast<size_t>(c)] =
        to_host_->copy(grads.flat_range(b, n), host_grads_.flat_range(b, n));
  }
  opt.begin_step();
  std::vector<float*> states(bufs.size());
  const int64_t esize = static_cast<int64_t>(dtype_size(train));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * chunk, n = std::min(chunk, numel - b);
    to_host_->wait(arrived[static_cast<size_t>(c)]);
    for (size_t i = 0; i < bufs.size(); ++i) states[i] = bufs[i].data + b;
    void* out16 =
        train != DType::f32 ? static_cast<char*>(host16_.raw_data()) + b * esize : nullptr;
    const float* g = wide ? host_grads_.data<float>() + b : widen(host_grads_, b, n);
    opt.step_slice(master.data<float>() + b, g, states.data(), n, grad_scale, out16, out16_dtype);
    to_device_->copy(up.flat_range(b, n), device_params.flat_range(b, n));
  }
  // The next forward's kernels wait for the last parameters on the GPU; the host goes on. The
  // host buffers are next written after the next backward, which runs after those kernels.
  to_device_->before_kernels();
}

}  // namespace ds::zero
