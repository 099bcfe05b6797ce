// Optimizer objects: state ownership, step counting, hyper-parameters, checkpoint state, factory.
#include "ds/optim/optimizer.h"

#include <cctype>
#include <cmath>
#include <cstring>

#include "ds/core/allocator.h"
#include "ds/optim/muon.h"
#include "ds/optim/mup.h"
#include "ds/optim/onebit.h"
#include "optim_internal.h"

namespace ds::optim {

// ---- Optimizer ----------------------------------------------------------------------------------

Optimizer::~Optimizer() = default;

namespace {
class HostStateHome final : public StateHome {
 public:
  float* allocate(int64_t numel) override {
    const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
    auto* p = static_cast<float*>(cpu_allocator().allocate(bytes));  // 64-byte aligned
    // Zero tile by tile on the threads that will update those tiles (first touch places the
    // pages; the same static tile split is used by every step).
    detail::for_each_tile_range(numel, [&](int64_t b, int64_t e) {
      std::memset(p + b, 0, static_cast<size_t>(e - b) * sizeof(float));
    });
    return p;
  }
  void release(float* p, int64_t numel) override {
    cpu_allocator().deallocate(p, static_cast<size_t>(numel) * sizeof(float));
  }
};
}  // namespace

std::shared_ptr<StateHome> host_state_home() {
  static const std::shared_ptr<StateHome> home = std::make_shared<HostStateHome>();
  return home;
}

void Optimizer::BufferDeleter::operator()(float* p) const {
  home->release(p, numel);
}

void Optimizer::set_state_home(std::shared_ptr<StateHome> home) {
  DS_CHECK(home, "[optim] {}: set_state_home needs a home", name());
  DS_CHECK(bufs_.empty(), "[optim] {}: set_state_home after the state was allocated", name());
  home_ = std::move(home);
}

void Optimizer::init_state(int64_t n) {
  DS_CHECK(n >= 0, "[optim] {}: negative element count {}", name(), n);
  DS_CHECK(!external_, "[optim] {}: init_state() after use_external_state()", name());
  if (n_ >= 0) {
    DS_CHECK(n == n_,
             "[optim] {}: state was sized for {} elements, now asked for {}; one optimizer "
             "updates one flat range (create another optimizer for another range)",
             name(), n_, n);
    return;
  }
  n_ = n;
  on_init_state();
}

void Optimizer::allocate_buffers(int count) {
  while (bufs_.size() < static_cast<size_t>(count)) {
    std::unique_ptr<float[], BufferDeleter> buf(home_->allocate(n_), BufferDeleter{n_, home_});
    bufs_.push_back(std::move(buf));
  }
}

void Optimizer::step(float* params, const float* grads, int64_t n, float grad_scale, void* out16,
                     DType out16_dtype) {
  DS_CHECK(!external_,
           "[optim] {}: the state lives in an external store; step with begin_step() and "
           "step_slice()",
           name());
  init_state(n);
  ++step_count_;
  try {
    do_step(params, grads, grad_scale, out16, out16_dtype);
  } catch (...) {
    --step_count_;  // a rejected step (bad arguments) did not happen
    throw;
  }
}

void Optimizer::use_external_state(int64_t n) {
  DS_CHECK(steps_in_slices(),
           "[optim] {} cannot step in slices (its update is not elementwise); NVMe offload of "
           "the optimizer state needs Adam or AdamW",
           name());
  DS_CHECK(n_ < 0 || (external_ && n_ == n),
           "[optim] {}: use_external_state({}) after the state was allocated for {} elements",
           name(), n, n_);
  n_ = n;
  external_ = true;
}

void Optimizer::begin_step() {
  DS_CHECK(steps_in_slices() && n_ >= 0,
           "[optim] {}: begin_step() needs an optimizer that steps in slices, after "
           "init_state() or use_external_state()",
           name());
  ++step_count_;
}

void Optimizer::step_slice(float* params, const float* grads, float* const* states, int64_t n,
                           float grad_scale, void* out16, DType out16_dtype) {
  DS_CHECK(steps_in_slices() && n_ >= 0 && step_count_ > 0,
           "[optim] {}: step_slice() needs begin_step() first", name());
  do_step_slice(params, grads, states, n, grad_scale, out16, out16_dtype);
}

void Optimizer::do_step_slice(float*, const float*, float* const*, int64_t, float, void*, DType) {
  DS_THROW("[optim] {} cannot step in slices", name());
}

void Optimizer::set_step_count(int64_t s) {
  DS_CHECK(s >= 0, "[optim] {}: step count must be >= 0, got {}", name(), s);
  step_count_ = s;
}

std::pair<float, float> Optimizer::betas() const {
  DS_THROW("[optim] {} has no betas; use momentum()", name());
}

void Optimizer::set_betas(float, float) {
  DS_THROW("[optim] {} has no betas; use set_momentum()", name());
}

void Optimizer::set_segments(std::span<const Segment>) {}

std::map<std::string, double> Optimizer::scalar_state() const {
  return {{"step", static_cast<double>(step_count_)}};
}

void Optimizer::load_scalar_state(const std::map<std::string, double>& s) {
  for (const auto& [key, value] : s) {
    DS_CHECK(key == "step", "[optim] {}: unknown optimizer state key '{}' in checkpoint", name(),
             key);
    DS_CHECK(value >= 0 && value == std::floor(value),
             "[optim] {}: checkpoint step {} is not a non-negative integer", name(), value);
    step_count_ = static_cast<int64_t>(value);
  }
}

namespace {

// Splits a checkpoint's scalars into the ones `known` handles (applied via set) and the rest,
// which go to the base class (only "step" is valid there).
template <class Set>
std::map<std::string, double> take_known(const std::map<std::string, double>& s,
                                         std::initializer_list<const char*> known, Set&& set) {
  std::map<std::string, double> rest;
  for (const auto& [key, value] : s) {
    bool mine = false;
    for (const char* k : known) mine = mine || key == k;
    if (mine)
      set(key, value);
    else
      rest.emplace(key, value);
  }
  return rest;
}

float as_float(double v) {
  return static_cast<float>(v);
}

// A setter's change applied to a copy of the config, checked, then kept: a refused value leaves
// the optimizer as it was.
template <class Config, class Change>
void update_config(Config& current, Change change) {
  Config c = current;
  change(c);
  check_config(c);
  current = c;
}

}  // namespace

// ---- Adam ---------------------------------------------------------------------------------------

Adam::Adam(const AdamConfig& c, bool force_adamw) : c_(c), named_adamw_(force_adamw) {
  if (force_adamw) c_.adam_w_mode = true;
  check_config(c_);
}

void Adam::set_lr(float lr) {
  update_config(c_, [&](AdamConfig& c) { c.lr = lr; });
}

void Adam::set_weight_decay(float wd) {
  update_config(c_, [&](AdamConfig& c) { c.weight_decay = wd; });
}

void Adam::set_betas(float beta1, float beta2) {
  update_config(c_, [&](AdamConfig& c) {
    c.beta1 = beta1;
    c.beta2 = beta2;
  });
}

void Adam::do_step(float* params, const float* grads, float grad_scale, void* out16,
                   DType out16_dtype) {
  adam_update(params, grads, buffer(0), buffer(1), n_, step_count_, c_, grad_scale, out16,
              out16_dtype);
}

void Adam::do_step_slice(float* params, const float* grads, float* const* states, int64_t n,
                         float grad_scale, void* out16, DType out16_dtype) {
  adam_update(params, grads, states[0], states[1], n, step_count_, c_, grad_scale, out16,
              out16_dtype);
}

std::vector<StateBuffer> Adam::state_buffers() {
  if (n_ < 0 || external_) return {};
  return {{"exp_avg", buffer(0), n_}, {"exp_avg_sq", buffer(1), n_}};
}

std::map<std::string, double> Adam::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  s["weight_decay"] = c_.weight_decay;
  return s;
}

void Adam::load_scalar_state(const std::map<std::string, double>& s) {
  AdamConfig c = c_;
  auto rest = take_known(s, {"lr", "beta1", "beta2", "eps", "weight_decay"},
                         [&](const std::string& k, double v) {
                           if (k == "lr") c.lr = as_float(v);
                           if (k == "beta1") c.beta1 = as_float(v);
                           if (k == "beta2") c.beta2 = as_float(v);
                           if (k == "eps") c.eps = as_float(v);
                           if (k == "weight_decay") c.weight_decay = as_float(v);
                         });
  check_config(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
}

// ---- Lamb ---------------------------------------------------------------------------------------

Lamb::Lamb(const LambConfig& c) : c_(c) {
  check_config(c_);
}

void Lamb::set_lr(float lr) {
  update_config(c_, [&](LambConfig& c) { c.lr = lr; });
}

void Lamb::set_weight_decay(float wd) {
  update_config(c_, [&](LambConfig& c) { c.weight_decay = wd; });
}

void Lamb::set_betas(float beta1, float beta2) {
  update_config(c_, [&](LambConfig& c) {
    c.beta1 = beta1;
    c.beta2 = beta2;
  });
}

void Lamb::set_segments(std::span<const Segment> segments) {
  segments_.assign(segments.begin(), segments.end());
}

void Lamb::set_norm_reducer(std::function<void(double*, int64_t)> reducer) {
  reducer_ = std::move(reducer);
}

void Lamb::do_step(float* params, const float* grads, float grad_scale, void* out16,
                   DType out16_dtype) {
  const size_t count = segments_.empty() ? 1 : segments_.size();
  sums_.assign(2 * count, 0.0);
  coeffs_.resize(count);
  lamb_moments(params, grads, buffer(0), buffer(1), n_, segments_, step_count_, c_, grad_scale,
               sums_.data(), sums_.data() + count);
  if (reducer_) reducer_(sums_.data(), static_cast<int64_t>(sums_.size()));
  for (size_t s = 0; s < count; ++s) coeffs_[s] = lamb_trust_ratio(sums_[s], sums_[count + s], c_);
  lamb_apply(params, buffer(0), buffer(1), n_, segments_, step_count_, c_, coeffs_.data(), out16,
             out16_dtype);
}

std::vector<StateBuffer> Lamb::state_buffers() {
  if (n_ < 0) return {};
  return {{"exp_avg", buffer(0), n_}, {"exp_avg_sq", buffer(1), n_}};
}

std::map<std::string, double> Lamb::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  s["weight_decay"] = c_.weight_decay;
  s["max_coeff"] = c_.max_coeff;
  s["min_coeff"] = c_.min_coeff;
  return s;
}

void Lamb::load_scalar_state(const std::map<std::string, double>& s) {
  LambConfig c = c_;
  auto rest =
      take_known(s, {"lr", "beta1", "beta2", "eps", "weight_decay", "max_coeff", "min_coeff"},
                 [&](const std::string& k, double v) {
                   if (k == "lr") c.lr = as_float(v);
                   if (k == "beta1") c.beta1 = as_float(v);
                   if (k == "beta2") c.beta2 = as_float(v);
                   if (k == "eps") c.eps = as_float(v);
                   if (k == "weight_decay") c.weight_decay = as_float(v);
                   if (k == "max_coeff") c.max_coeff = as_float(v);
                   if (k == "min_coeff") c.min_coeff = as_float(v);
                 });
  check_config(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
}

// ---- SGD ----------------------------------------------------------------------------------------

Sgd::Sgd(const SgdConfig& c) : c_(c) {
  check_config(c_);
}

void Sgd::on_init_state() {
  if (c_.momentum != 0) allocate_buffers(1);
}

void Sgd::set_lr(float lr) {
  update_config(c_, [&](SgdConfig& c) { c.lr = lr; });
}

void Sgd::set_weight_decay(float wd) {
  update_config(c_, [&](SgdConfig& c) { c.weight_decay = wd; });
}

void Sgd::set_momentum(float m) {
  update_config(c_, [&](SgdConfig& c) { c.momentum = m; });
  if (m != 0 && n_ >= 0) allocate_buffers(1);
}

void Sgd::do_step(float* params, const float* grads, float grad_scale, void* out16,
                  DType out16_dtype) {
  const bool uses_buffer = c_.momentum != 0;
  sgd_update(params, grads, uses_buffer ? buffer(0) : nullptr, n_, !momentum_started_, c_,
             grad_scale, out16, out16_dtype);
  momentum_started_ = momentum_started_ || uses_buffer;
}

std::vector<StateBuffer> Sgd::state_buffers() {
  if (n_ < 0 || !has_buffer(0)) return {};
  return {{"momentum_buffer", buffer(0), n_}};
}

std::map<std::string, double> Sgd::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = c_.lr;
  s["momentum"] = c_.momentum;
  s["dampening"] = c_.dampening;
  s["weight_decay"] = c_.weight_decay;
  s["momentum_started"] = momentum_started_ ? 1.0 : 0.0;
  return s;
}

void Sgd::load_scalar_state(const std::map<std::string, double>& s) {
  SgdConfig c = c_;
  bool started = momentum_started_;
  auto rest = take_known(s, {"lr", "momentum", "dampening", "weight_decay", "momentum_started"},
                         [&](const std::string& k, double v) {
                           if (k == "lr") c.lr = as_float(v);
                           if (k == "momentum") c.momentum = as_float(v);
                           if (k == "dampening") c.dampening = as_float(v);
                           if (k == "weight_decay") c.weight_decay = as_float(v);
                           if (k == "momentum_started") started = v != 0;
                         });
  check_config(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
  momentum_started_ = started;
  if (c_.momentum != 0 && n_ >= 0) allocate_buffers(1);
}

// ---- factory ------------------------------------------------------------------------------------

std::unique_ptr<Optimizer> make_optimizer(std::string_view type, const OptimizerParams& p) {
  std::string t(type);
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "adam" || t == "adamw") {
    AdamConfig c;
    c.lr = p.lr;
    c.beta1 = p.beta1;
    c.beta2 = p.beta2;
    c.eps = p.eps;
    c.weight_decay = p.weight_decay;
    c.bias_correction = p.bias_correction;
    c.adam_w_mode = p.adam_w_mode;
    return std::make_unique<Adam>(c, /*force_adamw=*/t == "adamw");
  }
  if (t == "lamb") {
    LambConfig c;
    c.lr = p.lr;
    c.beta1 = p.beta1;
    c.beta2 = p.beta2;
    c.eps = p.eps;
    c.weight_decay = p.weight_decay;
    c.max_coeff = p.max_coeff;
    c.min_coeff = p.min_coeff;
    c.bias_correction = p.bias_correction;
    c.eps_inside_sqrt = p.eps_inside_sqrt;
    c.legacy_bias_correction = p.lamb_legacy_bias_correction;
    return std::make_unique<Lamb>(c);
  }
  if (t == "sgd") {
    SgdConfig c;
    c.lr = p.lr;
    c.momentum = p.momentum;
    c.dampening = p.dampening;
    c.weight_decay = p.weight_decay;
    c.nesterov = p.nesterov;
    return std::make_unique<Sgd>(c);
  }
  if (t == "muon") return std::make_unique<Muon>(muon_config(p));
  if (t == "muadam" || t == "muadamw" || t == "musgd") {
    AdamConfig a;
    a.lr = p.lr;
    a.beta1 = p.beta1;
    a.beta2 = p.beta2;
    a.eps = p.eps;
    a.weight_decay = p.weight_decay;
    a.bias_correction = p.bias_correction;
    SgdConfig s;
    s.lr = p.lr;
    s.momentum = p.momentum;
    s.dampening = p.dampening;
    s.weight_decay = p.weight_decay;
    s.nesterov = p.nesterov;
    const MupKind k = t == "musgd" ? MupKind::sgd : t == "muadamw" ? MupKind::adamw : MupKind::adam;
    return std::make_unique<Mup>(k, a, s);
  }
  if (auto onebit = make_onebit_optimizer(t, p)) return onebit;
  DS_THROW(
      "[optim] optimizer type '{}' is not implemented; supported: Adam, AdamW, Lamb, SGD, Muon, "
      "MuAdam, MuAdamW, MuSGD, OneBitAdam, ZeroOneAdam, OneBitLamb (case-insensitive)",
      type);
}

}  // namespace ds::optim
