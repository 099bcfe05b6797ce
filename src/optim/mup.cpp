// muP's per-tensor lr and weight-decay multipliers over Adam, AdamW and SGD (optim/mup.h).
#include "ds/optim/mup.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "optim_internal.h"

namespace ds::optim {

MupScale mup_scale(MupKind kind, std::span<const int64_t> shape, std::span<const int64_t> base) {
  DS_CHECK(shape.size() == base.size(), "[mup] the base shape has {} dimensions, the tensor {}",
           base.size(), shape.size());
  // mup's InfDim: a dimension equal to the base's, or with base 0 (null), is finite.
  auto width = [&](size_t i) { return base[i] > 0 && shape[i] != base[i]; };
  auto mult = [&](size_t i) {
    DS_CHECK(base[i] >= 0, "[mup] base dimension {} must be >= 0", base[i]);
    return width(i) ? static_cast<double>(shape[i]) / static_cast<double>(base[i]) : 1.0;
  };
  int ninf = 0;
  double main = 1.0;  // the last width dimension's multiplier (a matrix's fan-in)
  for (size_t i = 0; i < shape.size(); ++i)
    if (width(i)) {
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
    if (k == "lr")
      set_lr(f);
    else if (k == "weight_decay")
      set_weight_decay(f);
    else if (k == "beta1" && kind_ != MupKind::sgd)
      set_betas(f, adam_.beta2);
    else if (k == "beta2" && kind_ != MupKind::sgd)
      set_betas(adam_.beta1, f);
    else if (k == "momentum" && kind_ == MupKind::sgd)
      set_momentum(f);
    else if (k == "momentum_started" && kind_ == MupKind::sgd)
      momentum_started_ = v != 0;
    else
      rest.emplace(k, v);
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

namespace ds::optim {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// mup's .bsh: a YAML mapping of name -> list of ints or null, as yaml.dump writes it.
std::map<std::string, std::vector<int64_t>> parse_bsh(std::istream& in, const std::string& path) {
  std::map<std::string, std::vector<int64_t>> out;
  std::vector<int64_t>* cur = nullptr;
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const std::string t = trim(raw.substr(0, raw.find('#')));
    if (t.empty()) continue;
    if (t[0] == '-') {
      DS_CHECK(cur, "[mup] {}:{}: a list item before any parameter name", path, line);
      const std::string v = trim(t.substr(1));
      if (v == "null" || v == "~") {
        cur->push_back(0);
      } else {
        size_t used = 0;
        int64_t d = -1;
        try {
          d = std::stoll(v, &used);
        } catch (const std::exception&) {
        }
        DS_CHECK(used == v.size() && d > 0, "[mup] {}:{}: '{}' is not a dimension or null", path,
                 line, v);
        cur->push_back(d);
      }
    } else {
      DS_CHECK(t.back() == ':', "[mup] {}:{}: expected 'name:' or '- dim', got '{}'", path, line,
               t);
      cur = &out[trim(t.substr(0, t.size() - 1))];
    }
  }
  return out;
}

}  // namespace

std::map<std::string, std::vector<int64_t>> load_mup_base_shapes(const std::string& path) {
  std::ifstream f(path);
  DS_CHECK(f.good(), "[mup] cannot read the base shapes file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (trim(text).starts_with("{")) {
    std::map<std::string, std::vector<int64_t>> out;
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    DS_CHECK(j.is_object(), "[mup] {} is not a JSON object of name -> [dims]", path);
    for (const auto& [name, dims] : j.items()) {
      DS_CHECK(dims.is_array(), "[mup] {}: {} is not a list of dimensions", path, name);
      for (const auto& d : dims) {
        DS_CHECK(d.is_null() || (d.is_number_integer() && d.get<int64_t>() > 0),
                 "[mup] {}: {} has a dimension that is neither > 0 nor null", path, name);
        out[name].push_back(d.is_null() ? 0 : d.get<int64_t>());
      }
    }
    return out;
  }
  std::istringstream in(text);
  return parse_bsh(in, path);
}

}  // namespace ds::optim
