// DeepSpeed's OnebitLamb (include/ds/optim/onebit.h; deepspeed/runtime/fp16/onebit/lamb.py).
#include <cmath>

#include "onebit_internal.h"

namespace ds::optim {
namespace {

void check(const OneBitLambConfig& c) {
  LambConfig l;
  l.lr = c.lr;
  l.beta1 = c.beta1;
  l.beta2 = c.beta2;
  l.eps = c.eps;
  l.weight_decay = c.weight_decay;
  l.max_coeff = c.max_coeff;
  l.min_coeff = c.min_coeff;
  check_config(l);
  DS_CHECK(c.freeze_step >= 0, "[optim] OneBitLamb: freeze_step must be >= 0, got {}",
           c.freeze_step);
  DS_CHECK(c.coeff_beta >= 0 && c.coeff_beta < 1,
           "[optim] OneBitLamb: coeff_beta {} outside [0, 1)", c.coeff_beta);
  DS_CHECK(c.factor_min > 0 && c.factor_min <= c.factor_max && c.factor_threshold >= 0,
           "[optim] OneBitLamb: needs 0 < factor_min <= factor_max and factor_threshold >= 0 "
           "(got {}, {}, {})",
           c.factor_min, c.factor_max, c.factor_threshold);
}

double sum_sq(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace

OneBitLamb::OneBitLamb(const OneBitLambConfig& c) : c_(c) {
  check(c_);
}

void OneBitLamb::set_lr(float lr) {
  OneBitLambConfig c = c_;
  c.lr = lr;
  check(c);
  c_ = c;
}

void OneBitLamb::set_weight_decay(float wd) {
  OneBitLambConfig c = c_;
  c.weight_decay = wd;
  check(c);
  c_ = c;
}

void OneBitLamb::set_betas(float beta1, float beta2) {
  OneBitLambConfig c = c_;
  c.beta1 = beta1;
  c.beta2 = beta2;
  check(c);
  c_ = c;
}

std::vector<StateBuffer> OneBitLamb::state_buffers() {
  if (n_ < 0) return {};
  return {{"exp_avg", buffer(0), n_},
          {"exp_avg_sq", buffer(1), n_},
          {"exp_avg_sq_fresh", buffer(2), n_}};
}

void OneBitLamb::ensure_compressor() {
  if (car_ && car_->numel() == n_) return;
  car_.emplace(group_, n_);
  worker_error_.assign(static_cast<size_t>(car_->padded_numel()), 0.0f);
  server_error_.assign(static_cast<size_t>(car_->chunk_numel()), 0.0f);
}

std::vector<StateBuffer> OneBitLamb::rank_state_buffers() {
  if (n_ < 0) return {};
  ensure_compressor();
  return {{"worker_error", worker_error_.data(), static_cast<int64_t>(worker_error_.size())},
          {"server_error", server_error_.data(), static_cast<int64_t>(server_error_.size())}};
}

void OneBitLamb::reset_rank_state() {
  if (n_ < 0) return;
  ensure_compressor();
  std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
  std::fill(server_error_.begin(), server_error_.end(), 0.0f);
}

std::vector<Segment> OneBitLamb::tensors() const {
  if (!segments_.empty()) return segments_;
  return {Segment{0, n_}};
}

void OneBitLamb::warmup_step(float* params, const float* grads, float grad_scale) {
  float *m = buffer(0), *v = buffer(1);
  const float b1 = c_.beta1, b2 = c_.beta2, wd = c_.weight_decay;
  const auto segs = tensors();
  for (size_t s = 0; s < segs.size(); ++s) {
    const int64_t o = segs[s].offset, len = segs[s].numel;
    double w2 = 0.0, u2 = 0.0;
    for (int64_t i = o; i < o + len; ++i) {
      const float g = grads[i] * grad_scale;
      m[i] = m[i] * b1 + (1.0f - b1) * g;
      v[i] = v[i] * b2 + (1.0f - b2) * g * g;
      float u = m[i] / (std::sqrt(v[i]) + c_.eps);
      if (wd > 0.0f) u += wd * params[i];
      w2 += static_cast<double>(params[i]) * params[i];
      u2 += static_cast<double>(u) * u;
    }
    double coeff = 1.0;
    if (w2 != 0.0 && u2 != 0.0)
      coeff = std::clamp(std::sqrt(w2) / std::sqrt(u2), double{c_.min_coeff}, double{c_.max_coeff});
    TensorState& st = ts_[s];
    if (coeff != 1.0)
      st.lamb_coeff_freeze = c_.coeff_beta * st.lamb_coeff_freeze + (1.0 - c_.coeff_beta) * coeff;
    coeffs_[s] = static_cast<float>(coeff);
    const auto step = static_cast<float>(-double{c_.lr} * coeff);
    for (int64_t i = o; i < o + len; ++i) {
      float u = m[i] / (std::sqrt(v[i]) + c_.eps);
      if (wd > 0.0f) u += wd * params[i];
      params[i] += step * u;
    }
  }
  if (step_count_ == c_.freeze_step) std::copy(v, v + n_, buffer(2));
}

void OneBitLamb::set_scaling_coeffs() {
  // Each tensor's momentum scaled to the tensors' mean RMS, so one scale compresses them well.
  const float* m = buffer(0);
  const auto segs = tensors();
  std::vector<double> rms(segs.size(), 0.0);
  double total = 0.0;
  for (size_t s = 0; s < segs.size(); ++s) {
    const int64_t len = std::max<int64_t>(segs[s].numel, 1);
    rms[s] = std::sqrt(sum_sq(m + segs[s].offset, segs[s].numel)) / std::sqrt(double(len));
    total += rms[s];
  }
  const double united = total / static_cast<double>(std::max<size_t>(segs.size(), 1));
  // A tensor whose momentum is all zeros keeps 1 (DeepSpeed would divide by zero).
  for (size_t s = 0; s < segs.size(); ++s)
    ts_[s].scaling_coeff = rms[s] > 0.0 ? united / rms[s] : 1.0;
  scaled_ = true;
}

void OneBitLamb::compression_step(float* params, const float* grads, float grad_scale) {
  float *m = buffer(0), *v = buffer(1), *vf = buffer(2);
  const float b1 = c_.beta1, b2 = c_.beta2, wd = c_.weight_decay, eps = c_.eps;
  if (!scaled_) set_scaling_coeffs();
  last_m_.assign(m, m + n_);
  const auto segs = tensors();
  for (size_t s = 0; s < segs.size(); ++s) {
    const auto k = static_cast<float>(ts_[s].scaling_coeff);
    for (int64_t i = segs[s].offset; i < segs[s].offset + segs[s].numel; ++i)
      m[i] = (m[i] * b1 + (1.0f - b1) * (grads[i] * grad_scale)) * k;
  }
  if (group_->size() > 1) {
    ensure_compressor();
    car_->run(m, worker_error_.data(), server_error_.data(),
              fmt::format("OneBitLamb step {} exp_avg", step_count_));
    zero_padding(m);
    mask_unseen(m, v);
  }
  for (size_t s = 0; s < segs.size(); ++s) {
    const int64_t o = segs[s].offset, len = segs[s].numel;
    const auto k = static_cast<float>(ts_[s].scaling_coeff);
    double u2 = 0.0, p2 = 0.0;  // ||update||^2, ||update_prelim||^2
    float factor = 0.0f;        // max(denom / denom_real)
    for (int64_t i = o; i < o + len; ++i) {
      m[i] /= k;
      const float gr = (m[i] - last_m_[i] * b1) / (1.0f - b1);
      vf[i] = vf[i] * b2 + (1.0f - b2) * gr * gr;
      const float denom = std::sqrt(v[i]) + eps;
      const float prelim = m[i] / denom;
      const float u = wd > 0.0f ? prelim + wd * params[i] : prelim;
      p2 += static_cast<double>(prelim) * prelim;
      u2 += static_cast<double>(u) * u;
      factor = std::max(factor, denom / (std::sqrt(vf[i]) + eps));
    }
    TensorState& st = ts_[s];
    double f = factor;
    if (wd > 0.0f && u2 > 0.0) {
      const double ratio = std::min(1.0, std::sqrt(p2) / std::sqrt(u2));
      f = f * ratio + (1.0 - ratio);
    }
    f = std::clamp(f, double{c_.factor_min}, double{c_.factor_max});
    f = std::clamp(f, st.last_factor * (1.0 - c_.factor_threshold),
                   st.last_factor * (1.0 + c_.factor_threshold));
    st.last_factor = f;
    const double coeff = st.lamb_coeff_freeze * f;
    coeffs_[s] = static_cast<float>(coeff);
    const auto step = static_cast<float>(-double{c_.lr} * coeff);
    for (int64_t i = o; i < o + len; ++i) {
      const float prelim = m[i] / (std::sqrt(v[i]) + eps);
      params[i] += step * (wd > 0.0f ? prelim + wd * params[i] : prelim);
    }
  }
}

void OneBitLamb::do_step(float* params, const float* grads, float grad_scale, void* out16,
                         DType out16_dtype) {
  const size_t count = tensors().size();
  if (ts_.size() != count) ts_.resize(count);
  coeffs_.assign(count, 1.0f);
  if (step_count_ == 1) return;  // DeepSpeed's initialisation step updates nothing
  if (!compressed_step(step_count_))
    warmup_step(params, grads, grad_scale);
  else
    compression_step(params, grads, grad_scale);
  detail::write_out16(params, n_, out16, out16_dtype);
}

std::map<std::string, double> OneBitLamb::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  s["weight_decay"] = c_.weight_decay;
  s["scaled"] = scaled_ ? 1.0 : 0.0;
  for (size_t i = 0; i < ts_.size(); ++i) {
    s[fmt::format("lamb_coeff_freeze.{}", i)] = ts_[i].lamb_coeff_freeze;
    s[fmt::format("last_factor.{}", i)] = ts_[i].last_factor;
    s[fmt::format("scaling_coeff.{}", i)] = ts_[i].scaling_coeff;
  }
  return s;
}

void OneBitLamb::load_scalar_state(const std::map<std::string, double>& s) {
  OneBitLambConfig c = c_;
  std::map<std::string, double> rest;
  std::vector<TensorState> ts = ts_;
  auto per_tensor = [&](const std::string& key, const char* name, double v) {
    const std::string prefix = std::string(name) + ".";
    if (key.rfind(prefix, 0) != 0) return false;
    const size_t i = std::stoul(key.substr(prefix.size()));
    if (ts.size() <= i) ts.resize(i + 1);
    if (std::string(name) == "lamb_coeff_freeze") ts[i].lamb_coeff_freeze = v;
    if (std::string(name) == "last_factor") ts[i].last_factor = v;
    if (std::string(name) == "scaling_coeff") ts[i].scaling_coeff = v;
    return true;
  };
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
    else if (key == "scaled")
      scaled_ = v != 0;
    else if (!per_tensor(key, "lamb_coeff_freeze", v) && !per_tensor(key, "last_factor", v) &&
             !per_tensor(key, "scaling_coeff", v))
      rest.emplace(key, v);
  }
  check(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
  ts_ = ts;
}

}  // namespace ds::optim
