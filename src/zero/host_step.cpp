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

void HostStep::prepare_download(Device device, int64_t numel, DType dtype) {
  // Page-locked where the device offers it: the copies run at the link's speed and, being
  // page-locked, asynchronously. The gradients come down in their own dtype: 16-bit ones
  // (data_types.grad_accum_dtype) move half the bytes and are widened on the host.
  backend::Backend& be = backend::get(device);
  if (!host_grads_.defined() || host_grads_.dtype() != dtype || host_grads_.numel() != numel)
    host_grads_ = Tensor::from_storage(
        be.host_staging(static_cast<size_t>(numel) * dtype_size(dtype)), {numel}, dtype);
  if (!to_host_) {
    to_host_ = be.transfer_queue();
    to_device_ = be.transfer_queue();
  }
}

void HostStep::download(const Tensor& grads, int64_t begin, int64_t numel) {
  DS_CHECK(!grads.device().is_cpu() && grads.is_contiguous() && begin >= 0 && numel > 0 &&
               begin + numel <= grads.numel(),
           "[zero] internal: download of gradients [{}, {}) of {} on {}", begin, begin + numel,
           grads.numel(), grads.device().str());
  // Downloads of other gradients (a buffer no step used) are stale: the staging is reused.
  if (!sent_.empty() && sent_from_ != grads.raw_data()) discard_downloads();
  prepare_download(grads.device(), grads.numel(), grads.dtype());
  sent_from_ = grads.raw_data();
  to_host_->after_kernels();  // the kernels that made these gradients final
  const uint64_t ticket =
      to_host_->copy(grads.flat_range(begin, numel), host_grads_.flat_range(begin, numel));
  sent_.push_back({begin, numel, ticket});
  bytes_sent_in_backward_ += numel * static_cast<int64_t>(dtype_size(grads.dtype()));
}

void HostStep::discard_downloads() {
  if (sent_.empty()) return;
  // Waited for: the staging they write into may be written again or freed next.
  uint64_t last = 0;
  for (const Sent& s : sent_) last = std::max(last, s.ticket);
  to_host_->wait(last);
  sent_.clear();
  sent_from_ = nullptr;
}

std::vector<uint64_t> HostStep::downloads_for_step(const Tensor& grads, int64_t chunk) {
  if (!sent_.empty() && sent_from_ != grads.raw_data()) discard_downloads();
  std::sort(sent_.begin(), sent_.end(),
            [](const Sent& a, const Sent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < sent_.size(); ++i)
    DS_CHECK(sent_[i - 1].begin + sent_[i - 1].numel <= sent_[i].begin,
             "[zero] internal: gradient downloads [{}, +{}) and [{}, +{}) overlap",
             sent_[i - 1].begin, sent_[i - 1].numel, sent_[i].begin, sent_[i].numel);
  const int64_t numel = grads.numel(), chunks = (numel + chunk - 1) / chunk;
  std::vector<uint64_t> ready(static_cast<size_t>(chunks), 0);
  to_host_->after_kernels();  // the gradients are final once backward's kernels are done
  size_t s = 0;  // the first download that does not end before `at`
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t& wait_for = ready[static_cast<size_t>(c)];
    const int64_t end = std::min((c + 1) * chunk, numel);
    for (int64_t at = c * chunk; at < end;) {
      while (s < sent_.size() && sent_[s].begin + sent_[s].numel <= at) ++s;
      if (s < sent_.size() && sent_[s].begin <= at) {  // sent during backward
        wait_for = std::max(wait_for, sent_[s].ticket);
        at = std::min(end, sent_[s].begin + sent_[s].numel);
        continue;
      }
      const int64_t to = std::min(end, s < sent_.size() ? sent_[s].begin : end);
      wait_for = std::max(wait_for, to_host_->copy(grads.flat_range(at, to - at),
                                                   host_grads_.flat_range(at, to - at)));
      at = to;
    }
  }
  sent_.clear();  // waited for by the step that follows
  sent_from_ = nullptr;
  return ready;
}

void HostStep::run_for_device(optim::Optimizer& opt, const Tensor& master, const Tensor& grads,
                              float grad_scale, const Tensor& device_params, DType train,
                              int64_t sub_group_size) {
  const DType out16_dtype = train != DType::f32 ? train : DType::bf16;
  const int64_t numel = grads.numel();
  const bool wide = grads.dtype() == DType::f32;
  prepare_download(device_params.device(), numel, grads.dtype());
  if (train != DType::f32 && !host16_.defined()) {
    backend::Backend& be = backend::get(device_params.device());
    host16_ = Tensor::from_storage(be.host_staging(static_cast<size_t>(numel) * dtype_size(train)),
                                   {numel}, train);
  }
  const Tensor& up = train == DType::f32 ? master : host16_;  // what goes back to the GPU
  if (!opt.steps_in_slices()) {
    // Lamb's trust ratios need whole tensors: every gradient down, one step, everything up.
    discard_downloads();  // (none are sent for it; the copy below rewrites the staging)
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
  // step(), so the results are bitwise those of the synchronous order. Ranges sent during
  // backward (download()) are only waited for.
  opt.init_state(numel);
  const std::vector<optim::StateBuffer> bufs = opt.state_buffers();
  const int64_t chunk = step_chunk(sub_group_size);
  const std::vector<uint64_t> arrived = downloads_for_step(grads, chunk);
  opt.begin_step();
  std::vector<float*> states(bufs.size());
  const int64_t esize = static_cast<int64_t>(dtype_size(train));
  for (size_t c = 0; c < arrived.size(); ++c) {
    const int64_t b = static_cast<int64_t>(c) * chunk, n = std::min(chunk, numel - b);
    to_host_->wait(arrived[c]);
    for (size_t i = 0; i < bufs.size(); ++i) states[i] = bufs[i].data + b;
    void* out16 =
        train != DType::f32 ? static_cast<char*>(host16_.raw_data()) + b * esize : nullptr;
    const float* g = wide ? host_grads_.data<float>() + b : widen(host_grads_, b, n);
    opt.step_slice(master.data<float>() + b, g, states.data(), n, grad_scale, out16, out16_dtype);
    to_device_->copy(up.flat_range(b, n), device_params.flat_range(b, n));
  }
  // The next forward's kernels wait for the last parameters on the GPU; the host goes on. The
  // parameter staging is next written after the next backward, which runs after those kernels;
  // the gradient staging, read above, by the next boundary backward's downloads at the earliest.
  to_device_->before_kernels();
}

}  // namespace ds::zero
