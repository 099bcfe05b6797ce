// DeepSpeed's OnebitAdam (include/ds/optim/onebit.h; deepspeed/runtime/fp16/onebit/adam.py).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "ds/optim/onebit.h"
#include "onebit_internal.h"

namespace ds::optim {
namespace {

AdamConfig adam_config(const OneBitAdamConfig& c) {
  return detail::onebit_adam_config(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay);
}

}  // namespace

void CompressedOptimizer::set_group(std::shared_ptr<comm::Group> group) {
  DS_CHECK(group != nullptr, "[optim] {}: null group", name());
  DS_CHECK(step_count_ == 0 || group->size() == group_->size(),
           "[optim] {}: the group changes size after the first step", name());
  group_ = std::move(group);
}

void CompressedOptimizer::set_segments(std::span<const Segment> segments) {
  segments_.assign(segments.begin(), segments.end());
  used_end_ = 0;
  for (const Segment& sg : segments_) used_end_ = std::max(used_end_, sg.offset + sg.numel);
}

void CompressedOptimizer::zero_padding(float* buf) const {
  if (used_end_ < 0 || n_ <= used_end_) return;
  std::fill(buf + used_end_, buf + n_, 0.0f);
}

void CompressedOptimizer::mask_unseen(float* buf, const float* v) const {
  parallel_for(n_, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (v[i] == 0.0f) buf[i] = 0.0f;
  });
}

OneBitAdam::OneBitAdam(const OneBitAdamConfig& c) : c_(c) {
  check_config(adam_config(c_));
  DS_CHECK(c_.freeze_step >= 0, "[optim] OneBitAdam: freeze_step must be >= 0, got {}",
           c_.freeze_step);
}

void OneBitAdam::set_lr(float lr) {
  OneBitAdamConfig c = c_;
  c.lr = lr;
  check_config(adam_config(c));
  c_ = c;
}

void OneBitAdam::set_weight_decay(float wd) {
  OneBitAdamConfig c = c_;
  c.weight_decay = wd;
  check_config(adam_config(c));
  c_ = c;
}

void OneBitAdam::set_betas(float beta1, float beta2) {
  OneBitAdamConfig c = c_;
  c.beta1 = beta1;
  c.beta2 = beta2;
  check_config(adam_config(c));
  c_ = c;
}

bool OneBitAdam::compressed_step(int64_t t) const {
  // DeepSpeed switches after the step whose count reaches freeze_step; step 1 (initialisation)
  // returns before that check, so step 2 is always a warm-up step.
  return t > std::max<int64_t>(c_.freeze_step, 2);
}

std::vector<StateBuffer> OneBitAdam::state_buffers() {
  if (n_ < 0) return {};
  return {{"exp_avg", buffer(0), n_}, {"exp_avg_sq", buffer(1), n_}};
}

void OneBitAdam::ensure_compressor() {
  if (car_ && car_->numel() == n_) return;
  car_.emplace(group_, n_);
  worker_error_.assign(static_cast<size_t>(car_->padded_numel()), 0.0f);
  server_error_.assign(static_cast<size_t>(car_->chunk_numel()), 0.0f);
}

std::vector<StateBuffer> OneBitAdam::rank_state_buffers() {
  if (n_ < 0) return {};
  ensure_compressor();
  return {{"worker_error", worker_error_.data(), static_cast<int64_t>(worker_error_.size())},
          {"server_error", server_error_.data(), static_cast<int64_t>(server_error_.size())}};
}

void OneBitAdam::reset_rank_state() {
  if (n_ < 0) return;
  ensure_compressor();
  std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
  std::fill(server_error_.begin(), server_error_.end(), 0.0f);
}

void OneBitAdam::do_step(float* params, const float* grads, float grad_scale, void* out16,
                         DType out16_dtype) {
  const AdamConfig a = adam_config(c_);
  if (step_count_ == 1) return;  // DeepSpeed's initialisation step updates nothing
  if (!compressed_step(step_count_)) {
    adam_update(params, grads, buffer(0), buffer(1), n_, step_count_, a, grad_scale, out16,
                out16_dtype);
    return;
  }
  ensure_compressor();
  const detail::AdamConsts k = detail::adam_consts(step_count_, a, grad_scale);
  detail::momentum_update(buffer(0), grads, n_, k);
  if (group_->size() > 1)  // DeepSpeed compresses only with several ranks
    car_->run(buffer(0), worker_error_.data(), server_error_.data(),
              fmt::format("OneBitAdam step {} exp_avg", step_count_));
  zero_padding(buffer(0));
  mask_unseen(buffer(0), buffer(1));
  detail::frozen_variance_apply(params, buffer(0), buffer(1), n_, k, out16, out16_dtype);
}

std::map<std::string, double> OneBitAdam::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  s["weight_decay"] = c_.weight_decay;
  return s;
}

void OneBitAdam::load_scalar_state(const std::map<std::string, double>& s) {
  OneBitAdamConfig c = c_;
  std::map<std::string, double> rest;
  for (const auto& [k, v] : s) {
    const auto f = static_cast<float>(v);
    if (k == "lr")
      c.lr = f;
    else if (k == "beta1")
      c.beta1 = f;
    else if (k == "beta2")
      c.beta2 = f;
    else if (k == "eps")
      c.eps = f;
    else if (k == "weight_decay")
      c.weight_decay = f;
    else
      rest.emplace(k, v);
  }
  check_config(adam_config(c));
  Optimizer::load_scalar_state(rest);
  c_ = c;
}

std::unique_ptr<Optimizer> make_onebit_optimizer(std::string_view type, const OptimizerParams& p) {
  std::string t(type);
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "onebitadam") {
    OneBitAdamConfig c;
    c.lr = p.lr;
    c.beta1 = p.beta1;
    c.beta2 = p.beta2;
    c.eps = p.eps;
    c.weight_decay = p.weight_decay;
    c.freeze_step = p.onebit.freeze_step;
    return std::make_unique<OneBitAdam>(c);
  }
  if (t == "zerooneadam") {
    ZeroOneAdamConfig c;
    c.lr = p.lr;
    c.beta1 = p.beta1;
    c.beta2 = p.beta2;
    c.eps = p.eps;
    c.weight_decay = p.weight_decay;
    c.var_freeze_step = p.onebit.var_freeze_step;
    c.var_update_scaler = p.onebit.var_update_scaler;
    c.local_step_scaler = p.onebit.local_step_scaler;
    c.local_step_clipper = p.onebit.local_step_clipper;
    return std::make_unique<ZeroOneAdam>(c);
  }
  if (t == "onebitlamb") {
    OneBitLambConfig c;
    c.lr = p.lr;
    c.beta1 = p.beta1;
    c.beta2 = p.beta2;
    c.eps = p.eps;
    c.weight_decay = p.weight_decay;
    c.max_coeff = p.max_coeff;
    c.min_coeff = p.min_coeff;
    c.freeze_step = p.onebit.freeze_step;
    c.coeff_beta = p.onebit.coeff_beta;
    c.factor_max = p.onebit.factor_max;
    c.factor_min = p.onebit.factor_min;
    c.factor_threshold = p.onebit.factor_threshold;
    return std::make_unique<OneBitLamb>(c);
  }
  return nullptr;
}

}  // namespace ds::optim
