// The CUDA backend's host side: argument checks, device registration, copies between host and
// device memory, and the launch of each kernel (kernels.h) on the device's stream.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "backend/attention_args.h"
#include "backend/cuda/profile.h"
#include "ds/core/device_registry.h"
#include "ds/core/error.h"
#include "ds/core/host_memory.h"

namespace ds::backend {
namespace k = cuda_kernels;

void cuda_check(cudaError_t err, int device, const char* what) {
  if (err == cudaSuccess) return;
  DS_THROW("[cuda:{}] {}: {} ({})", device, what, cudaGetErrorString(err), cudaGetErrorName(err));
}

CudaDeviceGuard::CudaDeviceGuard(int device) : device_(device) {
  cuda_check(cudaGetDevice(&previous_), device, "cudaGetDevice");
  if (previous_ != device) cuda_check(cudaSetDevice(device), device, "cudaSetDevice");
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

namespace {

k::Elem elem(DType t) { return static_cast<k::Elem>(static_cast<int>(t)); }

k::View view_of(const Tensor& t) {
  DS_CHECK(t.dim() <= k::kMaxDims, "[cuda] tensors of more than {} dims are not supported, got {}",
           k::kMaxDims, shape_str(t.shape()));
  k::View v;
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.shape()[static_cast<size_t>(d)];
    v.strides[d] = t.strides()[static_cast<size_t>(d)];
  }
  return v;
}

k::View flat_view(int64_t n) {
  k::View v;
  v.ndim = 1;
  v.shape[0] = n;
  v.strides[0] = 1;
  return v;
}

void require_f32(const Tensor& t, const char* op) {
  DS_CHECK(t.dtype() == DType::f32 && t.is_contiguous(),
           "[cuda:{}] kernel takes contiguous fp32, got {}{}", op, dtype_name(t.dtype()),
           t.is_contiguous() ? "" : " (strided)");
}

void require_device(const Tensor& t, int device, const char* op) {
  DS_CHECK(t.device().type == DeviceType::cuda && t.device().index == device,
           "[cuda:{}] {} got a tensor on {}: move it to cuda:{} first", device, op,
           t.device().str(), device);
}

const float* cf(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* mf(const Tensor& t) { return static_cast<float*>(t.raw_data()); }

// The registry's copy and fill for CUDA devices (core calls these for Tensor's factories, clone,
// to(dtype) and copy_from): the backend of whichever side is on a GPU.
void registry_copy(const Tensor& src, const Tensor& dst) {
  const Device d = dst.device().is_cpu() ? src.device() : dst.device();
  cuda_backend(d.index).copy(src, dst);
}

void registry_fill(const Tensor& dst, double value) {
  cuda_backend(dst.device().index).fill(dst, value);
}

// An allocator that creates the device's backend (stream, handle, pool) on first use, so a
// Tensor::empty(..., cuda:0) works before anything else has touched the GPU.
class LazyDeviceAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override { return pool().allocate(nbytes); }
  void deallocate(void* p, size_t nbytes) override { pool().deallocate(p, nbytes); }
  AllocatorStats stats() const override { return pool().stats(); }
  void reset_peak() override { pool().reset_peak(); }
  void empty_cache() override { pool().empty_cache(); }

 private:
  // One device per process for now: the registry keys by device type, not index, so storage on
  // cuda:i for i > 0 would need the index passed through. cuda(i) refuses i > 0 until then.
  static Allocator& pool() { return cuda_backend(0).allocator(); }
};

const bool kRegistered = [] {
  static LazyDeviceAllocator lazy;
  register_device(DeviceType::cuda, DeviceOps{&lazy, &registry_copy, &registry_fill});
  return true;
}();

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here
    return 0;
  }
  return n;
}

CudaBackend& cuda_backend(int index) {
  (void)kRegistered;
  if (index == 0) {
    // Created on first use (a thrown error is retried on the next call) and never destroyed:
    // tensors that outlive main() still return their memory to its allocator, and the driver
    // frees the rest at exit.
    static CudaBackend* first = [] {
      DS_CHECK(cuda_device_count() > 0,
               "[cuda] device cuda:0 requested, but no CUDA device is visible (check nvidia-smi "
               "and CUDA_VISIBLE_DEVICES)");
      return new CudaBackend(0);
    }();
    return *first;
  }
  const int count = cuda_device_count();
  DS_CHECK(index > 0 && index < count, "[cuda] device cuda:{} requested; this machine has {}",
           index, count);
  DS_THROW("[cuda] device cuda:{} requested: this build runs one GPU per process (cuda:0; pick the "
           "GPU with CUDA_VISIBLE_DEVICES, as the deepspeed launcher does per rank)",
           index);
}

Backend& cuda(int index) { return cuda_backend(index); }

// ---- CudaBackend ----

void CudaBackend::synchronize() {
  cuda_check(cudaStreamSynchronize(stream_), device_, "cudaStreamSynchronize");
}

void CudaBackend::check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) cuda_check(err, device_, kernel);
}

bool CudaBackend::supports(const std::string& op, DType dtype) const {
  if (op == "copy" || op == "fill" || op == "axpy") return true;
  if (op == "adam") return dtype == DType::f32;
  if (op == "gemm" || op == "dropout") return is_floating(dtype);
  return dtype == DType::f32;  // every other kernel computes in fp32; ops upcast 16-bit inputs
}

Tensor CudaBackend::scratch(int64_t floats) {
  return Tensor::empty({std::max<int64_t>(floats, 1)}, DType::f32, Device{DeviceType::cuda, device_});
}

Tensor CudaBackend::device_int64(std::span<const int64_t> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i64,
                           Device{DeviceType::cuda, device_});
  if (!values.empty())
    cuda_check(cudaMemcpyAsync(t.raw_data(), values.data(), values.size() * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream_),
               device_, "cudaMemcpyAsync (host to device)");
  return t;
}

std::vector<int64_t> CudaBackend::ids_on_host(const Tensor& ids) {
  Tensor h = Tensor::empty(ids.shape(), ids.dtype(), kCPU);
  copy(ids, h);
  return h.to_int_vector();
}

std::shared_ptr<Storage> CudaBackend::host_staging(size_t nbytes) {
  CudaDeviceGuard guard(device_);
  void* p = nullptr;
  if (nbytes > 0 && cudaHostAlloc(&p, nbytes, cudaHostAllocDefault) == cudaSuccess)
    return Storage::external(p, nbytes, kCPU, [](void* q) { cudaFreeHost(q); });
  cudaGetLastError();  // could not pin (a locked-memory limit): plain host memory still works
  return Storage::allocate(nbytes, kCPU);
}

void CudaBackend::set_memory_limit(uint64_t bytes) {
  memory_limit_.store(bytes);
  if (bytes > 0) allocator_->empty_cache();  // cached blocks count against the cap
}

uint64_t CudaBackend::available_memory() {
  CudaDeviceGuard guard(device_);
  size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), device_, "cudaMemGetInfo");
  const AllocatorStats st = allocator_->stats();
  const uint64_t cached = st.bytes_reserved - st.bytes_in_use;  // ours, unused
  uint64_t avail = static_cast<uint64_t>(free_b) + cached;
  if (const uint64_t limit = memory_limit_.load(); limit > 0)
    avail = std::min(avail, limit > st.bytes_in_use ? limit - st.bytes_in_use : 0);
  return avail;
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  const ProfileScope profile_scope(*this, "copy");
  DS_CHECK(src.numel() == dst.numel(), "[cuda:{}] copy of {} elements into {}", device_,
           src.numel(), dst.numel());
  const int64_t n = src.numel();
  if (n == 0) return;
  const bool src_dev = !src.device().is_cpu(), dst_dev = !dst.device().is_cpu();
  if (!src_dev && !dst_dev) return host_copy(src, dst);
  CudaDeviceGuard guard(device_);
  if (src_dev) require_device(src, device_, "copy");
  if (dst_dev) require_device(dst, device_, "copy");
  const bool same_shape = src.shape() == dst.shape();
  DS_CHECK(same_shape || dst.is_contiguous(),
           "[cuda:{}] copy between shapes {} and {} needs a contiguous destination", device_,
           shape_str(src.shape()), shape_str(dst.shape()));
  if (src_dev && dst_dev) {
    const k::View dv = same_shape ? view_of(dst) : flat_view(n);
    k::copy_convert(src.raw_data(), elem(src.dtype()), view_of(src), dst.raw_data(),
                    elem(dst.dtype()), dv, n, stream_);
    return check_launch("copy_convert");
  }
  if (!src_dev) {  // host -> device: bytes as they are, then converted or scattered on the GPU
    const Tensor hs = src.contiguous();
    if (dst.is_contiguous() && dst.dtype() == src.dtype()) {
      cuda_check(cudaMemcpyAsync(dst.raw_data(), hs.raw_data(), hs.nbytes(),
                                 cudaMemcpyHostToDevice, stream_),
                 device_, "cudaMemcpyAsync (host to device)");
      return synchronize();  // hs may be a temporary: the copy must be done with it
    }
    Tensor stage = Tensor::empty(src.shape(), src.dtype(), dst.device());
    cuda_check(cudaMemcpyAsync(stage.raw_data(), hs.raw_data(), hs.nbytes(),
                               cudaMemcpyHostToDevice, stream_),
               device_, "cudaMemcpyAsync (host to device)");
    copy(stage, dst);
    return synchronize();
  }
  // device -> host: converted and gathered on the GPU into a contiguous buffer, then one memcpy.
  Tensor stage = dst.dtype() == src.dtype() && src.is_contiguous()
                     ? src
                     : Tensor::empty(dst.shape(), dst.dtype(), src.device());
  if (!stage.same(src)) {
    const k::View sv = view_of(src);
    k::copy_convert(src.raw_data(), elem(src.dtype()), sv, stage.raw_data(), elem(dst.dtype()),
                    flat_view(n), n, stream_);
    check_launch("copy_convert");
  }
  if (dst.is_contiguous()) {
    cuda_check(cudaMemcpyAsync(dst.raw_data(), stage.raw_data(), dst.nbytes(),
                               cudaMemcpyDeviceToHost, stream_),
               device_, "cudaMemcpyAsync (device to host)");
    return synchronize();
  }
  Tensor host = Tensor::empty(dst.shape(), dst.dtype(), kCPU);
  cuda_check(cudaMemcpyAsync(host.raw_data(), stage.raw_data(), host.nbytes(),
                             cudaMemcpyDeviceToHost, stream_),
             device_, "cudaMemcpyAsync (device to host)");
  synchronize();
  host_copy(host, dst);
}

void CudaBackend::fill(const Tensor& dst, double value) {
  const ProfileScope profile_scope(*this, "fill");
  require_device(dst, device_, "fill");
  DS_CHECK(dst.is_contiguous(), "[cuda:{}] fill needs a contiguous tensor", device_);
  CudaDeviceGuard guard(device_);
  k::fill(dst.raw_data(), elem(dst.dtype()), dst.numel(), value, stream_);
  check_launch("fill");
}

void CudaBackend::axpy(const Tensor& y, const Tensor& x, float alpha) {
  const ProfileScope profile_scope(*this, "axpy");
  DS_CHECK(y.numel() == x.numel() && y.is_contiguous() && x.is_contiguous() &&
               is_floating(y.dtype()) && is_floating(x.dtype()),
           "[cuda:{}] axpy needs contiguous floating tensors of equal size ({} vs {})", device_,
           y.numel(), x.numel());
  require_device(y, device_, "axpy");
  require_device(x, device_, "axpy");
  CudaDeviceGuard guard(device_);
  k::axpy(y.raw_data(), elem(y.dtype()), x.raw_data(), elem(x.dtype()), y.numel(), alpha, stream_);
  check_launch("axpy");
}

double CudaBackend::sum_of_squares(const Tensor& x) {
  const ProfileScope profile_scope(*this, "sum_of_squares");
  DS_CHECK(is_floating(x.dtype()) && x.is_contiguous(),
           "[cuda:{}] sum_of_squares needs a contiguous floating tensor, got {} {}", device_,
           dtype_name(x.dtype()), shape_str(x.shape()));
  require_device(x, device_, "sum_of_squares");
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  CudaDeviceGuard guard(device_);
  const int64_t tiles = (n + (1 << 16) - 1) >> 16;
  Tensor partial = scratch(2 * tiles);  // doubles
  k::sum_of_squares_tiles(x.raw_data(), elem(x.dtype()), n, static_cast<double*>(partial.raw_data()),
                          stream_);
  check_launch("sum_of_squares");
  std::vector<double> host(static_cast<size_t>(tiles));
  cuda_check(cudaMemcpyAsync(host.data(), partial.raw_data(), host.size() * sizeof(double),
                             cudaMemcpyDeviceToHost, stream_),
             device_, "cudaMemcpyAsync (device to host)");
  synchronize();
  double total = 0.0;
  for (double p : host) total += p;  // tiles in order, as the CPU backend
  return total;
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const ProfileScope profile_scope(*this, "binary");
  for (const Tensor* t : {&a, &b, &out}) {
    DS_CHECK(t->dtype() == DType::f32, "[cuda:binary] kernel takes fp32, got {}",
             dtype_name(t->dtype()));
    require_device(*t, device_, "binary");
  }
  DS_CHECK(out.is_contiguous(), "[cuda:binary] needs a contiguous output");
  CudaDeviceGuard guard(device_);
  k::binary(static_cast<int>(op), cf(a), view_of(a), cf(b), view_of(b), mf(out), view_of(out),
            out.numel(), stream_);
  check_launch("binary");
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, float scalar) {
  const ProfileScope profile_scope(*this, "unary");
  require_f32(x, "unary");
  require_f32(out, "unary");
  require_device(x, device_, "unary");
  require_device(out, device_, "unary");
  CudaDeviceGuard guard(device_);
  k::unary(static_cast<int>(op), cf(x), mf(out), x.numel(), scalar, stream_);
  check_launch("unary");
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t reduced,
                         int64_t inner, const Tensor& out) {
  const ProfileScope profile_scope(*this, "reduce");
  require_f32(x, "reduce");
  require_f32(out, "reduce");
  require_device(x, device_, "reduce");
  CudaDeviceGuard guard(device_);
  const int64_t chunks = k::reduce_chunks(outer, reduced, inner);
  Tensor part = chunks > 1 ? scratch(2 * outer * chunks * inner) : Tensor();  // doubles
  k::reduce(op == ReduceOp::sum, cf(x), outer, reduced, inner, mf(out),
            chunks > 1 ? static_cast<double*>(part.raw_data()) : nullptr, stream_);
  check_launch("reduce");
}

// ---- neural-network kernels ----

void CudaBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                     const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const ProfileScope profile_scope(*this, "layer_norm_forward");
  for (const Tensor* t : {&x, &w, &y, &mean, &rstd}) require_f32(*t, "layer_norm");
  if (b.defined()) require_f32(b, "layer_norm");
  require_device(x, device_, "layer_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  CudaDeviceGuard guard(device_);
  k::layer_norm_forward(cf(x), cf(w), b.defined() ? cf(b) : nullptr, eps, rows, C, mf(y), mf(mean),
                        mf(rstd), stream_);
  check_launch("layer_norm_forward");
}

void CudaBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                      const Tensor& dw, const Tensor& db) {
  const ProfileScope profile_scope(*this, "layer_norm_backward");
  for (const Tensor* t : {&dy, &x, &w, &mean, &rstd, &dx, &dw})
    require_f32(*t, "layer_norm_backward");
  if (db.defined()) require_f32(db, "layer_norm_backward");
  require_device(x, device_, "layer_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  CudaDeviceGuard guard(device_);
  Tensor part = scratch(2 * 64 * C);
  k::layer_norm_backward(cf(dy), cf(x), cf(w), cf(mean), cf(rstd), rows, C, mf(dx), mf(dw),
                         db.defined() ? mf(db) : nullptr, mf(part), stream_);
  check_launch("layer_norm_backward");
}

void CudaBackend::rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                                   const Tensor& rstd) {
  const ProfileScope profile_scope(*this, "rms_norm_forward");
  for (const Tensor* t : {&x, &w, &y, &rstd}) require_f32(*t, "rms_norm");
  require_device(x, device_, "rms_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  CudaDeviceGuard guard(device_);
  k::rms_norm_forward(cf(x), cf(w), eps, rows, C, mf(y), mf(rstd), stream_);
  check_launch("rms_norm_forward");
}

void CudaBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                    const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const ProfileScope profile_scope(*this, "rms_norm_backward");
  for (const Tensor* t : {&dy, &x, &w, &rstd, &dx, &dw}) require_f32(*t, "rms_norm_backward");
  require_device(x, device_, "rms_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  CudaDeviceGuard guard(device_);
  Tensor part = scratch(64 * C);
  k::rms_norm_backward(cf(dy), cf(x), cf(w), cf(rstd), rows, C, mf(dx), mf(dw), mf(part), stream_);
  check_launch("rms_norm_backward");
}

void CudaBackend::softmax_forward(const Tensor& x, const Tensor& y) {
  const ProfileScope profile_scope(*this, "softmax_forward");
  require_f32(x, "softmax");
  require_f32(y, "softmax");
  require_device(x, device_, "softmax");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  CudaDeviceGuard guard(device_);
  k::softmax_forward(cf(x), rows, C, mf(y), stream_);
  check_launch("softmax_forward");
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const ProfileScope profile_scope(*this, "softmax_backward");
  for (const Tensor* t : {&y, &dy, &dx}) require_f32(*t, "softmax_backward");
  require_device(y, device_, "softmax_backward");
  const int64_t C = y.size(-1), rows = y.numel() / std::max<int64_t>(C, 1);
  CudaDeviceGuard guard(device_);
  k::softmax_backward(cf(y), cf(dy), rows, C, mf(dx), stream_);
  check_launch("softmax_backward");
}

namespace {

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
               std::span<const int64_t> key_lens, int64_t window, float softcap, const char* op) {
  check_attention_args(q, k, v, causal, key_lens, window, std::string("cuda:") + op);
  // The CUDA kernels mask causally and by key length only (attention.cu, attention_tiled.cu).
  DS_CHECK(window == 0 && softcap == 0.0f,
           "[cuda:{}] sliding-window attention (window {}) and attention logit soft-capping "
           "(softcap {}) are not implemented on CUDA (Gemma's layers); run the model on the CPU",
           op, window, softcap);
  DS_CHECK(q.size(3) <= k::kMaxHeadDim, "[cuda:{}] head size {} is over the kernel's {}", op,
           q.size(3), k::kMaxHeadDim);
}

}  // namespace

void CudaBackend::attention_forward(const Tensor& q, const Tensor& kk, const Tensor& v, float scale,
                                    bool causal, std::span<const int64_t> key_lens, int64_t window,
                                    float softcap, const Tensor& out, const Tensor& lse) {
  const ProfileScope profile_scope(*this, "attention_forward");
  check_qkv(q, kk, v, causal, key_lens, window, softcap, "attention");
  require_device(q, device_, "attention");
  CudaDeviceGuard guard(device_);
  const Tensor lens = device_int64(key_lens);
  k::attention_forward(cf(q), cf(kk), cf(v), q.size(0), q.size(1), q.size(2), kk.size(2), q.size(3),
                       scale, causal,
                       key_lens.empty() ? nullptr : static_cast<const int64_t*>(lens.raw_data()),
                       mf(out), mf(lse), stream_);
  check_launch("attention_forward");
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& kk,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     float scale, bool causal, std::span<const int64_t> key_lens,
                                     int64_t window, float softcap, const Tensor& dq,
                                     const Tensor& dk, const Tensor& dv) {
  const ProfileScope profile_scope(*this, "attention_backward");
  check_qkv(q, kk, v, causal, key_lens, window, softcap, "attention_backward");
  for (const Tensor* t : {&dout, &out, &lse, &dq, &dk, &dv}) require_f32(*t, "attention_backward");
  require_device(q, device_, "attention_backward");
  CudaDeviceGuard guard(device_);
  const Tensor lens = device_int64(key_lens);
  Tensor delta = scratch(q.size(0) * q.size(1) * q.size(2));
  k::attention_backward(cf(dout), cf(q), cf(kk), cf(v), cf(out), cf(lse), q.size(0), q.size(1),
                        q.size(2), kk.size(2), q.size(3), scale, causal,
                        key_lens.empty() ? nullptr : static_cast<const int64_t*>(lens.raw_data()),
                        mf(dq), mf(dk), mf(dv), mf(delta), stream_);
  check_launch("attention_backward");
}

void CudaBackend::rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq,
                       float scale, bool interleaved, bool inverse, const Tensor& out) {
  const ProfileScope profile_scope(*this, "rope");
  require_f32(x, "rope");
  require_f32(out, "rope");
  require_device(x, device_, "rope");
  DS_CHECK(x.dim() == 4, "[cuda:rope] needs (B, NH, T, hd), got {}", shape_str(x.shape()));
  const int64_t T = x.size(2), hd = x.size(3), half = static_cast<int64_t>(inv_freq.size());
  DS_CHECK(half > 0 && 2 * half <= hd,
           "[cuda:rope] {} inverse frequencies for head size {} (need 1 .. hd/2)", inv_freq.size(),
           hd);
  if (x.numel() == 0) return;
  // The (T, half) tables as the CPU backend makes them: angles in double, then fp32.
  std::vector<float> tables(static_cast<size_t>(2 * T * half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos0 + t) * inv_freq[static_cast<size_t>(i)];
      const double s = std::sin(a) * scale;
      tables[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(a) * scale);
      tables[static_cast<size_t>(T * half + t * half + i)] = static_cast<float>(inverse ? -s : s);
    }
  CudaDeviceGuard guard(device_);
  Tensor dev = scratch(2 * T * half);
  cuda_check(cudaMemcpyAsync(dev.raw_data(), tables.data(), tables.size() * sizeof(float),
                             cudaMemcpyHostToDevice, stream_),
             device_, "cudaMemcpyAsync (host to device)");
  const float* ct = cf(dev);
  k::rope(cf(x), ct, ct + T * half, x.numel() / hd, T, half, hd, interleaved, mf(out), stream_);
  check_launch("rope");
  synchronize();  // `tables` is about to go away
}

void CudaBackend::embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const ProfileScope profile_scope(*this, "embedding_forward");
  require_f32(weight, "embedding");
  require_f32(out, "embedding");
  DS_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "[cuda:embedding] ids must be int32 or int64, got {}", dtype_name(ids.dtype()));
  DS_CHECK(ids.is_contiguous(), "[cuda:embedding] ids must be contiguous");
  require_device(weight, device_, "embedding");
  require_device(ids, device_, "embedding");
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  const std::vector<int64_t> h = ids_on_host(ids);
  for (int64_t n = 0; n < N; ++n)
    DS_CHECK(h[static_cast<size_t>(n)] >= 0 && h[static_cast<size_t>(n)] < V,
             "[embedding] id {} (at position {}) is out of range for vocabulary size {} (on {})",
             h[static_cast<size_t>(n)], n, V, name());
  CudaDeviceGuard guard(device_);
  k::embedding_forward(cf(weight), ids.raw_data(), ids.dtype() == DType::i64, N, C, mf(out),
                       stream_);
  check_launch("embedding_forward");
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  const ProfileScope profile_scope(*this, "embedding_backward");
  require_f32(dout, "embedding_backward");
  require_f32(dweight, "embedding_backward");
  require_device(dout, device_, "embedding_backward");
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  const std::vector<int64_t> h = ids_on_host(ids);
  // Group positions by id, keeping input order within an id (a stable counting sort), so each
  // row of dweight adds its gradients in the order the CPU backend does.
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t id : h)
    DS_CHECK(id >= 0 && id < V, "[embedding] id {} is out of range for vocabulary size {} (on {})",
             id, V, name());
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return h[static_cast<size_t>(a)] < h[static_cast<size_t>(b)]; });
  std::vector<int64_t> uniq, offsets;
  for (int64_t p = 0; p < N; ++p) {
    const int64_t id = h[static_cast<size_t>(order[static_cast<size_t>(p)])];
    if (uniq.empty() || uniq.back() != id) {
      uniq.push_back(id);
      offsets.push_back(p);
    }
  }
  offsets.push_back(N);
  CudaDeviceGuard guard(device_);
  const Tensor du = device_int64(uniq), doff = device_int64(offsets), dpos = device_int64(order);
  k::embedding_backward(cf(dout), static_cast<const int64_t*>(du.raw_data()),
                        static_cast<const int64_t*>(doff.raw_data()),
                        static_cast<const int64_t*>(dpos.raw_data()),
                        static_cast<int64_t>(uniq.size()), C, mf(dweight), stream_);
  check_launch("embedding_backward");
  synchronize();  // the host index vectors are about to go away
}

void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, const Tensor& losses,
                                        const Tensor& lse) {
  const ProfileScope profile_scope(*this, "cross_entropy_forward");
  for (const Tensor* t : {&logits, &losses, &lse}) require_f32(*t, "cross_entropy");
  require_device(logits, device_, "cross_entropy");
  require_device(targets, device_, "cross_entropy");
  DS_CHECK(targets.is_contiguous() && (targets.dtype() == DType::i32 || targets.dtype() == DType::i64),
           "[cuda:cross_entropy] targets must be contiguous int32 or int64");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  DS_CHECK(targets.numel() == N, "[cuda:cross_entropy] {} targets for {} rows", targets.numel(), N);
  const std::vector<int64_t> h = ids_on_host(targets);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = h[static_cast<size_t>(n)];
    DS_CHECK(t == ignore_index || (t >= 0 && t < V),
             "[cross_entropy] target {} (at position {}) is out of range for {} classes (on {})",
             t, n, V, name());
  }
  CudaDeviceGuard guard(device_);
  k::cross_entropy_forward(cf(logits), targets.raw_data(), targets.dtype() == DType::i64, N, V,
                           ignore_index, mf(losses), mf(lse), stream_);
  check_launch("cross_entropy_forward");
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         int64_t ignore_index, const Tensor& lse, float scale,
                                         const Tensor& dlogits) {
  const ProfileScope profile_scope(*this, "cross_entropy_backward");
  for (const Tensor* t : {&logits, &lse, &dlogits}) require_f32(*t, "cross_entropy_backward");
  require_device(logits, device_, "cross_entropy_backward");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  DS_CHECK(targets.numel() == N, "[cuda:cross_entropy_backward] {} targets for {} rows",
           targets.numel(), N);
  // The targets were checked by the forward that produced lse.
  CudaDeviceGuard guard(device_);
  k::cross_entropy_backward(cf(logits), targets.raw_data(), targets.dtype() == DType::i64, N, V,
                            ignore_index, cf(lse), scale, mf(dlogits), stream_);
  check_launch("cross_entropy_backward");
}

void CudaBackend::dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
                          const Tensor& out) {
  const ProfileScope profile_scope(*this, "dropout");
  DS_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()) && x.is_contiguous() &&
               out.is_contiguous() && x.numel() == out.numel(),
           "[cuda:dropout] needs contiguous floating tensors of equal size");
  DS_CHECK(p >= 0.0f && p < 1.0f, "[cuda:dropout] p = {} must be in [0, 1)", p);
  require_device(x, device_, "dropout");
  // The CPU backend's integer threshold: uniform01(h) >= p  <=>  (h >> 40) >= ceil(p 2^24).
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  CudaDeviceGuard guard(device_);
  k::dropout(x.raw_data(), elem(x.dtype()), out.raw_data(), elem(out.dtype()), x.numel(), threshold,
             1.0f / (1.0f - p), seed, stream, base, stream_);
  check_launch("dropout");
}

void CudaBackend::adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                       const AdamStep& step, const Tensor& out16) {
  const ProfileScope profile_scope(*this, "adam");
  for (const Tensor* t : {&p, &g, &m, &v}) {
    require_f32(*t, "adam");
    require_device(*t, device_, "adam");
  }
  const int64_t n = p.numel();
  DS_CHECK(g.numel() == n && m.numel() == n && v.numel() == n,
           "[cuda:adam] parameter, gradient and moments differ in length ({}, {}, {}, {})", n,
           g.numel(), m.numel(), v.numel());
  if (out16.defined()) {
    DS_CHECK((out16.dtype() == DType::bf16 || out16.dtype() == DType::f16) &&
                 out16.is_contiguous() && out16.numel() == n,
             "[cuda:adam] the 16-bit copy must be contiguous bf16 or fp16 of {} elements", n);
    require_device(out16, device_, "adam");
  }
  const k::AdamConsts c{step.grad_scale,   step.beta1,         step.one_minus_beta1,
                        step.beta2,        step.one_minus_beta2, step.eps,
                        step.inv_sqrt_bc2, step.neg_step_size, step.weight_decay,
                        step.neg_lr_wd,    step.l2_decay,      step.decoupled_decay};
  CudaDeviceGuard guard(device_);
  k::adam(mf(p), cf(g), mf(m), mf(v), n, c, out16.defined() ? out16.raw_data() : nullptr,
          out16.defined() ? elem(out16.dtype()) : k::Elem::bf16, stream_);
  check_launch("adam");
}

}  // namespace ds::backend
