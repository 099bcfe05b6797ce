#include "ds/nn/module.h"

#include <algorithm>

#include "ds/autograd/checkpoint.h"
#include "ds/autograd/engine.h"
#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/ops/ops.h"

namespace ds::nn {

namespace {
thread_local bool g_partitioned_init = false;
}

PartitionedInit::PartitionedInit() : prev_(g_partitioned_init) {
  g_partitioned_init = true;
}
PartitionedInit::~PartitionedInit() {
  g_partitioned_init = prev_;
}
bool PartitionedInit::active() {
  return g_partitioned_init;
}

Tensor Module::forward(const Tensor&) {
  DS_THROW("[module] {} has no single-input forward; call its own forward method", type_name_);
}

Tensor Module::loss(const Tensor&, const Tensor&) {
  DS_THROW(
      "[module] {} has no loss(inputs, targets); pass the engine a loss function "
      "(runtime::InitOptions::loss_fn)",
      type_name_);
}

Tensor Module::loss(const Batch& b) {
  const char* extra = b.attention_mask.defined()      ? "attention_mask"
                      : b.token_type_ids.defined()    ? "token_type_ids"
                      : b.decoder_input_ids.defined() ? "decoder_input_ids"
                                                      : nullptr;
  DS_CHECK(!extra,
           "[module] {} takes input ids and labels only; the batch also has {}, which it would "
           "ignore",
           type_name_, extra);
  return loss(b.input_ids, b.labels);
}

bool Module::init_parameter_range(size_t, int64_t, int64_t, float*) const {
  return false;
}

Tensor Module::operator()(const Tensor& input) {
  return call(input, [this](const Tensor& in) { return forward(in); });
}

Tensor Module::call(const Tensor& input, const std::function<Tensor(const Tensor&)>& body) {
  for (auto& [id, hook] : forward_pre_hooks_) hook(*this, input);
  const bool grad_on = autograd::is_grad_enabled();
  const bool wants_backward = grad_on && (!backward_hooks_.empty() || !backward_pre_hooks_.empty());
  Tensor x = input;
  bool post_at_end = false;
  if (wants_backward && !backward_hooks_.empty()) {
    if (x.requires_grad()) {
      // The gradient w.r.t. the input is the last thing the module's backward computes.
      x = ops::backward_hook(x, [this] { run_backward_hooks(); });
    } else {
      post_at_end = true;  // nothing flows out through the input: report at the end of backward
    }
  }
  Tensor y = checkpointing_ && grad_on ? autograd::checkpoint(body, x) : body(x);
  if (wants_backward && y.requires_grad()) {
    y = ops::backward_hook(y, [this, post_at_end] {
      run_backward_pre_hooks();
      if (post_at_end) autograd::queue_callback([this] { run_backward_hooks(); });
    });
  }
  for (auto& [id, hook] : forward_hooks_) hook(*this, input, y);
  return y;
}

void Module::run_backward_hooks() {
  for (auto& [id, hook] : backward_hooks_) hook(*this);
}

void Module::run_backward_pre_hooks() {
  for (auto& [id, hook] : backward_pre_hooks_) hook(*this);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  DS_CHECK(t.defined(), "[module] parameter '{}' of {} is undefined", name, type_name_);
  for (auto& [n, p] : params_)
    DS_CHECK(n != name, "[module] parameter '{}' registered twice in {}", name, type_name_);
  t.set_requires_grad(true);
  if (t.name().empty()) t.set_name(name);
  if (g_partitioned_init && t.is_materialized() && !t.storage()->is_view()) t.storage()->release();
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return t;
}

void Module::collect_parameters(const std::string& prefix,
                                std::vector<std::pair<std::string, Tensor>>& out,
                                std::vector<const TensorImpl*>& seen) const {
  for (const auto& [n, p] : params_) {
    if (std::find(seen.begin(), seen.end(), p.impl()) != seen.end()) continue;
    seen.push_back(p.impl());
    out.emplace_back(prefix + n, p);
  }
  for (const auto& [n, c] : children_) c->collect_parameters(prefix + n + ".", out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect_parameters("", out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

void move_tensor_to(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return;
  Tensor moved = Tensor::empty(t.shape(), t.dtype(), device);
  moved.copy_from(t);
  TensorImpl* im = t.impl();
  im->storage = moved.storage();
  im->offset = 0;
  im->strides = contiguous_strides(im->shape);
}

void Module::to(Device device) {
  for (const auto& [n, p] : named_parameters()) {
    move_tensor_to(p, device);
    if (p.grad().defined()) move_tensor_to(p.grad(), device);
  }
  for (const auto& [n, b] : named_buffers()) move_tensor_to(b, device);
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [prefix, m] : named_modules())
    for (const auto& [n, b] : m->buffers_)
      out.emplace_back(prefix.empty() ? n : prefix + "." + n, b);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  out.emplace_back("", const_cast<Module*>(this));
  for (const auto& [n, c] : children_)
    for (auto& [sub, m] : c->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, m);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

Tensor Module::parameter(const std::string& name) const {
  for (const auto& [n, p] : params_)
    if (n == name) return p;
  DS_THROW("[module] {} has no parameter '{}'", type_name_, name);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& p : parameters())
    if (p.grad().defined()) p.grad().zero_();
}

int Module::register_forward_pre_hook(ForwardPreHook hook) {
  forward_pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}
int Module::register_forward_hook(ForwardHook hook) {
  forward_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}
int Module::register_backward_pre_hook(BackwardHook hook) {
  backward_pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}
int Module::register_backward_hook(BackwardHook hook) {
  backward_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

void Module::remove_hook(int handle) {
  auto drop = [handle](auto& v) {
    v.erase(
        std::remove_if(v.begin(), v.end(), [handle](const auto& h) { return h.first == handle; }),
        v.end());
  };
  drop(forward_pre_hooks_);
  drop(forward_hooks_);
  drop(backward_pre_hooks_);
  drop(backward_hooks_);
}

}  // namespace ds::nn
