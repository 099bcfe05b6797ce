#include "ds/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"

namespace ds::autograd {
namespace {

thread_local int g_depth = 0;
thread_local std::vector<std::function<void()>> g_callbacks;

struct InputBuffer {
  Tensor grad;
  bool owned = false;  // true once we allocated it, so later contributions can add in place

  void add(const Tensor& g) {
    if (!g.defined()) return;
    if (!grad.defined()) {
      grad = g;
      return;
    }
    if (!owned) {
      grad = grad.clone();
      owned = true;
    }
    DS_CHECK(grad.shape() == g.shape(), "[backward] gradients of shapes {} and {} meet at one tensor",
             shape_str(grad.shape()), shape_str(g.shape()));
    backend::get(grad.device()).axpy(grad, g.contiguous(), 1.0f);
  }
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

struct DepthGuard {
  DepthGuard() { ++g_depth; }
  ~DepthGuard() {
    if (--g_depth == 0) g_callbacks.clear();  // on an exception, drop pending callbacks
  }
};

}  // namespace

int backward_depth() { return g_depth; }

void queue_callback(std::function<void()> fn) {
  DS_CHECK(g_depth > 0, "[backward] queue_callback outside of backward");
  g_callbacks.push_back(std::move(fn));
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  DS_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(),
           "[backward] {} gradients given for {} roots", grad_roots.size(), roots.size());
  DepthGuard depth;
  GradModeGuard no_grad(false);

  // Seed gradients.
  std::unordered_map<Node*, InputBuffer> buffers;
  std::vector<std::shared_ptr<Node>> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    DS_CHECK(r.defined() && r.requires_grad(),
             "[backward] the tensor does not require grad and has no grad_fn (was it computed "
             "under no_grad, or from tensors that do not require grad?)");
    Tensor g;
    if (i < grad_roots.size() && grad_roots[i].defined()) {
      g = grad_roots[i];
      DS_CHECK(g.shape() == r.shape(), "[backward] gradient shape {} for a root of shape {}",
               shape_str(g.shape()), shape_str(r.shape()));
    } else {
      DS_CHECK(r.numel() == 1, "[backward] an implicit gradient needs a scalar root, got shape {}",
               shape_str(r.shape()));
      g = Tensor::ones(r.shape(), r.dtype(), r.device());
    }
    Edge e = gradient_edge(r);
    buffers[e.fn.get()].add(g);
    seeds.push_back(e.fn);
  }

  // Discover the graph and count, for each node, the edges that reach it.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& s : seeds)
    if (seen.insert(s.get()).second) stack.push_back(s.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  // Keep every node alive while it may still run (a node's owner may be a node that already ran).
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (auto& s : seeds) {
    alive[s.get()] = s;
    if (deps[s.get()] == 0) ready.push(s.get());
  }
  std::unordered_set<Node*> queued;
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    if (!queued.insert(n).second) continue;  // a node seeded twice
    Tensor g = std::move(buffers[n].grad);
    buffers.erase(n);
    std::vector<Tensor> grads;
    if (g.defined()) grads = n->apply(g);
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      if (i < grads.size()) buffers[e.fn.get()].add(grads[i]);
      alive.emplace(e.fn.get(), e.fn);
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
    if (!retain_graph) n->release_saved();
    alive.erase(n);
  }

  if (g_depth == 1) {
    // Callbacks may queue more callbacks; run until none are left.
    for (size_t i = 0; i < g_callbacks.size(); ++i) {
      auto cb = std::move(g_callbacks[i]);
      cb();
    }
    g_callbacks.clear();
  }
}

}  // namespace ds::autograd
