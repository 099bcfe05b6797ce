#include "ds/autograd/node.h"

#include <atomic>

#include "ds/autograd/engine.h"
#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"

namespace ds::autograd {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& g) {
  auto impl = leaf_.lock();
  if (!impl || !g.defined()) return {};
  Tensor leaf(impl);
  DS_CHECK(g.shape() == leaf.shape(),
           "[backward] gradient of shape {} for parameter '{}' of shape {}", shape_str(g.shape()),
           leaf.name(), shape_str(leaf.shape()));
  if (impl->grad.defined()) {
    // In place: a gradient that is a view into a flat buffer must stay that view.
    backend::get(leaf.device()).axpy(impl->grad, g.contiguous(), 1.0f);
  } else {
    Tensor own = Tensor::empty(leaf.shape(), leaf.dtype(), leaf.device());
    own.copy_from(g);
    impl->grad = own;
  }
  // Copy the list: a hook may remove itself.
  auto hooks = impl->grad_ready_hooks;
  for (auto& [id, hook] : hooks) hook(leaf);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn()};
  auto* impl = t.impl();
  auto acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc};
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
// Tensor::backward (core) runs autograd::backward: registered from here, the file every recorded
// graph goes through, so it is linked (and registered) whenever a graph exists.
void tensor_backward(const Tensor& root, const Tensor& grad_output) {
  std::vector<Tensor> grads;
  if (grad_output.defined()) grads.push_back(grad_output);
  backward({root}, grads);
}
[[maybe_unused]] const bool kRegistered = (set_backward_impl(&tensor_backward), true);
}  // namespace

Tensor record(Tensor out, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs) {
  if (!is_grad_enabled() || !any_requires_grad(inputs)) return out;
  node->next_edges.clear();
  node->next_edges.reserve(inputs.size());
  for (const auto& t : inputs) node->next_edges.push_back(gradient_edge(t));
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}

Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs,
              FunctionNode::BackwardFn backward) {
  if (!is_grad_enabled() || !any_requires_grad(inputs)) return out;
  return record(std::move(out), std::make_shared<FunctionNode>(name, std::move(backward)), inputs);
}

}  // namespace ds::autograd
