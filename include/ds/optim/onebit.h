#pragma once
// DeepSpeed's 1-bit optimizers (deepspeed/runtime/fp16/onebit/): optimizers that do their own
// data-parallel communication. After a warm-up of plain Adam on averaged gradients, each rank
// updates its momentum with its LOCAL gradient and the momentum is averaged with the 1-bit
// compressed all-reduce with error feedback (comm/compressed.h), so the gradient all-reduce of
// the engine stops: each step then sends ~1/32 of an fp32 all-reduce's bus bytes.
//
//   auto opt = std::make_unique<OneBitAdam>(cfg);
//   opt->set_group(data_parallel_group);            // before the first step
//   per step: if (opt->wants_reduced_gradients()) all-reduce and average the gradients;
//             opt->step(params, grads, n, scale);   // a collective after the freeze
//
// The engine (runtime/engine.cpp) does this: it turns the strategy's gradient all-reduce off for
// the steps that do not want it (zero::Strategy::set_gradient_all_reduce) and passes each rank's
// own gradient then. ZeRO stage 0 only (every rank holds the whole optimizer range), as DeepSpeed.
//
// State: exp_avg and exp_avg_sq (n,) as Adam (plus each optimizer's own: momentum_accumulator,
// exp_avg_sq_fresh), the same on every rank (checkpointed once); and per rank the error-feedback
// buffers worker_error (padded,) and server_error (padded / N,), different on every rank
// (rank_state_buffers(): checkpointed by every rank).
//
// Threading: the training thread only; step() issues collectives on the group after the freeze,
// so every rank steps in the same order.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/comm/compressed.h"
#include "ds/comm/group.h"
#include "ds/optim/optimizer.h"

namespace ds::optim {

// An optimizer that averages over the data-parallel ranks itself (the 1-bit family).
class CompressedOptimizer : public Optimizer {
 public:
  // The data-parallel group; before the first step (default: a size-1 group).
  void set_group(std::shared_ptr<comm::Group> group);
  const std::shared_ptr<comm::Group>& group() const { return group_; }
  // Whether step step_count() + 1 takes gradients averaged over the ranks (the engine's
  // all-reduce: DeepSpeed's enable_backward_allreduce) or this rank's own gradient.
  virtual bool wants_reduced_gradients() const = 0;
  // Per-rank state (error feedback): different on every rank, so each rank saves its own. Empty
  // until the buffers exist (after init_state); their sizes depend on the group size.
  virtual std::vector<StateBuffer> rank_state_buffers() = 0;
  // Called with the per-rank state missing at a resume (written by another number of ranks, or
  // by DeepSpeed's reset policy): zeroes it, as DeepSpeed does at every load.
  virtual void reset_rank_state() = 0;
  // The tensors' segments; elements past the last one are padding, whose compressed values are
  // dropped (zeroed) so that no update reaches them.
  void set_segments(std::span<const Segment> segments) override;

 protected:
  // Zeroes buf[used_end_, n): the padding after the last tensor (after a compressed all-reduce,
  // which cannot represent zeros).
  void zero_padding(float* buf) const;
  // Zeroes buf[i] wherever v[i] == 0: elements that never had a gradient (the embedding rows of
  // tokens the data never holds). 1-bit compression cannot represent their zero momentum, and
  // m / (sqrt(0) + eps) would move them by lr * scale / eps every step; DeepSpeed asks the user
  // for this mask (exp_avg_mask), here it is the variance's own.
  void mask_unseen(float* buf, const float* v) const;
  std::shared_ptr<comm::Group> group_ = comm::single_process_group();
  std::vector<Segment> segments_;
  int64_t used_end_ = -1;  // -1: no segments given, the whole buffer is used
};

// OneBitAdam's keys (DeepSpeed's OnebitAdam arguments; docs/config.md).
struct OneBitAdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t freeze_step = 100000;  // warm-up steps of uncompressed Adam
};

// DeepSpeed's OnebitAdam (deepspeed/runtime/fp16/onebit/adam.py). Per step t (1-based), with
// g = grad_scale * grad:
//   t == 1            DeepSpeed's initialisation step: counted, nothing else changes
//   1 < t <= max(freeze_step, 2)   warm-up on averaged gradients: adam_update without bias
//                     correction, decoupled decay (m, v updated; bitwise Adam{bias_correction
//                     false, adam_w_mode true})
//   later             m = beta1 * m + (1 - beta1) * g   (g: this rank's gradient)
//                     m = compressed_all_reduce(m)      (every rank the same m)
//                     v frozen; p -= lr * wd * p; p -= lr * m / (sqrt(v) + eps)
// DeepSpeed's update never bias-corrects (bias_correction is accepted and ignored there and
// here); eps is added outside the square root. DeepSpeed's exp_avg_mask (a tensor from the Python
// param group) is derived here: the compressed momentum is zeroed where v == 0 (mask_unseen).
class OneBitAdam final : public CompressedOptimizer {
 public:
  explicit OneBitAdam(const OneBitAdamConfig& c);
  const char* name() const override { return "OneBitAdam"; }
  // exp_avg, exp_avg_sq and the error feedback (worker_error n, server_error n / N) as one more.
  int state_floats_per_param() const override { return 3; }
  const OneBitAdamConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.beta1; }
  void set_momentum(float m) override { set_betas(m, c_.beta2); }
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

  bool wants_reduced_gradients() const override { return !compressed_step(step_count_ + 1); }
  std::vector<StateBuffer> rank_state_buffers() override;
  void reset_rank_state() override;
  // Whether step t (1-based) runs compressed (after the freeze).
  bool compressed_step(int64_t t) const;

 private:
  void on_init_state() override { allocate_buffers(2); }
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  void ensure_compressor();
  OneBitAdamConfig c_;
  std::optional<comm::CompressedAllReduce> car_;
  std::vector<float> worker_error_, server_error_;  // (padded,), (padded / N,)
};

// ZeroOneAdam's keys (DeepSpeed's ZeroOneAdam arguments; docs/config.md).
struct ZeroOneAdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t var_freeze_step = 100000;   // after this step: variance frozen, local steps
  int64_t var_update_scaler = 16;     // variance updates per interval before it doubles
  int64_t local_step_scaler = 32678;  // steps before the local-step interval doubles
  int64_t local_step_clipper = 16;    // the local-step interval's cap
};

// DeepSpeed's ZeroOneAdam, 0/1 Adam (deepspeed/runtime/fp16/onebit/zoadam.py; arXiv:2202.06009).
// Step 1 is DeepSpeed's initialisation step (counted, nothing changes). Then, with t the step
// and g = grad_scale * grad, until t > var_freeze_step:
//   t % var_interval == 0   g averaged by the engine's all-reduce: v and m updated as Adam's
//   otherwise               g local: m = beta1 * m + (1 - beta1) * compressed_all_reduce(g)
//   the variance interval doubles after var_update_scaler variance updates; the engine
//   all-reduces the gradients of step t + 1 iff (t + 1) % var_interval == 0
// after it (no gradient all-reduce at all): m updated with the local g, lrs += lr, and every
// local_step_interval steps the accumulated update u (momentum_accumulator) is synchronised:
//   p -= u;  u = compressed_all_reduce(u * (sqrt(v) + eps));  m = -u / lrs;
//   p += u / (sqrt(v) + eps);  u = 0;  lrs = 0
// the interval doubling every local_step_scaler steps up to local_step_clipper. Each step:
// p -= lr * (m / (sqrt(v) + eps) + wd * p) (also added into u after the freeze). The error
// feedback restarts from zero at the freeze, as DeepSpeed's. With one rank the compressed
// all-reduce is the identity here (DeepSpeed skips the momentum update instead).
//
// Between synchronisations each rank's parameters, m and u are its own: exp_avg and
// momentum_accumulator are also saved per rank (rank_state_buffers), but the parameters in a
// checkpoint are rank 0's, so a resume after var_freeze_step is not bitwise (DeepSpeed saves
// rank 0's too); before it, it is.
class ZeroOneAdam final : public CompressedOptimizer {
 public:
  explicit ZeroOneAdam(const ZeroOneAdamConfig& c);
  const char* name() const override { return "ZeroOneAdam"; }
  // exp_avg, exp_avg_sq, momentum_accumulator and the error feedback as one more.
  int state_floats_per_param() const override { return 4; }
  const ZeroOneAdamConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.beta1; }
  void set_momentum(float m) override { set_betas(m, c_.beta2); }
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  std::vector<std::string> state_names() const override {
    return {"exp_avg", "exp_avg_sq", "momentum_accumulator"};
  }
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

  bool wants_reduced_gradients() const override { return allreduce_next_; }
  std::vector<StateBuffer> rank_state_buffers() override;
  void reset_rank_state() override;
  // After var_freeze_step: local steps, variance frozen.
  bool frozen() const { return freeze_; }
  int64_t var_interval() const { return var_interval_; }
  int64_t local_step_interval() const { return local_step_interval_; }

 private:
  void on_init_state() override { allocate_buffers(3); }
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  void ensure_compressor();
  void compress(float* buf, const char* what);
  void sync_local_steps(float* params);
  void advance_schedules();
  ZeroOneAdamConfig c_;
  std::optional<comm::CompressedAllReduce> car_;
  std::vector<float> worker_error_, server_error_;  // (padded,), (padded / N,)
  std::vector<float> local_g_;                      // (n,) scratch: the scaled local gradient
  int64_t var_interval_ = 1, var_counter_ = 0;
  int64_t local_step_interval_ = 1, local_step_counter_ = 0;
  double lrs_ = 0.0;  // learning rates summed since the last synchronisation
  bool freeze_ = false, errors_reset_ = false, allreduce_next_ = true;
};

// OneBitLamb's keys (DeepSpeed's OnebitLamb arguments; docs/config.md).
struct OneBitLambConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_coeff = 10.0f;  // the warm-up trust ratio is clamped to [min_coeff, max_coeff]
  float min_coeff = 0.01f;
  int64_t freeze_step = 100000;
  float coeff_beta = 0.9f;  // moving average of the warm-up trust ratios
  float factor_max = 4.0f;  // the compression stage's ratio factor bounds
  float factor_min = 0.5f;
  float factor_threshold = 0.1f;  // largest relative change of the factor per step
};

// DeepSpeed's OnebitLamb (deepspeed/runtime/fp16/onebit/lamb.py; arXiv:2104.06069). Per tensor
// (the segments), with t the step and g = grad_scale * grad:
//   t == 1           initialisation: counted, nothing changes
//   warm-up          Lamb without bias correction on averaged gradients: m, v updated;
//                    update = m / (sqrt(v) + eps) + wd * p; coeff = clamp(||p|| / ||update||);
//                    p -= lr * coeff * update; the trust ratios' moving average (coeff_beta) kept
//                    per tensor; at t == freeze_step v_fresh = v
//   compressed       (from the step after max(freeze_step, 2)) at the first such step every
//                    tensor's momentum gets a scaling coefficient (the mean of the tensors'
//                    ||m|| / sqrt(numel) over its own); m = beta1 m + (1 - beta1) g (local g),
//                    scaled, compressed-all-reduced over the whole buffer, unscaled; v frozen,
//                    v_fresh updated from the gradient reconstructed from m; the trust ratio is
//                    the frozen average times a factor max((sqrt(v) + eps) / (sqrt(v_fresh) + eps))
//                    (mixed with 1 by the update's decay share, clamped to [factor_min,
//                    factor_max] and to +-factor_threshold of the last one).
// Set the segments before the first step (the engine does), or the whole buffer is one tensor.
class OneBitLamb final : public CompressedOptimizer {
 public:
  explicit OneBitLamb(const OneBitLambConfig& c);
  const char* name() const override { return "OneBitLamb"; }
  // exp_avg, exp_avg_sq, exp_avg_sq_fresh and the error feedback as one more.
  int state_floats_per_param() const override { return 4; }
  const OneBitLambConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.beta1; }
  void set_momentum(float m) override { set_betas(m, c_.beta2); }
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  std::vector<std::string> state_names() const override {
    return {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"};
  }
  std::vector<StateBuffer> state_buffers() override;
  // Also per tensor: lamb_coeff_freeze.<i>, last_factor.<i>, scaling_coeff.<i>.
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

  bool wants_reduced_gradients() const override { return !compressed_step(step_count_ + 1); }
  std::vector<StateBuffer> rank_state_buffers() override;
  void reset_rank_state() override;
  bool compressed_step(int64_t t) const { return t > std::max<int64_t>(c_.freeze_step, 2); }
  // The trust ratios of the last step, one per tensor (DeepSpeed's get_lamb_coeffs()).
  const std::vector<float>& lamb_coeffs() const { return coeffs_; }

 private:
  struct TensorState {
    double lamb_coeff_freeze = 0.0, last_factor = 1.0, scaling_coeff = 0.0;
  };
  void on_init_state() override { allocate_buffers(3); }
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  void ensure_compressor();
  std::vector<Segment> tensors() const;
  void warmup_step(float* params, const float* grads, float grad_scale);
  void compression_step(float* params, const float* grads, float grad_scale);
  void set_scaling_coeffs();
  OneBitLambConfig c_;
  std::optional<comm::CompressedAllReduce> car_;
  std::vector<float> worker_error_, server_error_;
  std::vector<float> last_m_;  // (n,) scratch: m before this step
  std::vector<TensorState> ts_;
  bool scaled_ = false;  // the scaling coefficients are set (the first compressed step)
  std::vector<float> coeffs_;
};

// The 1-bit optimizer named by `type` ("OneBitAdam", "ZeroOneAdam", "OneBitLamb";
// case-insensitive), or nullptr when `type`
// names none. make_optimizer() delegates here.
std::unique_ptr<Optimizer> make_onebit_optimizer(std::string_view type, const OptimizerParams& p);

}  // namespace ds::optim
