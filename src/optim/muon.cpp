// Muon with auxiliary AdamW (optim/muon.h): the rule, the state, the step (whole matrices here,
// cut ones through the exchange).
#include "ds/optim/muon.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "optim_internal.h"

namespace ds::optim {

namespace {

// torch.lerp's formula (start + w (end - start), from the other end when w >= 0.5), so the
// momentum matches DeepSpeed's lerp_ calls to the last bit where the inputs do.
inline float lerp(float start, float end, float w) {
  return w < 0.5f ? start + w * (end - start) : end - (end - start) * (1.0f - w);
}

// m = lerp(m, g, 1 - beta); u = lerp(g, m, beta), with g = grad_scale * g_in. (count,) each.
void momentum_nesterov(const float* g_in, float* m, float* u, int64_t count, float beta,
                       float grad_scale) {
  const float w = 1.0f - beta;
  detail::for_each_tile_range(count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = g_in[i] * grad_scale;
      m[i] = lerp(m[i], g, w);
      u[i] = lerp(g, m[i], beta);
    }
  });
}

// p = p * (1 - lr * wd) - lr * o over (count,), and the 16-bit copy when asked.
void apply_update(float* p, const float* o, int64_t count, float lr, float wd, void* out16,
                  DType dt) {
  const float decay = 1.0f - lr * wd;
  const detail::Out16 kind = detail::out16_kind(out16, dt);
  auto* o16 = static_cast<uint16_t*>(out16);
  detail::for_each_tile_range(count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      p[i] = p[i] * decay + (-lr) * o[i];
      if (kind != detail::Out16::none) detail::store16_scalar(o16 + i, kind, p[i]);
    }
  });
}

void* offset16(void* out16, DType dt, int64_t off) {
  return out16 ? static_cast<char*>(out16) + off * static_cast<int64_t>(dtype_size(dt)) : nullptr;
}

void check_muon_config(const MuonConfig& c) {
  DS_CHECK(c.muon_lr >= 0 && c.adam_lr >= 0 && c.base_lr >= 0,
           "[muon] learning rates must be >= 0 (muon_lr {}, adam_lr {}, lr {})", c.muon_lr,
           c.adam_lr, c.base_lr);
  DS_CHECK(c.momentum >= 0 && c.momentum < 1, "[muon] momentum must be in [0, 1), got {}",
           c.momentum);
  DS_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
           "[muon] betas must be in [0, 1), got ({}, {})", c.beta1, c.beta2);
  DS_CHECK(c.eps >= 0 && c.weight_decay >= 0 && c.ns_steps >= 0,
           "[muon] eps, weight_decay and ns_steps must be >= 0");
}

}  // namespace

bool muon_uses(const std::string& name, std::span<const int64_t> shape) {
  if (shape.size() < 2) return false;
  std::string low = name;
  for (char& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (low.find("embed") != std::string::npos || low.find("lm_head") != std::string::npos)
    return false;
  // The last name part before ".weight" is the module's own name: GPT-2's embeddings.
  for (const char* gpt2 : {"wte", "wpe"}) {
    const std::string k(gpt2);
    if (low == k + ".weight" || low.ends_with("." + k + ".weight")) return false;
  }
  return true;
}

Muon::Muon(const MuonConfig& c) : c_(c), lr_(c.base_lr) {
  check_muon_config(c_);
}

Muon::~Muon() {
  if (sq_) munmap(sq_, sq_bytes_);
}

int Muon::state_floats_per_param() const {
  for (const auto& t : tensors_)
    if (!t.use_muon && t.count > 0) return 2;
  return tensors_.empty() ? 2 : 1;
}

int64_t Muon::state_bytes() const {
  if (n_ < 0) return 0;
  return (n_ + (n_ - muon_numel())) * static_cast<int64_t>(sizeof(float));
}

int64_t Muon::muon_numel() const {
  int64_t k = 0;
  for (const auto& t : tensors_)
    if (t.use_muon) k += t.count;
  return k;
}

void Muon::set_tensors(std::vector<MuonTensor> tensors) {
  DS_CHECK(step_count_ == 0 && !planned_, "[muon] set_tensors() after the first step");
  for (const auto& t : tensors)
    DS_CHECK(t.rows > 0 && t.cols > 0 && t.count >= 0 && t.start >= 0 &&
                 t.start + t.count <= t.rows * t.cols && t.local_offset >= 0,
             "[muon] bad tensor piece (rows {}, cols {}, start {}, count {})", t.rows, t.cols,
             t.start, t.count);
  tensors_ = std::move(tensors);
}

void Muon::set_exchange(int rank, int size, std::function<void(float*, int64_t)> sum) {
  DS_CHECK(size >= 1 && rank >= 0 && rank < size, "[muon] bad rank {} of {}", rank, size);
  rank_ = rank;
  size_ = size;
  sum_ = std::move(sum);
}

float Muon::group_lr(float base) const {
  // A schedule moves both groups together: its lr over the configured one.
  return c_.base_lr > 0 ? base * (lr_ / c_.base_lr) : lr_;
}

void Muon::set_lr(float lr) {
  DS_CHECK(std::isfinite(lr) && lr >= 0, "[muon] lr must be >= 0, got {}", lr);
  lr_ = lr;
}

void Muon::set_weight_decay(float wd) {
  MuonConfig c = c_;
  c.weight_decay = wd;
  check_muon_config(c);
  c_ = c;
}

void Muon::set_momentum(float m) {
  MuonConfig c = c_;
  c.momentum = m;
  check_muon_config(c);
  c_ = c;
}

void Muon::set_betas(float beta1, float beta2) {
  MuonConfig c = c_;
  c.beta1 = beta1;
  c.beta2 = beta2;
  check_muon_config(c);
  c_ = c;
}

void Muon::on_init_state() {
  allocate_buffers(1);
  // exp_avg_sq: address space for n floats, zero pages until written; only Adam elements are.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  sq_bytes_ =
      std::max<size_t>(page, (static_cast<size_t>(n_) * sizeof(float) + page - 1) / page * page);
  void* p = mmap(nullptr, sq_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DS_CHECK(p != MAP_FAILED, "[muon] could not reserve {} bytes for exp_avg_sq", sq_bytes_);
  sq_ = static_cast<float*>(p);
}

void Muon::release_muon_sq_pages() {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& t : tensors_) {
    if (!t.use_muon || t.count == 0) continue;
    const auto lo = reinterpret_cast<uintptr_t>(sq_ + t.local_offset);
    const auto hi = reinterpret_cast<uintptr_t>(sq_ + t.local_offset + t.count);
    const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    // Anonymous private pages read back as zeros afterwards: nothing reads them anyway.
    if (a < b) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }
}

std::vector<StateBuffer> Muon::state_buffers() {
  if (n_ < 0) return {};
  trim_pending_ = true;  // a checkpoint load may write zeros over the Muon elements' pages
  return {{"exp_avg", buffer(0), n_}, {"exp_avg_sq", sq_, n_}};
}

std::map<std::string, double> Muon::scalar_state() const {
  auto s = Optimizer::scalar_state();
  s["lr"] = lr_;
  s["muon_lr"] = c_.muon_lr;
  s["adam_lr"] = c_.adam_lr;
  s["momentum"] = c_.momentum;
  s["weight_decay"] = c_.weight_decay;
  s["beta1"] = c_.beta1;
  s["beta2"] = c_.beta2;
  s["eps"] = c_.eps;
  return s;
}

void Muon::load_scalar_state(const std::map<std::string, double>& s) {
  MuonConfig c = c_;
  float lr = lr_;
  std::map<std::string, double> rest;
  for (const auto& [k, v] : s) {
    const auto f = static_cast<float>(v);
    if (k == "lr")
      lr = f;
    else if (k == "muon_lr")
      c.muon_lr = f;
    else if (k == "adam_lr")
      c.adam_lr = f;
    else if (k == "momentum")
      c.momentum = f;
    else if (k == "weight_decay")
      c.weight_decay = f;
    else if (k == "beta1")
      c.beta1 = f;
    else if (k == "beta2")
      c.beta2 = f;
    else if (k == "eps")
      c.eps = f;
    else
      rest.emplace(k, v);
  }
  check_muon_config(c);
  Optimizer::load_scalar_state(rest);
  c_ = c;
  lr_ = lr;
}

void Muon::do_step(float* params, const float* grads, float grad_scale, void* out16,
                   DType out16_dtype) {
  detail::check_buffers("Muon", n_, params, grads);
  if (tensors_.empty() && n_ > 0) tensors_.push_back({1, n_, false, 0, 0, n_});
  for (const auto& t : tensors_)
    DS_CHECK(t.local_offset + t.count <= n_, "[muon] a tensor piece ends past the range ({} > {})",
             t.local_offset + t.count, n_);
  if (!planned_) plan_cut();
  if (trim_pending_) release_muon_sq_pages();
  trim_pending_ = false;
  step_adam(params, grads, grad_scale, out16, out16_dtype);
  step_whole(params, grads, grad_scale, out16, out16_dtype);
  step_exchanged(cut_, cut_buckets_, /*assemble=*/true, params, grads, grad_scale, out16,
                 out16_dtype);
  step_exchanged(shared_, shared_buckets_, /*assemble=*/false, params, grads, grad_scale, out16,
                 out16_dtype);
}

void Muon::step_adam(float* params, const float* grads, float grad_scale, void* out16, DType dt) {
  AdamConfig a;
  a.lr = group_lr(c_.adam_lr);
  a.beta1 = c_.beta1;
  a.beta2 = c_.beta2;
  a.eps = c_.eps;
  a.weight_decay = c_.weight_decay;
  a.bias_correction = true;
  a.adam_w_mode = true;
  float* m = buffer(0);
  for (const auto& t : tensors_) {
    if (t.use_muon || t.count == 0) continue;
    const int64_t o = t.local_offset;
    adam_update(params + o, grads + o, m + o, sq_ + o, t.count, step_count_, a, grad_scale,
                offset16(out16, dt, o), dt);
  }
}

void Muon::step_whole(float* params, const float* grads, float grad_scale, void* out16, DType dt) {
  const float lr = group_lr(c_.muon_lr);
  float* m = buffer(0);
  std::vector<float> u;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    if (!t.use_muon || t.count == 0 || t.count != t.rows * t.cols || exchanged_[i]) continue;
    const int64_t o = t.local_offset;
    u.resize(static_cast<size_t>(t.count));
    momentum_nesterov(grads + o, m + o, u.data(), t.count, c_.momentum, grad_scale);
    newton_schulz(u.data(), t.rows, t.cols, c_.ns_steps, c_.ns_method, c_.ns_bf16);
    const float scale = std::sqrt(std::max(1.0f, static_cast<float>(t.rows) / t.cols));
    for (float& x : u) x *= scale;
    apply_update(params + o, u.data(), t.count, lr, c_.weight_decay, offset16(out16, dt, o), dt);
  }
}

namespace {

// Buckets of consecutive matrices of `list` up to kMuonBucketFloats (one matrix when larger).
std::vector<std::pair<size_t, size_t>> make_buckets(const std::vector<int>& list,
                                                    const std::vector<MuonTensor>& tensors) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t first = 0;
  int64_t total = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    const auto& t = tensors[static_cast<size_t>(list[k])];
    if (k > first && total + t.rows * t.cols > kMuonBucketFloats) {
      out.emplace_back(first, k);
      first = k;
      total = 0;
    }
    total += t.rows * t.cols;
  }
  if (first < list.size()) out.emplace_back(first, list.size());
  return out;
}

}  // namespace

void Muon::plan_cut() {
  planned_ = true;
  // How many ranks hold each Muon matrix whole (exact in floats): none = cut between ranks;
  // all (stage 0's replicas) = shared, so one owner orthogonalises it for everyone.
  std::vector<float> whole;
  std::vector<int> muon;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    if (!t.use_muon) continue;
    muon.push_back(static_cast<int>(i));
    whole.push_back(t.count == t.rows * t.cols ? 1.0f : 0.0f);
  }
  if (size_ > 1 && !whole.empty()) {
    DS_CHECK(sum_, "[muon] {} ranks but no exchange: call set_exchange()", size_);
    sum_(whole.data(), static_cast<int64_t>(whole.size()));
  }
  for (size_t k = 0; k < muon.size(); ++k) {
    if (whole[k] < 0.5f) {
      DS_CHECK(size_ > 1,
               "[muon] a Muon matrix is cut but there is one rank: the tensor pieces "
               "must come from a ZeRO strategy with set_exchange()");
      cut_.push_back(muon[k]);
    } else if (size_ > 1 && whole[k] > static_cast<float>(size_) - 0.5f) {
      shared_.push_back(muon[k]);
    }
  }
  exchanged_.assign(tensors_.size(), 0);
  for (const auto* list : {&cut_, &shared_})
    for (int i : *list) exchanged_[static_cast<size_t>(i)] = 1;
  cut_buckets_ = make_buckets(cut_, tensors_);
  shared_buckets_ = make_buckets(shared_, tensors_);
}

void Muon::step_exchanged(const std::vector<int>& list,
                          const std::vector<std::pair<size_t, size_t>>& buckets, bool assemble,
                          float* params, const float* grads, float grad_scale, void* out16,
                          DType dt) {
  const float lr = group_lr(c_.muon_lr);
  float* m = buffer(0);
  std::vector<float> buf;
  for (const auto& [k0, k1] : buckets) {
    int64_t total = 0;
    for (size_t k = k0; k < k1; ++k) {
      const auto& t = tensors_[static_cast<size_t>(list[k])];
      total += t.rows * t.cols;
    }
    buf.assign(static_cast<size_t>(total), 0.0f);
    // Each rank's pieces of U in place: a cut matrix is assembled by the sum over ranks; a shared
    // one is whole here already.
    int64_t at = 0;
    for (size_t k = k0; k < k1; ++k) {
      const auto& t = tensors_[static_cast<size_t>(list[k])];
      if (t.count > 0)
        momentum_nesterov(grads + t.local_offset, m + t.local_offset, buf.data() + at + t.start,
                          t.count, c_.momentum, grad_scale);
      at += t.rows * t.cols;
    }
    if (assemble) sum_(buf.data(), total);
    // The owner orthogonalises; the others contribute zeros to the second sum.
    at = 0;
    for (size_t k = k0; k < k1; ++k) {
      const auto& t = tensors_[static_cast<size_t>(list[k])];
      float* x = buf.data() + at;
      const int64_t numel = t.rows * t.cols;
      if (static_cast<int>(k % static_cast<size_t>(size_)) == rank_) {
        newton_schulz(x, t.rows, t.cols, c_.ns_steps, c_.ns_method, c_.ns_bf16);
        const float scale = std::sqrt(std::max(1.0f, static_cast<float>(t.rows) / t.cols));
        for (int64_t i = 0; i < numel; ++i) x[i] *= scale;
      } else {
        std::fill(x, x + numel, 0.0f);
      }
      at += numel;
    }
    sum_(buf.data(), total);
    at = 0;
    for (size_t k = k0; k < k1; ++k) {
      const auto& t = tensors_[static_cast<size_t>(list[k])];
      if (t.count > 0)
        apply_update(params + t.local_offset, buf.data() + at + t.start, t.count, lr,
                     c_.weight_decay, offset16(out16, dt, t.local_offset), dt);
      at += t.rows * t.cols;
    }
  }
}

}  // namespace ds::optim

namespace ds::optim {

MuonConfig muon_config(const OptimizerParams& p) {
  MuonConfig c;
  // DeepSpeed's engine: muon_lr, else lr, else Muon's 0.02; adam_lr, else lr, else 3e-4.
  c.muon_lr = p.muon_lr >= 0 ? p.muon_lr : p.lr_given ? p.lr : 0.02f;
  c.adam_lr = p.adam_lr >= 0 ? p.adam_lr : p.lr_given ? p.lr : 3e-4f;
  c.base_lr = p.lr;
  c.momentum = p.momentum;
  c.weight_decay = p.weight_decay;
  c.beta1 = p.beta1;
  c.beta2 = p.beta2;
  c.eps = p.eps;
  DS_CHECK(p.ns_method == "gram" || p.ns_method == "standard",
           "[muon] ns_method must be \"gram\" or \"standard\", got \"{}\"", p.ns_method);
  c.ns_method = p.ns_method == "gram" ? NsMethod::gram : NsMethod::standard;
  if (const char* e = std::getenv("DS_MUON_NS")) {
    const std::string v(e);
    DS_CHECK(v == "fp32" || v == "bf16", "[muon] DS_MUON_NS={} is not fp32 or bf16", v);
    c.ns_bf16 = v == "bf16";
  }
  return c;
}

}  // namespace ds::optim
