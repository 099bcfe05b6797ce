#pragma once
// nn::Module: a named tree of modules owning parameters and buffers, with hooks.
//
// Parameters are registered once (in the constructor) and reached through the registry at the
// moment of use. Their TensorImpl never changes, but its storage may: nn::flatten_parameters()
// moves every parameter into one flat buffer (each becomes a view at an offset), and ZeRO-3
// releases and re-gathers storage between uses. Hooks, names and the optimizer's view of the
// parameter survive both.
//
// Hooks (the points ZeRO and activation checkpointing hang on):
//   forward pre-hook   before forward(input)
//   forward hook       after forward, with input and output
//   backward pre-hook  when the first gradient reaches the module's output in a backward pass
//   backward hook      when the module's backward is done: the gradient w.r.t. its input is
//                      computed (or, when the input needs none, at the end of the backward pass)
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/nn/batch.h"

namespace ds::nn {

// Partitioned construction (DeepSpeed's zero.Init): while a PartitionedInit is alive on this
// thread, every parameter a module registers has its storage released right away, so building a
// model never holds more than one full parameter; ZeRO-3 then creates each rank's shard from the
// model's initialisation function. Parameters built this way must not be read before the engine
// partitions them.
class PartitionedInit {
 public:
  PartitionedInit();
  ~PartitionedInit();
  PartitionedInit(const PartitionedInit&) = delete;
  PartitionedInit& operator=(const PartitionedInit&) = delete;
  static bool active();

 private:
  bool prev_;
};

// Replaces t's storage by a contiguous copy on device (nothing when it is there already); every
// handle to t sees the move. Not recorded by autograd.
void move_tensor_to(const Tensor& t, Device device);

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Runs the hooks around forward(x); with gradient checkpointing on, forward runs without keeping
  // activations and is recomputed during backward.
  Tensor operator()(const Tensor& x);
  virtual Tensor forward(const Tensor& x);
  // Runs the hooks (and checkpointing) around body(x) instead of forward(x): another computation
  // over this module's parameters that must see the same gathers and releases (ZeRO-3), such as
  // Linear::cross_entropy.
  Tensor call(const Tensor& x, const std::function<Tensor(const Tensor&)>& body);

  // The training loss of a batch, for modules that define one (a language model: inputs and
  // targets (B, T) ids -> scalar). The default throws "[module] <type> has no loss(...)".
  virtual Tensor loss(const Tensor& inputs, const Tensor& targets);
  // The loss of a batch by role (ds/nn/batch.h): what the engine's default loss function calls.
  // The default is loss(input_ids, labels) and refuses a batch with other inputs (naming them):
  // models that read them (encoders, encoder-decoders) override it.
  virtual Tensor loss(const Batch& batch);
  // Initial values of elements [begin, begin + count) of parameter `index` (named_parameters()
  // order) as fp32 into out, for a parameter that was never materialised (a model built under
  // nn::PartitionedInit, whose ZeRO-3 shards are initialised piece by piece). Returns false when
  // the module cannot (the default): such a model must be built whole.
  virtual bool init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const;

  const std::string& type_name() const { return type_name_; }

  // ---- the tree ----
  // Parameters in registration order, submodules' after the module's own, prefixed "a.b.name".
  // A tensor registered in two places (tied weights) is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // This module ("") and every descendant, pre-order.
  std::vector<std::pair<std::string, Module*>> named_modules() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  int64_t num_parameters() const;
  // This module's own parameters (not its children's), in registration order; a tied weight
  // appears in every module that registered it.
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return params_; }
  Tensor parameter(const std::string& name) const;  // own parameter by local name

  void train(bool on = true);
  bool is_training() const { return training_; }
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  bool gradient_checkpointing() const { return checkpointing_; }
  void zero_grad();  // zeroes existing gradients in place (keeps flat-buffer views)
  // Moves every parameter, gradient and buffer of the tree to device, in place: each Tensor handle
  // keeps its identity (its storage is replaced by a contiguous copy on device), so tied weights
  // stay tied and anything holding the handles sees the new memory. Views into a flat buffer
  // become tensors of their own: move a model before flattening its parameters. A module with
  // tensors outside its parameters and buffers moves those too (override, then call this).
  virtual void to(Device device);

  // ---- hooks ----
  using ForwardPreHook = std::function<void(Module&, const Tensor& input)>;
  using ForwardHook = std::function<void(Module&, const Tensor& input, const Tensor& output)>;
  using BackwardHook = std::function<void(Module&)>;
  int register_forward_pre_hook(ForwardPreHook hook);
  int register_forward_hook(ForwardHook hook);
  int register_backward_pre_hook(BackwardHook hook);
  int register_backward_hook(BackwardHook hook);
  void remove_hook(int handle);

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);  // sets requires_grad and name
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect_parameters(const std::string& prefix,
                          std::vector<std::pair<std::string, Tensor>>& out,
                          std::vector<const TensorImpl*>& seen) const;
  void run_backward_hooks();
  void run_backward_pre_hooks();

  std::string type_name_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  bool checkpointing_ = false;

  int next_hook_ = 0;
  std::vector<std::pair<int, ForwardPreHook>> forward_pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> forward_hooks_;
  std::vector<std::pair<int, BackwardHook>> backward_pre_hooks_;
  std::vector<std::pair<int, BackwardHook>> backward_hooks_;
};

}  // namespace ds::nn
