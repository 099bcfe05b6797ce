#pragma once
// The autograd graph. Every differentiable op that sees an input requiring grad records a Node:
// a function from the gradient of its (single) output to the gradients of its inputs. Edges point
// from a node to the nodes of its inputs; a leaf that requires grad is reached through its
// AccumulateGrad node, which adds into .grad and then fires the leaf's "gradient ready" hooks.
//
// Nodes carry a sequence number in creation order. The engine runs ready nodes latest-first, so
// backward visits layers in reverse forward order and gradients become ready last-layer-first: this
// is the order ZeRO's gradient buckets fill in.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual const char* name() const = 0;
  // grad_output: gradient of this node's output. Returns one gradient per next edge (an undefined
  // Tensor where the input needs none). Called with grad mode off.
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Drop saved tensors once the node has run (memory is freed during backward, not after it).
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  uint64_t sequence_nr;
};

// Adds the incoming gradient into the leaf's .grad (in place when .grad exists, so a gradient that
// is a view into a flat buffer stays one) and fires the leaf's gradient-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// The edge through which gradient reaches t: its grad_fn, its AccumulateGrad (leaves requiring
// grad), or a null edge.
Edge gradient_edge(const Tensor& t);

bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// A node whose backward is a closure: how ops record themselves. The closure must not capture the
// op's output by value with its history (use output.detach()) or the graph would own itself.
class FunctionNode final : public Node {
 public:
  using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(const Tensor& grad_output) override { return fn_(grad_output); }
  void release_saved() override { fn_ = nullptr; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// Records `out` as produced by `node` from `inputs` when grad mode is on and an input requires
// grad; otherwise does nothing. Returns out for chaining.
Tensor record(Tensor out, std::shared_ptr<Node> node, const std::vector<Tensor>& inputs);
// Convenience: record with a closure. The closure returns one gradient per input (in order).
Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs,
              FunctionNode::BackwardFn backward);

}  // namespace ds::autograd
