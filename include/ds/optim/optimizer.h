#pragma once
// Optimizers as objects: an Optimizer owns its state buffers (fp32, sized to the flat range it
// updates: the whole model, or under ZeRO this rank's partition; placed in a StateHome the caller
// may choose, host memory by default), counts steps, and exposes the
// hyper-parameters that schedulers change (lr every step; beta1/momentum for OneCycle) and the
// state a checkpoint must hold. The math lives in the flat-buffer kernels of kernels.h.
//
//   auto opt = ds::optim::make_optimizer("AdamW", {.lr = 3e-4f, .weight_decay = 0.1f});
//   opt->init_state(n);                       // once (step() does it too): allocates + zeroes
//   for (...) {
//     opt->set_lr(scheduler_lr);
//     opt->step(params, grads, n, 1 / (clip * loss_scale), params16, DType::bf16);
//   }
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/optim/kernels.h"

namespace ds::optim {

// The 1-bit optimizers' own keys (DeepSpeed's OnebitAdam / ZeroOneAdam / OnebitLamb arguments;
// onebit.h).
struct OneBitParams {
  int64_t freeze_step = 100000;      // OneBitAdam: warm-up steps before compression
  int64_t var_freeze_step = 100000;  // ZeroOneAdam: the variance stops changing after this step
  int64_t var_update_scaler = 16;    // ZeroOneAdam: variance updates per interval before doubling
  int64_t local_step_scaler = 32678;  // ZeroOneAdam: steps per local-step interval doubling
  int64_t local_step_clipper = 16;    // ZeroOneAdam: the local-step interval's cap
  float coeff_beta = 0.9f;            // OneBitLamb: the warm-up trust ratios' moving average
  float factor_max = 4.0f;            // OneBitLamb: the compression stage's factor bounds
  float factor_min = 0.5f;
  float factor_threshold = 0.1f;      // OneBitLamb: the factor's largest change per step
};

// Every optimizer's parameters in one struct (DeepSpeed's "optimizer.params" keys and defaults,
// docs/config.md); each optimizer reads the fields it knows. The engine fills it from the config.
struct OptimizerParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;  // "betas": [beta1, beta2]
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  bool adam_w_mode = true;       // Adam only: true = decoupled decay (DeepSpeed's default)
  float max_coeff = 10.0f;       // Lamb
  float min_coeff = 0.01f;       // Lamb
  bool eps_inside_sqrt = false;  // Lamb
  bool lamb_legacy_bias_correction = false;  // Lamb: DeepSpeed <= 0.16.x formula (kernels.h)
  float momentum = 0.0f;                     // SGD; Muon (its default 0.95 is set by the config)
  float muon_lr = -1.0f;                     // Muon: < 0 = unset ("lr", else 0.02)
  float adam_lr = -1.0f;                     // Muon: < 0 = unset ("lr", else 3e-4)
  bool lr_given = true;                      // Muon: "lr" was in the config
  std::string ns_method = "gram";            // Muon: "gram" or "standard"
  float dampening = 0.0f;                    // SGD
  bool nesterov = false;                     // SGD
  OneBitParams onebit;                       // OneBitAdam, ZeroOneAdam, OneBitLamb
};

// A named fp32 state buffer of numel elements (for checkpoints): "exp_avg", "exp_avg_sq",
// "momentum_buffer" (PyTorch's names).
struct StateBuffer {
  std::string name;
  float* data = nullptr;
  int64_t numel = 0;
};

// Where an optimizer's fp32 state buffers live. The default home is host memory from the caching
// allocator; a ZeRO strategy can hand the optimizer another (a swapped or file-backed home for
// offload) without the kernels knowing. allocate() returns `numel` zeroed floats, 64-byte aligned,
// valid until release(); both are called from the training thread.
class StateHome {
 public:
  virtual ~StateHome() = default;
  virtual float* allocate(int64_t numel) = 0;
  virtual void release(float* data, int64_t numel) = 0;
};
// The default: the CPU caching allocator, zeroed tile by tile by the threads that later update
// each tile (first touch places the pages).
std::shared_ptr<StateHome> host_state_home();

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "Adam", "AdamW", "Lamb" or "SGD".
  virtual const char* name() const = 0;

  // Allocates the state for n elements (64-byte aligned, zeroed by the threads that will later
  // update each tile, so pages are first touched where they are used). Idempotent for the same
  // n; a different n is an error. step() calls it on first use.
  void init_state(int64_t n);
  // Where init_state() puts the buffers (default host_state_home()). Before init_state only.
  void set_state_home(std::shared_ptr<StateHome> home);
  int64_t state_numel() const { return n_; }
  // fp32 state floats kept per parameter (Adam, Lamb: 2; SGD: 1 with momentum, else 0): for the
  // memory budget printed at start-up.
  virtual int state_floats_per_param() const = 0;
  // Bytes of fp32 state held for the range (Muon's mix of 1 and 2 floats per element is exact
  // here; the others: state_numel() x state_floats_per_param() x 4).
  virtual int64_t state_bytes() const {
    return n_ < 0 ? 0 : n_ * state_floats_per_param() * static_cast<int64_t>(sizeof(float));
  }

  // One step over params[0, n) with grads[0, n). grad_scale multiplies every gradient first (the
  // engine passes 1 / (clip_coef * loss_scale)); out16, when not null, receives the updated
  // parameters rounded (nearest even) to out16_dtype (bf16 or fp16). Increments step_count().
  void step(float* params, const float* grads, int64_t n, float grad_scale = 1.0f,
            void* out16 = nullptr, DType out16_dtype = DType::bf16);

  // Steps taken (the t of the bias corrections); settable for checkpoint resume.
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t s);

  // Hyper-parameters that schedules change between steps.
  virtual float lr() const = 0;
  virtual void set_lr(float lr) = 0;
  virtual float weight_decay() const = 0;
  virtual void set_weight_decay(float wd) = 0;
  // The momentum coefficient OneCycle cycles: beta1 for Adam and Lamb, momentum for SGD
  // (DeepSpeed's OneCycle sets betas[0] when the group has betas, momentum otherwise).
  virtual float momentum() const = 0;
  virtual void set_momentum(float m) = 0;
  // (beta1, beta2); SGD has none and throws.
  virtual std::pair<float, float> betas() const;
  virtual void set_betas(float beta1, float beta2);

  // Per-tensor boundaries over the flat buffer ([offset, offset + numel), sorted, disjoint).
  // Lamb and Muon use them (its trust ratio is per tensor); the elementwise optimizers ignore them.
  // Default: the whole buffer is one segment.
  virtual void set_segments(std::span<const Segment> segments);

  // ---- stepping in slices, with the state held elsewhere (NVMe offload, zero/state_store.h) ----
  // The names of the fp32 state buffers, in order ("exp_avg", "exp_avg_sq"), allocated or not.
  virtual std::vector<std::string> state_names() const = 0;
  // True when the update is elementwise, so a range can be stepped slice by slice (Adam, AdamW).
  // Lamb's trust ratios need whole tensors, and SGD's momentum starts once per optimizer: false.
  virtual bool steps_in_slices() const { return false; }
  // Declares that the state of n elements lives outside this object (instead of init_state()):
  // state_buffers() is then empty and step() refused; use begin_step() + step_slice().
  void use_external_state(int64_t n);
  bool external_state() const { return external_; }
  // One step in slices: begin_step() counts it (the t of the bias corrections); each
  // step_slice() updates n elements with the caller's state pointers (one per state_names()
  // entry: external, or pointers into state_buffers()). Any number of slices in any order make
  // one step, equal to step() over their union.
  void begin_step();
  void step_slice(float* params, const float* grads, float* const* states, int64_t n,
                  float grad_scale = 1.0f, void* out16 = nullptr, DType out16_dtype = DType::bf16);

  // Checkpoint state: the fp32 buffers (empty before init_state) and the scalars ("step" and the
  // current hyper-parameters: "lr", "weight_decay", "beta1", ...), all JSON-representable.
  virtual std::vector<StateBuffer> state_buffers() = 0;
  virtual std::map<std::string, double> scalar_state() const;
  // Restores what scalar_state() returned (unknown keys are an error; missing keys keep their
  // current value). Buffers are restored by writing into state_buffers() after init_state(n).
  virtual void load_scalar_state(const std::map<std::string, double>& s);

 protected:
  Optimizer() = default;
  // Allocates `count` zeroed fp32 buffers of n_ elements each into bufs_.
  void allocate_buffers(int count);
  float* buffer(int i) const { return bufs_[static_cast<size_t>(i)].get(); }
  bool has_buffer(int i) const { return static_cast<size_t>(i) < bufs_.size(); }
  virtual void on_init_state() = 0;  // allocate this optimizer's buffers (n_ is set)
  // The update itself; step_count_ already counts this step.
  virtual void do_step(float* params, const float* grads, float grad_scale, void* out16,
                       DType out16_dtype) = 0;
  // One slice with explicit state (only when steps_in_slices()).
  virtual void do_step_slice(float* params, const float* grads, float* const* states, int64_t n,
                             float grad_scale, void* out16, DType out16_dtype);

  int64_t n_ = -1;  // -1 until init_state
  int64_t step_count_ = 0;
  bool external_ = false;  // use_external_state(): no buffers here

 private:
  struct BufferDeleter {
    int64_t numel;
    std::shared_ptr<StateHome> home;
    void operator()(float* p) const;
  };
  std::shared_ptr<StateHome> home_ = host_state_home();
  std::vector<std::unique_ptr<float[], BufferDeleter>> bufs_;
};

// Adam and AdamW (DeepSpeedCPUAdam's update; adam_update in kernels.h).
class Adam final : public Optimizer {
 public:
  // force_adamw: "AdamW" always uses decoupled weight decay, whatever adam_w_mode says.
  explicit Adam(const AdamConfig& c, bool force_adamw = false);
  const char* name() const override { return named_adamw_ ? "AdamW" : "Adam"; }
  int state_floats_per_param() const override { return 2; }
  const AdamConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.beta1; }
  void set_momentum(float m) override { set_betas(m, c_.beta2); }
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool steps_in_slices() const override { return true; }

 private:
  void on_init_state() override { allocate_buffers(2); }
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  void do_step_slice(float* params, const float* grads, float* const* states, int64_t n,
                     float grad_scale, void* out16, DType out16_dtype) override;
  AdamConfig c_;
  bool named_adamw_;
};

// Lamb (DeepSpeed's FusedLamb; lamb_update in kernels.h). Set the tensor segments with
// set_segments() before the first step, or the whole buffer gets one trust ratio.
class Lamb final : public Optimizer {
 public:
  explicit Lamb(const LambConfig& c);
  const char* name() const override { return "Lamb"; }
  int state_floats_per_param() const override { return 2; }
  const LambConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.beta1; }
  void set_momentum(float m) override { set_betas(m, c_.beta2); }
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  void set_segments(std::span<const Segment> segments) override;
  // Under ZeRO a tensor may span ranks: this hook, when set, sums the per-segment squared norms
  // over the ranks (count = 2 * segments: all of ||p||^2, then all of ||update||^2) between the
  // two passes. Every rank must then pass the same segment list (numel 0 where it holds none).
  void set_norm_reducer(std::function<void(double* sums, int64_t count)> reducer);
  // The trust ratios of the last step, one per segment (DeepSpeed's get_lamb_coeffs()).
  const std::vector<float>& lamb_coeffs() const { return coeffs_; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

 private:
  void on_init_state() override { allocate_buffers(2); }
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  LambConfig c_;
  std::vector<Segment> segments_;
  std::function<void(double*, int64_t)> reducer_;
  std::vector<double> sums_;  // (2, S) scratch: w2 then u2
  std::vector<float> coeffs_;
};

// SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD; sgd_update).
class Sgd final : public Optimizer {
 public:
  explicit Sgd(const SgdConfig& c);
  const char* name() const override { return "SGD"; }
  int state_floats_per_param() const override { return c_.momentum != 0 ? 1 : 0; }
  const SgdConfig& config() const { return c_; }
  float lr() const override { return c_.lr; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.momentum; }
  // Turning momentum on later allocates the buffer then; it starts from that step's gradient.
  void set_momentum(float m) override;
  std::vector<std::string> state_names() const override {
    return c_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                            : std::vector<std::string>{};
  }
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;

 private:
  void on_init_state() override;
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  SgdConfig c_;
  bool momentum_started_ = false;  // the buffer holds a value (torch: state has momentum_buffer)
};

// The optimizer named by `type` ("Adam", "AdamW", "Lamb", "SGD", and the 1-bit family of
// onebit.h; case-insensitive), as DeepSpeed's
// config names it. "Adam" honours p.adam_w_mode (default true: decoupled decay, as DeepSpeed);
// "AdamW" always decouples. Other DeepSpeed types are an error that lists the supported ones.
std::unique_ptr<Optimizer> make_optimizer(std::string_view type, const OptimizerParams& p = {});

}  // namespace ds::optim
