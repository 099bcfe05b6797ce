#pragma once
// muP optimizers (DeepSpeed's "MuAdam", "MuAdamW", "MuSGD", which call Microsoft's mup package):
// Adam, AdamW or SGD whose lr and weight decay are scaled per tensor by the tensor's width
// multipliers against a base model's shape (mup's InfShape). Only the optimizer part of muP: the
// model-side parametrisation (MuReadout, attention 1/d, the init rescaling that
// mup.set_base_shapes does) is the model's, as in DeepSpeed.
//
//   auto opt = make_optimizer("MuAdamW", p);
//   static_cast<Mup&>(*opt).set_scales(scales);   // one MupScale per segment (set_segments)
//
// A dimension whose size equals the base's is finite; one that differs is a width dimension with
// multiplier dim / base_dim. width_mult = the last width dimension's (fan-in for a matrix).
//   MuAdam, MuAdamW: matrix-like (2 width dims): lr / width_mult, weight_decay * width_mult.
//   MuSGD: vector-like (1 width dim): lr * width_mult, weight_decay / width_mult; matrix-like:
//          r = fan_in mult / fan_out mult, lr / r, weight_decay * r.
// Everything else keeps the configured values. MuAdam is torch.optim.Adam (L2 weight decay),
// MuAdamW torch.optim.AdamW (decoupled), MuSGD torch.optim.SGD: mup's `impl`s.
// A schedule's lr is the base that the multipliers scale (DeepSpeed's schedulers instead write
// one lr into every group, undoing the scaling). Threading: one thread calls step().
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds/optim/optimizer.h"

namespace ds::optim {

enum class MupKind { adam, adamw, sgd };

struct MupScale {
  float lr = 1.0f;
  float weight_decay = 1.0f;
};

// mup's multipliers for a tensor of `shape` whose base model's shape is `base` (same rank).
MupScale mup_scale(MupKind kind, std::span<const int64_t> shape, std::span<const int64_t> base);

class Mup final : public Optimizer {
 public:
  Mup(MupKind kind, const AdamConfig& adam, const SgdConfig& sgd);
  const char* name() const override;
  int state_floats_per_param() const override;
  MupKind kind() const { return kind_; }
  void set_segments(std::span<const Segment> segments) override;
  // One per segment, after set_segments (default: every multiplier 1, the plain optimizer).
  void set_scales(std::vector<MupScale> scales);
  const std::vector<MupScale>& scales() const { return scales_; }

  float lr() const override { return kind_ == MupKind::sgd ? sgd_.lr : adam_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override;
  void set_weight_decay(float wd) override;
  float momentum() const override { return kind_ == MupKind::sgd ? sgd_.momentum : adam_.beta1; }
  void set_momentum(float m) override;
  std::pair<float, float> betas() const override;
  void set_betas(float beta1, float beta2) override;
  std::vector<std::string> state_names() const override;
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

 private:
  void on_init_state() override;
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;

  MupKind kind_;
  AdamConfig adam_;
  SgdConfig sgd_;
  std::vector<Segment> segments_;
  std::vector<MupScale> scales_;
  bool momentum_started_ = false;  // SGD: the buffer holds a value
};

}  // namespace ds::optim

namespace ds::optim {

// Reads base shapes: mup's .bsh file (the YAML that mup.save_base_shapes writes: "name:" lines
// followed by "- 256" / "- null" items, '#' comments) or JSON {"name": [256, null], ...}. null
// (a finite dimension) reads as 0.
std::map<std::string, std::vector<int64_t>> load_mup_base_shapes(const std::string& path);

// The multipliers of `tensors` (name, shape; one per segment, in order) against the base model's
// shapes by name (a base dimension of 0 is finite: mup's null). The name sets must be equal (mup's
// check); empty `base`: every multiplier 1 (mup's set_base_shapes(model, None)).
std::vector<MupScale> mup_scales(
    MupKind kind, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
    const std::map<std::string, std::vector<int64_t>>& base);

}  // namespace ds::optim
