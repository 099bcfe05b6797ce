// DeepSpeed's ZeroOneAdam, 0/1 Adam (include/ds/optim/onebit.h;
// deepspeed/runtime/fp16/onebit/zoadam.py).
#include <cmath>

#include "onebit_internal.h"

namespace ds::optim {
namespace {

AdamConfig adam_config(const ZeroOneAdamConfig& c) {
  return detail::onebit_adam_config(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay);
}

void check(const ZeroOneAdamConfig& c) {
  check_config(adam_config(c));
  DS_CHECK(c.var_freeze_step >= 0, "[optim] ZeroOneAdam: var_freeze_step must be >= 0, got {}",
           c.var_freeze_step);
  DS_CHECK(c.var_update_scaler >= 1 && c.local_step_scaler >= 1 && c.local_step_clipper >= 1,
           "[optim] ZeroOneAdam: var_update_scaler, local_step_scaler and local_step_clipper must "
           "be >= 1 (got {}, {}, {})",
           c.var_update_scaler, c.local_step_scaler, c.local_step_clipper);
}

// Both moments from the averaged gradient, as adam_update does (m, v, g: (n,)).
void adam_moments(float* m, float* v, const float* g, int64_t n, const detail::AdamConsts& k) {
  parallel_for(n, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i] * k.grad_scale;
      m[i] = std::fma(gi, k.one_minus_beta1, m[i] * k.beta1);
      v[i] = std::fma(gi * gi, k.one_minus_beta2, v[i] * k.beta2);
    }
  });
}

// update = m / (sqrt(v) + eps) + wd * p;  p -= lr * update;  u -= lr * update when u is given.
void apply_update(float* p, float* u, const float* m, const float* v, int64_t n, float lr,
                  float eps, float wd) {
  parallel_for(n, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float update = m[i] / (std::sqrt(v[i]) + eps);
      if (wd > 0.0f) update = std::fma(wd, p[i], update);
      p[i] = std::fma(update, -lr, p[i]);
      if (u) u[i] = std::fma(update, -lr, u[i]);
    }
  });
}

}  // namespace

ZeroOneAdam::ZeroOneAdam(const ZeroOneAdamConfig& c) : c_(c) {
  check(c_);
}

void ZeroOneAdam::set_lr(float lr) {
  ZeroOneAdamConfig c = c_;
  c.lr = lr;
  check(c);
  c_ = c;
}

void ZeroOneAdam::set_weight_decay(float wd) {
  ZeroOneAdamConfig c = c_;
  c.weight_decay = wd;
  check(c);
  c_ = c;
}

void ZeroOneAdam::set_betas(float beta1, float beta2) {
  ZeroOneAdamConfig c = c_;
  c.beta1 = beta1;
  c.beta2 = beta2;
  check(c);
  c_ = c;
}

std::vector<StateBuffer> ZeroOneAdam::state_buffers() {
  if (n_ < 0) return {};
  return {{"exp_avg", buffer(0), n_},
          {"exp_avg_sq", buffer(1), n_},
          {"momentum_accumulator", buffer(2), n_}};
}

void ZeroOneAdam::ensure_compressor() {
  if (car_ && car_->numel() == n_) return;
  car_.emplace(group_, n_);
  worker_error_.assign(static_cast<size_t>(car_->padded_numel()), 0.0f);
  server_error_.assign(static_cast<size_t>(car_->chunk_numel()), 0.0f);
}

std::vector<StateBuffer> ZeroOneAdam::rank_state_buffers() {
  if (n_ < 0) return {};
  ensure_compressor();
  // After the freeze m and u are each rank's own between synchronisations.
  return {{"worker_error", worker_error_.data(), static_cast<int64_t>(worker_error_.size())},
          {"server_error", server_error_.data(), static_cast<int64_t>(server_error_.size())},
          {"rank_exp_avg", buffer(0), n_},
          {"rank_momentum_accumulator", buffer(2), n_}};
}

void ZeroOneAdam::reset_rank_state() {
  if (n_ < 0) return;
  ensure_compressor();
  std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
  std::fill(server_error_.begin(), server_error_.end(), 0.0f);
}

void ZeroOneAdam::compress(float* buf, const char* what) {
  ensure_compressor();
  if (group_->size() > 1) {
    car_->run(buf, worker_error_.data(), server_error_.data(),
              fmt::format("ZeroOneAdam step {} {}", step_count_, what));
    zero_padding(buf);
    mask_unseen(buf, buffer(1));
  }
}

void ZeroOneAdam::sync_local_steps(float* params) {
  // Undo the local updates, average their sum (in gradient units) and apply it instead; the
  // momentum becomes the average update per unit of learning rate.
  float* m = buffer(0);
  const float* v = buffer(1);
  float* u = buffer(2);
  const float eps = c_.eps;
  parallel_for(n_, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      params[i] -= u[i];
      u[i] *= std::sqrt(v[i]) + eps;
    }
  });
  compress(u, "momentum_accumulator");
  const auto lrs = static_cast<float>(lrs_);
  parallel_for(n_, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      m[i] = -(u[i] / lrs);
      params[i] += u[i] / (std::sqrt(v[i]) + eps);
      u[i] = 0.0f;
    }
  });
  lrs_ = 0.0;
}

void ZeroOneAdam::advance_schedules() {
  const int64_t t = step_count_;
  if (!freeze_) {
    if (t % var_interval_ == 0 && ++var_counter_ == c_.var_update_scaler) {
      var_counter_ = 0;
      var_interval_ *= 2;
    }
    allreduce_next_ = (t + 1) % var_interval_ == 0;
  } else if (++local_step_counter_ == c_.local_step_scaler) {
    local_step_counter_ = 0;
    local_step_interval_ = std::min(c_.local_step_clipper, local_step_interval_ * 2);
  }
  if (t > c_.var_freeze_step) {
    freeze_ = true;
    allreduce_next_ = false;
  }
  if (freeze_ && !errors_reset_) {
    // The errors now feed a different quantity (the accumulated update, not gradients).
    reset_rank_state();
    errors_reset_ = true;
  }
}

void ZeroOneAdam::do_step(float* params, const float* grads, float grad_scale, void* out16,
                          DType out16_dtype) {
  const int64_t t = step_count_;
  if (t == 1) return;  // DeepSpeed's initialisation step updates nothing
  const detail::AdamConsts k = detail::adam_consts(t, adam_config(c_), grad_scale);
  float* m = buffer(0);
  float* v = buffer(1);
  if (!freeze_ && t % var_interval_ == 0) {
    adam_moments(m, v, grads, n_, k);  // the engine averaged these gradients
  } else if (!freeze_) {
    local_g_.resize(static_cast<size_t>(n_));
    parallel_for(n_, kTileElems, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) local_g_[i] = grads[i] * grad_scale;
    });
    compress(local_g_.data(), "gradient");
    detail::AdamConsts unit = k;
    unit.grad_scale = 1.0f;
    detail::momentum_update(m, local_g_.data(), n_, unit);
  } else {
    detail::momentum_update(m, grads, n_, k);
    lrs_ += c_.lr;
  }
  apply_update(params, freeze_ ? buffer(2) : nullptr, m, v, n_, c_.lr, c_.eps, c_.weight_decay);
  if (freeze_ && t % local_step_interval_ == 0) sync_local_steps(params);
  detail::write_out16(params, n_, out16, out16_dtype);
  advance_schedules();
}

std::map<std::string, double> ZeroOneAdam::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  s["weight_decay"] = c_.weight_decay;
  s["var_interval"] = static_cast<double>(var_interval_);
  s["var_counter"] = static_cast<double>(var_counter_);
  s["local_step_interval"] = static_cast<double>(local_step_interval_);
  s["local_step_counter"] = static_cast<double>(local_step_counter_);
  s["lrs"] = lrs_;
  s["freeze"] = freeze_ ? 1.0 : 0.0;
  s["errors_reset"] = errors_reset_ ? 1.0 : 0.0;
  s["allreduce_next"] = allreduce_next_ ? 1.0 : 0.0;
  return s;
}

void ZeroOneAdam::load_scalar_state(const std::map<std::string, double>& s) {
  ZeroOneAdamConfig c = c_;
  std::map<std::string, double> rest;
  auto count = [](double v) { return static_cast<int64_t>(v); };
  for (const auto& [key, v] : s) {
    const auto f = static_cast<float>(v);
    if (key == "lr")
      c.lr = f;
    else if (key == "beta1")
      c.beta1 = f;
    else if (key == "beta2")
      c.beta2 = f;
    else if (key == "eps")
      c.eps = f;
    else if (key == "weight_decay")
      c.weight_decay = f;
    else if (key == "var_interval")
      var_interval_ = std::max<int64_t>(1, count(v));
    else if (key == "var_counter")
      var_counter_ = count(v);
    else if (key == "local_step_interval")
      local_step_interval_ = std::max<int64_t>(1, count(v));
    else if (key == "local_step_counter")
      local_step_counter_ = count(v);
    else if (key == "lrs")
      lrs_ = v;
    else if (key == "freeze")
      freeze_ = v != 0;
    else if (key == "errors_reset")
      errors_reset_ = v != 0;
    else if (key == "allreduce_next")
      allreduce_next_ = v != 0;
    else
      rest.emplace(key, v);
  }
  check(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
}

}  // namespace ds::optim
