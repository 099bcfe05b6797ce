#include "ds/runtime/engine.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/models/gpt.h"
#include "ds/ops/ops.h"

namespace ds::runtime {
namespace {

// The gradient accumulation dtype: data_types.grad_accum_dtype when given; otherwise fp32 for fp32
// and bf16 training (DeepSpeed's bf16 optimizer accumulates in fp32) and fp16 for fp16 training.
DType resolve_grad_dtype(const DeepSpeedConfig& c) {
  if (c.data_types.grad_accum_dtype) return *c.data_types.grad_accum_dtype;
  return c.fp16.enabled ? DType::f16 : DType::f32;
}

optim::OptimizerParams optimizer_params(const OptimizerConfig& o) {
  optim::OptimizerParams p;
  p.lr = static_cast<float>(o.lr);
  p.beta1 = static_cast<float>(o.betas[0]);
  p.beta2 = static_cast<float>(o.betas[1]);
  p.eps = static_cast<float>(o.eps);
  p.weight_decay = static_cast<float>(o.weight_decay);
  p.bias_correction = o.bias_correction;
  p.adam_w_mode = o.adam_w_mode;
  p.max_coeff = static_cast<float>(o.max_coeff);
  p.min_coeff = static_cast<float>(o.min_coeff);
  p.momentum = static_cast<float>(o.momentum);
  p.dampening = static_cast<float>(o.dampening);
  p.nesterov = o.nesterov;
  return p;
}

std::string optimizer_name(const OptimizerConfig& o) {
  switch (o.type) {
    case OptimizerType::None:   // no optimizer section: DeepSpeed leaves it to the client; we
    case OptimizerType::AdamW:  // default to AdamW with the section's defaults
      return "AdamW";
    case OptimizerType::Adam:
      return "Adam";
    case OptimizerType::Lamb:
      return "Lamb";
    case OptimizerType::SGD:
      return "SGD";
    default:
      DS_THROW(
          "[engine] optimizer '{}' is accepted by the config but not implemented yet; use "
          "Adam, AdamW, Lamb or SGD",
          optimizer_type_name(o.type));
  }
}

LossFn default_loss_fn() {
  return [](nn::Module& m, const Tensor& x, const Tensor& y) {
    auto* gpt = dynamic_cast<models::GPT*>(&m);
    DS_CHECK(gpt, "[engine] the model is not a models::GPT; pass InitOptions::loss_fn");
    return gpt->loss(x, y);
  };
}

}  // namespace

Engine::Engine(std::shared_ptr<nn::Module> model, DeepSpeedConfig config, InitOptions options)
    : model_(std::move(model)),
      config_(std::move(config)),
      options_(std::move(options)),
      scheduler_(config_.scheduler, config_.optimizer.lr),
      scaler_(LossScaler::from_config(config_.fp16)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  DS_CHECK(model_, "[engine] initialize() needs a model");
  DS_CHECK(config_.batch.world_size == 1,
           "[engine] world size {} requested, but this build trains on one process; multi-process "
           "ZeRO needs the comm layer (launch with a single rank for now)",
           config_.batch.world_size);
  if (!options_.loss_fn) options_.loss_fn = default_loss_fn();
  scaler_.set_rank(options_.rank);
  scaler_.set_log_sink([this](const std::string& m) { log(m); });

  const DType train = config_.training_dtype();
  const DType grads = resolve_grad_dtype(config_);
  // Flatten in fp32 first: that buffer becomes the master copy (or the parameters themselves in
  // fp32 training). For 16-bit training flatten again in the training dtype: same order and
  // offsets, values rounded to nearest even, parameters rebound to the 16-bit buffer.
  nn::FlatParameters f32 = nn::flatten_parameters(*model_, DType::f32, grads);
  if (train == DType::f32) {
    flat_ = std::move(f32);
    master_ = flat_.params;
  } else {
    master_ = f32.params;
    flat_ = nn::flatten_parameters(*model_, train, grads);
  }
  if (grads != DType::f32) grads32_ = Tensor::zeros({flat_.padded_numel});

  optimizer_ =
      optim::make_optimizer(optimizer_name(config_.optimizer), optimizer_params(config_.optimizer));
  std::vector<optim::Segment> segments;
  for (const auto& e : flat_.entries) segments.push_back({e.offset, e.numel});
  optimizer_->set_segments(segments);
  optimizer_->init_state(flat_.padded_numel);
}

Engine::~Engine() = default;

void Engine::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else if (options_.rank == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

Tensor Engine::forward(const Tensor& inputs, const Tensor& targets) {
  model_->train(true);
  return options_.loss_fn(*model_, inputs, targets);
}

Tensor Engine::eval_loss(const Tensor& inputs, const Tensor& targets) {
  autograd::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->train(false);
  Tensor loss = options_.loss_fn(*model_, inputs, targets);
  model_->train(was_training);
  return loss;
}

void Engine::backward(const Tensor& loss) {
  DS_CHECK(loss.defined() && loss.numel() == 1, "[engine] backward() needs the scalar loss");
  const double gas = static_cast<double>(config_.batch.gradient_accumulation_steps);
  Tensor scaled = ops::mul(loss.dtype() == DType::f32 ? loss : ops::cast(loss, DType::f32),
                           static_cast<float>(scaler_.scale() / gas));
  scaled.backward();
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const {
  return scheduler_.get_lr();
}

const float* Engine::grads_fp32() const {
  return flat_.grads.dtype() == DType::f32 ? flat_.grads.data<float>() : grads32_.data<float>();
}

double Engine::grad_norm_squared() {
  if (flat_.grads.dtype() != DType::f32) grads32_.copy_from(flat_.grads);
  const float* g = grads_fp32();
  const int64_t n = flat_.padded_numel;
  // Fixed tiles summed in order: the same value for any thread count.
  constexpr int64_t kTile = 1 << 16;
  const int64_t tiles = (n + kTile - 1) / kTile;
  std::vector<double> partial(static_cast<size_t>(tiles), 0.0);
  parallel_for(tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double acc = 0.0;
      const int64_t end = std::min(n, (t + 1) * kTile);
      for (int64_t i = t * kTile; i < end; ++i) acc += static_cast<double>(g[i]) * g[i];
      partial[static_cast<size_t>(t)] = acc;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void Engine::zero_grads() {
  flat_.grads.zero_();
}

bool Engine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  global_samples_ += config_.batch.train_micro_batch_size_per_gpu * config_.batch.world_size;
  if (!boundary) return false;

  const double scale = scaler_.scale();
  const double norm_scaled = std::sqrt(grad_norm_squared());
  const bool overflow = !std::isfinite(norm_scaled);
  last_grad_norm_ = norm_scaled / scale;
  ++global_steps_;

  bool skip = false;
  if (config_.fp16.enabled && scaler_.dynamic()) {
    skip = scaler_.update(overflow).skip_step;  // logs OVERFLOW and throws at the minimum scale
  } else if (overflow) {
    skip = true;
    log(
        fmt::format("[engine] step {}: the gradient norm is not finite (inf/NaN in the gradients); "
                    "skipping this step",
                    global_steps_));
  } else if (config_.fp16.enabled) {
    scaler_.update(false);
  }
  last_step_skipped_ = skip;
  if (skip) {
    ++skipped_steps_;
    zero_grads();
    DS_CHECK(++consecutive_skips_ < options_.max_consecutive_skips,
             "[engine] {} optimizer steps in a row were skipped because the gradients are not "
             "finite (last at step {}). The run is diverging: lower the learning rate, enable "
             "gradient_clipping, use bf16 instead of fp16, or check the data for bad tokens",
             consecutive_skips_, global_steps_);
    return false;
  }
  consecutive_skips_ = 0;

  // Unscale and clip in one factor (reference §5).
  const ClipCoefficient clip =
      unscale_and_clip_coefficient(norm_scaled, scale, config_.gradient_clipping);
  optimizer_->set_lr(static_cast<float>(scheduler_.get_lr()));
  if (auto beta1 = scheduler_.get_beta1()) optimizer_->set_momentum(static_cast<float>(*beta1));
  const bool sixteen = flat_.params.dtype() != DType::f32;
  optimizer_->step(master_.data<float>(), grads_fp32(), flat_.padded_numel,
                   static_cast<float>(clip.factor), sixteen ? flat_.params.raw_data() : nullptr,
                   sixteen ? flat_.params.dtype() : DType::bf16);
  scheduler_.step();
  zero_grads();
  return true;
}

MemoryBudget Engine::memory_budget() const {
  MemoryBudget b;
  b.params = static_cast<int64_t>(flat_.params.nbytes());
  b.grads = static_cast<int64_t>(flat_.grads.nbytes()) +
            (grads32_.defined() ? static_cast<int64_t>(grads32_.nbytes()) : 0);
  b.master_weights =
      flat_.params.dtype() == DType::f32 ? 0 : static_cast<int64_t>(master_.nbytes());
  b.optimizer_states = optimizer_->state_numel() * optimizer_->state_floats_per_param() *
                       static_cast<int64_t>(sizeof(float));
  return b;
}

std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model, DeepSpeedConfig config,
                                   InitOptions options) {
  return std::make_unique<Engine>(std::move(model), std::move(config), std::move(options));
}

std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options) {
  DeepSpeedConfig cfg = parse_config(config_path_or_json, options.ctx);
  return initialize(std::move(model), std::move(cfg), std::move(options));
}

}  // namespace ds::runtime
