#include "ds/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "ds/autograd/grad_mode.h"
#include "ds/comm/logger.h"
#include "ds/core/allocator.h"
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
  group_ = options_.group ? options_.group : comm::world();
  const int n = group_->size();
  DS_CHECK(config_.batch.world_size == n,
           "[engine] the config's batch sizes were resolved for {} ranks but the job has {}; pass "
           "ConfigContext::world_size = {} when parsing",
           config_.batch.world_size, n, n);
  stage_ = config_.zero_optimization.stage;
  DS_CHECK(stage_ >= 0 && stage_ <= 3, "[engine] zero_optimization.stage must be 0-3, got {}",
           stage_);
  if (!options_.loss_fn) options_.loss_fn = default_loss_fn();
  if (config_.comms_logger.enabled) comm::comms_logger().enable(true);
  scaler_.set_rank(group_->rank());
  scaler_.set_log_sink([this](const std::string& m) { log(m); });

  const DType train = config_.training_dtype();
  const DType grads = resolve_grad_dtype(config_);
  grad_dtype_ = grads;
  // With one rank nothing travels: keep the accumulation dtype rather than round for nothing.
  comm_dtype_ = n > 1 ? config_.communication_data_type : grads;
  const int64_t multiple = zero::padding_multiple(n);
  const bool sharded = stage_ >= 1 && n > 1;
  if (stage_ == 3) {
    stage3_setup();
  } else {
    const bool full_grads = stage_ < 2;
    // Flatten in fp32 first: that buffer becomes the master copy (or the parameters themselves in
    // fp32 training). For 16-bit training flatten again in the training dtype: same order and
    // offsets, values rounded to nearest even, parameters rebound to the 16-bit buffer.
    nn::FlatParameters f32 =
        nn::flatten_parameters(*model_, DType::f32, grads, multiple, full_grads);
    plan_ = zero::plan_partitions(f32.numel, n);
    DS_CHECK(plan_.padded_numel == f32.padded_numel, "[engine] internal: padding plan disagrees");
    opt_begin_ = sharded ? plan_.begin(group_->rank()) : 0;
    opt_numel_ = sharded ? plan_.partition_numel : plan_.padded_numel;
    auto range = [&](const Tensor& t) { return t.flat_range(opt_begin_, opt_numel_); };
    if (train == DType::f32) {
      flat_ = std::move(f32);
      master_ = range(flat_.params);
    } else {
      // Only this rank's range of the fp32 copy is kept as master weights.
      master_ = range(f32.params).clone();
      f32 = {};
      flat_ = nn::flatten_parameters(*model_, train, grads, multiple, full_grads);
    }
    if (!full_grads) grads_part_ = Tensor::zeros({opt_numel_}, grads);
    if (grads != DType::f32) grads32_ = Tensor::zeros({opt_numel_});

    // Every rank starts from rank 0's weights (initialisation is rank-independent already; this
    // also covers models initialised by the caller).
    if (n > 1) group_->broadcast(flat_.params, 0, "initial weights");
  }

  optimizer_ =
      optim::make_optimizer(optimizer_name(config_.optimizer), optimizer_params(config_.optimizer));
  // One segment per parameter tensor over this rank's range (Lamb's trust ratio is per tensor),
  // the same list on every rank: numel 0 where the rank holds none of the tensor.
  std::vector<optim::Segment> segments;
  if (stage_ == 3) {
    for (const auto& sp : s3_)
      segments.push_back(
          {sp.shard_offset, std::clamp<int64_t>(sp.numel - group_->rank() * sp.part, 0, sp.part)});
  } else {
    for (const auto& e : flat_.entries) {
      const int64_t b = std::clamp<int64_t>(e.offset, opt_begin_, opt_begin_ + opt_numel_);
      const int64_t en =
          std::clamp<int64_t>(e.offset + e.numel, opt_begin_, opt_begin_ + opt_numel_);
      segments.push_back({b - opt_begin_, en - b});
    }
  }
  optimizer_->set_segments(segments);
  if (auto* lamb = dynamic_cast<optim::Lamb*>(optimizer_.get()); lamb && sharded) {
    // A tensor cut by partition boundaries has a piece on several ranks: its ||p||^2 and
    // ||update||^2 are the sums of the pieces'. Gathered as raw doubles and summed in rank order,
    // so every rank computes the same trust ratios.
    lamb->set_norm_reducer([this](double* sums, int64_t count) {
      const int n = group_->size();
      std::vector<double> all(static_cast<size_t>(count) * static_cast<size_t>(n));
      group_->all_gather(sums, all.data(), static_cast<size_t>(count), DType::i64,
                         fmt::format("step {} Lamb norms", global_steps_));
      for (int64_t k = 0; k < count; ++k) {
        double total = 0.0;
        for (int r = 0; r < n; ++r) total += all[static_cast<size_t>(r * count + k)];
        sums[k] = total;
      }
    });
  }
  optimizer_->init_state(opt_numel_);

  // Gradient reduction: how gradients are averaged, and the bucket plan hung on the hooks.
  const double predivide = config_.gradient_predivide_factor;
  if (config_.prescale_gradients) {
    comm_prescale_ = static_cast<float>(1.0 / n);
    grad_post_scale_ = 1.0;
  } else {
    comm_prescale_ = static_cast<float>(1.0 / predivide);
    grad_post_scale_ = predivide / n;
  }
  if (stage_ < 3 && (n > 1 || stage_ == 2)) {
    const auto bucket_numel =
        std::max<int64_t>(1, static_cast<int64_t>(config_.zero_optimization.reduce_bucket_size));
    buckets_ = zero::plan_buckets(flat_.entries, plan_.padded_numel, bucket_numel);
    param_buckets_.assign(flat_.entries.size(), {});
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (int i : buckets_[b].params)
        param_buckets_[static_cast<size_t>(i)].push_back(static_cast<int>(b));
    bucket_pending_.assign(buckets_.size(), 0);
    bucket_staging_.assign(buckets_.size(), Tensor());
    auto named = model_->named_parameters();
    for (size_t i = 0; i < named.size(); ++i)
      named[i].second.add_grad_ready_hook(
          [this, i](const Tensor& p) { on_grad_ready(static_cast<int>(i), p); });
  }

  // The model's original parameter storages were just freed (everything now lives in the flat or
  // shard buffers). Give their memory back rather than keep it cached: those blocks are sized per
  // parameter and fragment the large pool, so the moments, gradients and activations allocated next
  // would need new memory anyway (GPT-2 124M: ~540 MiB per rank that peak RSS would otherwise
  // carry).
  cpu_allocator().empty_cache();
}

Engine::~Engine() = default;

void Engine::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else if (group_->rank() == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

Tensor Engine::forward(const Tensor& inputs, const Tensor& targets) {
  model_->train(true);
  if (stage_ == 3) stage3_begin_micro_step(true);
  return options_.loss_fn(*model_, inputs, targets);
}

Tensor Engine::eval_loss(const Tensor& inputs, const Tensor& targets) {
  autograd::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->train(false);
  // Evaluation gathers in its own order: neither record it nor follow the training trace.
  const bool recording = s3_recording_;
  if (stage_ == 3) {
    s3_recording_ = false;
    stage3_begin_micro_step(false);
  }
  Tensor loss = options_.loss_fn(*model_, inputs, targets);
  model_->train(was_training);
  if (stage_ == 3) s3_recording_ = recording;
  return loss;
}

void Engine::backward(const Tensor& loss) {
  DS_CHECK(loss.defined() && loss.numel() == 1, "[engine] backward() needs the scalar loss");
  const double gas = static_cast<double>(config_.batch.gradient_accumulation_steps);
  // Stage 2 reduces every micro-step (each rank keeps only its partition); stage 0 reduces on the
  // boundary micro-step, overlapped with its backward; stage 1 reduce-scatters in step().
  reducing_ =
      !buckets_.empty() && (stage_ == 2 || (stage_ == 0 && is_gradient_accumulation_boundary()));
  if (stage_ == 3) {
    ops::mul(loss.dtype() == DType::f32 ? loss : ops::cast(loss, DType::f32),
             static_cast<float>(scaler_.scale() / gas))
        .backward();
    stage3_finish_reductions();
    stage3_end_micro_step();
    return;
  }
  if (reducing_)
    for (size_t b = 0; b < buckets_.size(); ++b)
      bucket_pending_[b] = static_cast<int>(buckets_[b].params.size());
  Tensor scaled = ops::mul(loss.dtype() == DType::f32 ? loss : ops::cast(loss, DType::f32),
                           static_cast<float>(scaler_.scale() / gas));
  scaled.backward();
  if (reducing_) {
    // Buckets with no parameters (all padding) or parameters that got no gradient.
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (bucket_pending_[b] > 0) {
        bucket_pending_[b] = 0;
        launch_bucket(static_cast<int>(b));
      }
    finish_reductions();
    reducing_ = false;
  }
}

void Engine::on_grad_ready(int i, const Tensor& p) {
  if (!reducing_) return;
  const auto& e = flat_.entries[static_cast<size_t>(i)];
  if (stage_ == 2) {
    // Copy this parameter's gradient into each bucket it overlaps, then drop it: after this hook
    // the rank holds no full-size gradient of the parameter.
    Tensor g = p.grad().contiguous();
    for (int b : param_buckets_[static_cast<size_t>(i)]) {
      const auto& bk = buckets_[static_cast<size_t>(b)];
      Tensor& staging = bucket_staging_[static_cast<size_t>(b)];
      if (!staging.defined()) staging = Tensor::zeros({bk.end - bk.begin}, comm_dtype_);
      const int64_t lo = std::max(bk.begin, e.offset), hi = std::min(bk.end, e.offset + e.numel);
      staging.flat_range(lo - bk.begin, hi - lo).copy_from(g.flat_range(lo - e.offset, hi - lo));
    }
    p.set_grad({});
  }
  for (int b : param_buckets_[static_cast<size_t>(i)])
    if (--bucket_pending_[static_cast<size_t>(b)] == 0) launch_bucket(b);
  if (stage_ == 2) finish_reductions(buckets_in_flight());
}

void Engine::launch_bucket(int b) {
  const auto& bk = buckets_[static_cast<size_t>(b)];
  const int n = group_->size();
  PendingBucket pending;
  pending.bucket = b;
  if (stage_ == 2) {
    Tensor& staging = bucket_staging_[static_cast<size_t>(b)];
    if (!staging.defined()) staging = Tensor::zeros({bk.end - bk.begin}, comm_dtype_);
    pending.buf = staging;
  } else {
    // Stage 0: the bucket is a range of the flat gradients, reduced in place unless the
    // communication dtype differs (then a converted copy travels and is copied back).
    Tensor view = flat_.grads.flat_range(bk.begin, bk.end - bk.begin);
    if (n > 1 && comm_prescale_ != 1.0f) ops::mul_(view, comm_prescale_);
    pending.buf = comm_dtype_ == view.dtype() ? view : view.to(comm_dtype_);
  }
  if (n == 1) {
    in_flight_.push_back(std::move(pending));
    return;
  }
  if (stage_ == 2 && comm_prescale_ != 1.0f) ops::mul_(pending.buf, comm_prescale_);
  const std::string ctx = fmt::format("step {} bucket {}", global_steps_ + 1, b);
  if (stage_ == 2 && config_.zero_optimization.reduce_scatter) {
    // Reduce to the owners: the bucket splits at partition boundaries and each piece is reduced
    // to the rank that owns it (half the traffic of an all-reduce; DeepSpeed's reduce_scatter).
    for (int r = 0; r < n; ++r) {
      const int64_t lo = std::max(bk.begin, plan_.begin(r)), hi = std::min(bk.end, plan_.end(r));
      if (lo >= hi) continue;
      pending.works.push_back(group_->reduce_async(pending.buf.flat_range(lo - bk.begin, hi - lo),
                                                   r, comm::ReduceOp::sum, ctx));
    }
  } else {
    pending.works.push_back(group_->all_reduce_async(pending.buf, comm::ReduceOp::sum, ctx));
  }
  in_flight_.push_back(std::move(pending));
}

void Engine::finish_reductions(size_t keep_in_flight) {
  // Oldest first (the order they were issued in); stops when at most `keep_in_flight` remain, so
  // that during backward only the last few buckets' staging memory is alive.
  size_t done = 0;
  for (; in_flight_.size() - done > keep_in_flight; ++done) {
    PendingBucket& pending = in_flight_[done];
    for (auto& w : pending.works) w.wait();
    const auto& bk = buckets_[static_cast<size_t>(pending.bucket)];
    if (stage_ != 2) {
      Tensor view = flat_.grads.flat_range(bk.begin, bk.end - bk.begin);
      if (pending.buf.raw_data() != view.raw_data()) view.copy_from(pending.buf);
      continue;
    }
    // Keep only this rank's part of the reduced bucket.
    const int64_t lo = std::max(bk.begin, opt_begin_),
                  hi = std::min(bk.end, opt_begin_ + opt_numel_);
    if (lo < hi) {
      ops::add_(grads_part_.flat_range(lo - opt_begin_, hi - lo),
                pending.buf.flat_range(lo - bk.begin, hi - lo));
    }
    bucket_staging_[static_cast<size_t>(pending.bucket)] = Tensor();
  }
  in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<std::ptrdiff_t>(done));
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const {
  return scheduler_.get_lr();
}

Tensor Engine::optimizer_grads() {
  Tensor g = stage_ >= 2 ? grads_part_ : flat_.grads.flat_range(opt_begin_, opt_numel_);
  if (g.dtype() == DType::f32) return g;
  grads32_.copy_from(g);
  return grads32_;
}

namespace {
// Sum of squares in fixed tiles summed in order: the same value for any thread count.
double sum_of_squares(const float* g, int64_t n) {
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
}  // namespace

void Engine::zero_grads() {
  if (flat_.grads.defined()) flat_.grads.zero_();
  if (grads_part_.defined()) grads_part_.zero_();
}

bool Engine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  global_samples_ += config_.batch.train_micro_batch_size_per_gpu * config_.batch.world_size;
  if (!boundary) return false;

  const int n = group_->size();
  const std::string ctx = fmt::format("step {}", global_steps_ + 1);
  if (stage_ == 1 && n > 1) {
    // Each rank receives the sum of its partition (in place inside the full gradient buffer, or
    // through a converted copy when the communication dtype differs).
    if (comm_prescale_ != 1.0f) ops::mul_(flat_.grads, comm_prescale_);
    Tensor mine = flat_.grads.flat_range(opt_begin_, opt_numel_);
    if (comm_dtype_ == flat_.grads.dtype()) {
      group_->reduce_scatter(flat_.grads, mine, comm::ReduceOp::sum, ctx + " gradients");
    } else {
      Tensor out = Tensor::empty({opt_numel_}, comm_dtype_);
      group_->reduce_scatter(flat_.grads.to(comm_dtype_), out, comm::ReduceOp::sum,
                             ctx + " gradients");
      mine.copy_from(out);
    }
  }
  Tensor g = optimizer_grads();
  double sq = sum_of_squares(g.data<float>(), opt_numel_);
  if (stage_ >= 1 && n > 1) {
    // Global norm over the partitions; inf/NaN on any rank reaches every rank through the sum.
    float part = static_cast<float>(sq);
    group_->all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum, ctx + " gradient norm");
    sq = part;
  }
  const double scale = scaler_.scale();
  // The buffers hold prescale * sum over ranks; the average is that times grad_post_scale_.
  const double norm_scaled = std::sqrt(sq) * grad_post_scale_;
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

  // Unscale, average and clip in one factor (reference §5).
  const ClipCoefficient clip =
      unscale_and_clip_coefficient(norm_scaled, scale, config_.gradient_clipping);
  optimizer_->set_lr(static_cast<float>(scheduler_.get_lr()));
  if (auto beta1 = scheduler_.get_beta1())
    optimizer_->set_betas(static_cast<float>(*beta1),
                          static_cast<float>(LRScheduler::kOneCycleBeta2));
  const DType train = training_dtype();
  const bool sixteen = train != DType::f32;
  void* out16 = !sixteen      ? nullptr
                : stage_ == 3 ? shard_params_.raw_data()
                              : static_cast<char*>(flat_.params.raw_data()) + opt_begin_ * 2;
  optimizer_->step(master_.data<float>(), g.data<float>(), opt_numel_,
                   static_cast<float>(clip.factor * grad_post_scale_), out16,
                   sixteen ? train : DType::bf16);
  if (stage_ == 3) {
    stage3_after_step();
  } else if (stage_ >= 1 && n > 1) {
    Tensor mine = flat_.params.flat_range(opt_begin_, opt_numel_);
    group_->all_gather(mine, flat_.params, ctx + " parameters");
  }
  scheduler_.step();
  zero_grads();
  return true;
}

MemoryBudget Engine::memory_budget() const {
  MemoryBudget b;
  const bool sixteen = training_dtype() != DType::f32;
  if (stage_ == 3) {
    // The shard of every parameter (fp32 training: the master weights themselves) plus the
    // persistent parameters, which every rank keeps whole.
    b.params = static_cast<int64_t>(shard_params_.nbytes());
    for (const auto& sp : s3_)
      if (sp.persistent) b.params += static_cast<int64_t>(sp.full->nbytes());
  } else {
    b.params = static_cast<int64_t>(flat_.params.nbytes());
  }
  b.grads =
      static_cast<int64_t>(flat_.grads.defined() ? flat_.grads.nbytes() : grads_part_.nbytes());
  b.scratch = grads32_.defined() ? static_cast<int64_t>(grads32_.nbytes()) : 0;
  b.master_weights = sixteen ? static_cast<int64_t>(master_.nbytes()) : 0;
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
  if (!options.group) options.group = comm::world();
  options.ctx.world_size = options.group->size();
  DeepSpeedConfig cfg = parse_config(config_path_or_json, options.ctx);
  return initialize(std::move(model), std::move(cfg), std::move(options));
}

}  // namespace ds::runtime
