// muP's per-tensor lr and weight-decay multipliers over Adam, AdamW and SGD (optim/mup.h).
#include "ds/optim/mup.h"

#include <cmath>

#include "optim_internal.h"

namespace ds::optim {

MupScale mup_scale(MupKind kind, std::span<const int64_t> shape, std::span<const int64_t> base) {
  DS_CHECK(shape.size() == base.size(), "[mup] the base shape has {} dimensions, the tensor {}",
           base.size(), shape.size());
  // mup's InfDim: a dimension equal to the base's is finite (multiplier 1).
  auto mult = [&](size_t i) {
    DS_CHECK(base[i] > 0, "[mup] base dimension {} must be > 0", base[i]);
    return shape[i] == base[i] ? 1.0 : static_cast<double>(shape[i]) / static_cast<double>(base[i]);
  };
  int ninf = 0;
  double main = 1.0;  // the last width dimension's multiplier (a matrix's fan-in)
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != base[i]) {
      ++ninf;
      main = mult(i);
    }
  DS_CHECK(ninf <= 2, "[mup] more than 2 width dimensions are not supported (as in mup)");
  MupScale s;
  if (kind != MupKind::sgd) {
    if (ninf == 2) {
      s.lr = static_cast<float>(1.0 / main);
      s.weight_decay = static_cast<float>(main);
    }
  } else if (ninf == 1) {
    s.lr = static_cast<float>(main);
    s.weight_decay = static_cast<float>(1.0 / main);
  } else if (ninf == 2) {
    const double r = mult(1) / mult(0);  // fan-in over fan-out multipliers
    s.lr = static_cast<float>(1.0 / r);
    s.weight_decay = static_cast<float>(r);
  }
  return s;
}

Mup::Mup(MupKind kind, const AdamConfig& adam, const SgdConfig& sgd)
    : kind_(kind), adam_(adam), sgd_(sgd) {
  adam_.adam_w_mode = kind == MupKind::adamw;  // mup's impl: torch Adam (L2) or AdamW
}

const char* Mup::name() const {
  return kind_ == MupKind::adam ? "MuAdam" : kind_ == MupKind::adamw ? "MuAdamW" : "MuSGD";
}

int Mup::state_floats_per_param() const {
  return kind_ != MupKind::sgd ? 2 : sgd_.momentum != 0 ? 1 : 0;
}

void Mup::set_segments(std::span<const Segment> segments) {
  segments_.assign(segments.begin(), segments.end());
  scales_.assign(segments_.size(), MupScale{});
}

void Mup::set_scales(std::vector<MupScale> scales) {
  DS_CHECK(scales.size() == segments_.size(), "[mup] {} scales for {} segments", scales.size(),
           segments_.size());
  scales_ = std::move(scales);
}

void Mup::set_lr(float lr) {
  DS_CHECK(std::isfinite(lr) && lr >= 0, "[mup] lr must be >= 0, got {}", lr);
  (kind_ == MupKind::sgd ? sgd_.lr : adam_.lr) = lr;
}

float Mup::weight_decay() const {
  return kind_ == MupKind::sgd ? sgd_.weight_decay : adam_.weight_decay;
}

void Mup::set_weight_decay(float wd) {
  DS_CHECK(std::isfinite(wd) && wd >= 0, "[mup] weight_decay must be >= 0, got {}", wd);
  (kind_ == MupKind::sgd ? sgd_.weight_decay : adam_.weight_decay) = wd;
}

void Mup::set_momentum(float m) {
  if (kind_ != MupKind::sgd) return set_betas(m, adam_.beta2);
  DS_CHECK(m >= 0 && std::isfinite(m), "[mup] momentum must be >= 0, got {}", m);
  sgd_.momentum = m;
  if (m != 0 && n_ >= 0) allocate_buffers(1);
}

std::pair<float, float> Mup::betas() const {
  if (kind_ == MupKind::sgd) return Optimizer::betas();
  return {adam_.beta1, adam_.beta2};
}

void Mup::set_betas(float beta1, float beta2) {
  if (kind_ == MupKind::sgd) return Optimizer::set_betas(beta1, beta2);
  DS_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
           "[mup] betas must be in [0, 1), got ({}, {})", beta1, beta2);
  adam_.beta1 = beta1;
  adam_.beta2 = beta2;
}

std::vector<std::string> Mup::state_names() const {
  if (kind_ != MupKind::sgd) return {"exp_avg", "exp_avg_sq"};
  return sgd_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                            : std::vector<std::string>{};
}

void Mup::on_init_state() {
  allocate_buffers(kind_ != MupKind::sgd ? 2 : sgd_.momentum != 0 ? 1 : 0);
}

std::vector<StateBuffer> Mup::state_buffers() {
  std::vector<StateBuffer> out;
  const auto names = state_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (n_ >= 0 && has_buffer(static_cast<int>(i)))
      out.push_back({names[i], buffer(static_cast<int>(i)), n_});
  return out;
}

std::map<std::string, double> Mup::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = lr();
  s["weight_decay"] = weight_decay();
  if (kind_ != MupKind::sgd) {
    s["beta1"] = adam_.beta1;
    s["beta2"] = adam_.beta2;
  } else {
    s["momentum"] = sgd_.momentum;
    s["momentum_started"] = momentum_started_ ? 1.0 : 0.0;
  }
  return s;
}

void Mup::load_scalar_state(const std::map<std::string, double>& s) {
  std::map<std::string, double> rest;
  for (const auto& [k, v] : s) {
    const auto f = static_cast<float>(v);
    if (k == "lr") set_lr(f);
    else if (k == "weight_decay") set_weight_decay(f);
    else if (k == "beta1" && kind_ != MupKind::sgd) set_betas(f, adam_.beta2);
    else if (k == "beta2" && kind_ != MupKind::sgd) set_betas(adam_.beta1, f);
    else if (k == "momentum" && kind_ == MupKind::sgd) set_momentum(f);
    else if (k == "momentum_started" && kind_ == MupKind::sgd) momentum_started_ = v != 0;
    else rest.emplace(k, v);
  }
  Optimizer::load_scalar_state(rest);
}

void Mup::do_step(float* params, const float* grads, float grad_scale, void* out16,
                  DType out16_dtype) {
  detail::check_buffers(name(), n_, params, grads);
  if (segments_.empty() && n_ > 0) set_segments(std::vector<Segment>{{0, n_}});
  const auto es = static_cast<int64_t>(dtype_size(out16_dtype));
  for (size_t i = 0; i < segments_.size(); ++i) {
    const auto [off, n] = segments_[i];
    if (n == 0) continue;
    DS_CHECK(off + n <= n_, "[mup] segment {} ends past the range", i);
    void* o16 = out16 ? static_cast<char*>(out16) + off * es : nullptr;
    if (kind_ != MupKind::sgd) {
      AdamConfig c = adam_;
      c.lr *= scales_[i].lr;
      c.weight_decay *= scales_[i].weight_decay;
      adam_update(params + off, grads + off, buffer(0) + off, buffer(1) + off, n, step_count_, c,
                  grad_scale, o16, out16_dtype);
    } else {
      SgdConfig c = sgd_;
      c.lr *= scales_[i].lr;
      c.weight_decay *= scales_[i].weight_decay;
      float* buf = c.momentum != 0 ? buffer(0) + off : nullptr;
      sgd_update(params + off, grads + off, buf, n, !momentum_started_, c, grad_scale, o16,
                 out16_dtype);
    }
  }
  if (kind_ == MupKind::sgd && sgd_.momentum != 0) momentum_started_ = true;
}

}  // namespace ds::optim

namespace ds::optim {

std::vector<MupScale> mup_scales(
    MupKind kind, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
    const std::map<std::string, std::vector<int64_t>>& base) {
  std::vector<MupScale> out;
  if (base.empty()) return std::vector<MupScale>(tensors.size());
  std::vector<std::string> missing;
  for (const auto& [name, shape] : tensors) {
    auto it = base.find(name);
    if (it == base.end()) {
      missing.push_back(name);
      continue;
    }
    out.push_back(mup_scale(kind, shape, it->second));
  }
  DS_CHECK(missing.empty() && base.size() == tensors.size(),
           "[mup] the base shapes must name exactly the model's trainable parameters: {} missing "
           "(first: {}), {} given for {} parameters",
           missing.size(), missing.empty() ? std::string("-") : missing.front(), base.size(),
           tensors.size());
  return out;
}

}  // namespace ds::optim
