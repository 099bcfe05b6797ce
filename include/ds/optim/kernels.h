#pragma once
// Optimizer kernels over FLAT fp32 buffers. Each function updates a contiguous range [0, n) of
// parameters from gradients of the same length, with its own state buffers (also length n), in
// one pass over memory. Under ZeRO the range is this rank's partition: nothing here knows about
// tensors, except Lamb, whose trust ratio is per tensor and therefore takes a list of segments.
//
// All kernels:
//  - multiply the gradient by `grad_scale` first (the engine fuses loss-scale unscaling and
//    gradient clipping into this one factor: 1 / (clip_coef * loss_scale));
//  - optionally write the updated parameter, rounded to nearest even, to a 16-bit copy `out16`
//    (bf16 or fp16: the model's working weights) in the same pass;
//  - are multi-threaded over fixed 64 KiB tiles (OpenMP, ds::num_threads()) and give bitwise the
//    same result for any thread count;
//  - Adam and SGD are vectorised (AVX-512 or AVX2, chosen at run time) and give bitwise the same
//    result on every SIMD path (each operation is an IEEE-rounded mul, fma, sqrt or div, done in
//    the same order on every path). Lamb is scalar code (it is not a ZeRO-Offload hot path).
//
// Exact formulas: docs/optimizers.md and reference/deepspeed-behaviour.md §10.
#include <cstdint>
#include <span>

#include "ds/core/dtype.h"
#include "ds/core/tensor.h"

namespace ds::optim {

// ---------------------------------------------------------------------------------------------
// Adam / AdamW (DeepSpeed's DeepSpeedCPUAdam / FusedAdam).

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  // true: decoupled weight decay, p -= lr*wd*p (AdamW; DeepSpeed's default even for "Adam").
  // false: L2 regularisation, g += wd*p (torch.optim.Adam's weight_decay).
  bool adam_w_mode = true;
};

// One fused Adam step over n elements. `step` is the 1-based step count after incrementing
// (it drives the bias corrections). Per element, with g = grad_scale * g_in,
// bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (both 1 without bias_correction):
//   if (!adam_w_mode) g += wd * p
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   denom = sqrt(v) / sqrt(bc2) + eps
//   if (adam_w_mode) p -= lr * wd * p          // decay sees the pre-update p
//   p -= (lr / bc1) * m / denom
//   if (out16) out16 = round_to_nearest_even(p) as out16_dtype (bf16 or fp16)
// p, m, v: (n,) fp32, updated in place; g: (n,) fp32; out16: (n,) 16-bit or nullptr.
void adam_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t step,
                 const AdamConfig& c, float grad_scale = 1.0f, void* out16 = nullptr,
                 DType out16_dtype = DType::bf16);
// The same step over tensors on any one device: the kernel above for host memory, the device's
// backend (Backend::adam, bitwise the same arithmetic) for GPU memory. p, g, m, v: contiguous fp32
// (n,); out16: an optional bf16/fp16 (n,) copy of the updated p.
void adam_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t step,
                 const AdamConfig& c, float grad_scale = 1.0f, const Tensor& out16 = {});

// ---------------------------------------------------------------------------------------------
// SGD (torch.optim.SGD semantics).

struct SgdConfig {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0 (as torch)
};

// One fused SGD step. With g = grad_scale * g_in:
//   if (wd) g += wd * p
//   if (momentum) {
//     buf = (first_momentum_step ? g : momentum * buf + (1 - dampening) * g)
//     g = nesterov ? g + momentum * buf : buf
//   }
//   p -= lr * g
// `momentum_buf` may be nullptr only when momentum == 0. `first_momentum_step` is true on the
// first step that uses the buffer: torch initialises it with the gradient there (no dampening).
void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, bool first_momentum_step,
                const SgdConfig& c, float grad_scale = 1.0f, void* out16 = nullptr,
                DType out16_dtype = DType::bf16);

// ---------------------------------------------------------------------------------------------
// Lamb (DeepSpeed's FusedLamb). By default the current DeepSpeed formula: the moments are
// bias-corrected before the update whose norm sets the trust ratio (LAMB paper, Algorithm 2).
// DeepSpeed up to 0.16.x instead folded the corrections into the step size,
// p -= lr * sqrt(bc2) / bc1 * coeff * (m / (sqrt(v) + eps) + wd * p), which rescales the trust-
// ratio-normalised step (at step 1 by ~0.32); legacy_bias_correction reproduces that.

struct LambConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_coeff = 10.0f;  // the trust ratio is clamped to [min_coeff, max_coeff]
  float min_coeff = 0.01f;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;         // FusedLamb's eps_inside_sqrt: sqrt(v_hat + eps)
  bool legacy_bias_correction = false;  // DeepSpeed <= 0.16.x formula, see above
};

// One parameter tensor's range inside the flat buffer. Segments must be sorted, must not overlap
// and must lie inside [0, n); elements covered by no segment are left untouched (padding).
// numel == 0 is allowed (a tensor that has no elements in this rank's partition), so that every
// rank can pass the same segment list and all-reduce the per-segment norms.
struct Segment {
  int64_t offset = 0;
  int64_t numel = 0;
};

// Lamb phase 1: updates m and v, and for each segment s writes w2[s] = sum(p^2) and
// u2[s] = sum(update^2) (double, summed in a fixed tile order: thread-count independent), where
//   g = grad_scale * g_in
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//   update = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p    (sqrt(v / bc2 + eps) if eps_inside_sqrt)
// Under ZeRO, sum w2 and u2 over the ranks before phase 2.
void lamb_moments(const float* p, const float* g, float* m, float* v, int64_t n,
                  std::span<const Segment> segments, int64_t step, const LambConfig& c,
                  float grad_scale, double* w2, double* u2);

// The trust ratio of one segment: ||p|| / ||update||, clamped to [min_coeff, max_coeff];
// 1 when either norm is 0 (FusedLamb).
float lamb_trust_ratio(double w2, double u2, const LambConfig& c);

// Lamb phase 2: recomputes each element's update from (p, m, v) and applies
//   p -= lr * coeff[s] * update      (legacy: lr * sqrt(bc2) / bc1 * coeff[s] * update)
// for the segment s that holds it; writes out16 as adam_update does.
void lamb_apply(float* p, const float* m, const float* v, int64_t n,
                std::span<const Segment> segments, int64_t step, const LambConfig& c,
                const float* coeffs, void* out16 = nullptr, DType out16_dtype = DType::bf16);

// Both phases for a buffer held entirely by this process. coeffs_out (segments.size() floats,
// optional) receives the trust ratios used (DeepSpeed's get_lamb_coeffs()).
void lamb_update(float* p, const float* g, float* m, float* v, int64_t n,
                 std::span<const Segment> segments, int64_t step, const LambConfig& c,
                 float grad_scale = 1.0f, void* out16 = nullptr, DType out16_dtype = DType::bf16,
                 float* coeffs_out = nullptr);

// Each throws ds::Error naming the field that is out of range (lr < 0, beta outside [0, 1), ...).
// The kernels check on every call; constructors of the Optimizer classes check up front.
void check_config(const AdamConfig& c);
void check_config(const SgdConfig& c);
void check_config(const LambConfig& c);

// ---------------------------------------------------------------------------------------------
// SIMD path selection (process-wide). The best path the CPU supports is used, unless the
// environment variable DS_SIMD=scalar|avx2|avx512 (read on first use) or set_simd_path() says
// otherwise. Tests and benchmarks use this to compare paths.

enum class SimdPath { scalar, avx2, avx512 };

const char* simd_path_name(SimdPath p);  // "scalar", "avx2", "avx512"
bool simd_path_supported(SimdPath p);    // by this CPU (and OS)
SimdPath best_simd_path();
SimdPath simd_path();  // the one in use
// Throws when the CPU lacks the path.
void set_simd_path(SimdPath p);

// Elements per tile: the unit of work handed to a thread (64 KiB of each fp32 stream).
inline constexpr int64_t kTileElems = 16384;

}  // namespace ds::optim
