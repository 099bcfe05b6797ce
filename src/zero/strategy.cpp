// What every ZeRO strategy shares: gradient averaging factors, the global gradient norm, and the
// factory that picks the stage family.
#include "ds/zero/strategy.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "offload/step_scheduler.h"
#include "strategies.h"

namespace ds::zero {

Strategy::Strategy(nn::Module& model, std::shared_ptr<comm::Group> group, Options options,
                   std::shared_ptr<comm::Group> replicas)
    : model_(model),
      group_(std::move(group)),
      replicas_(std::move(replicas)),
      options_(options),
      norm_(group_) {
  // Gradients are averaged over every data-parallel rank: the group's, times MiCS's replicas.
  const int n = group_->size() * (replicas_ ? replicas_->size() : 1);
  if (n == 1) {
    // No reduction: nothing is divided before it, so nothing is multiplied after it (the
    // predivide factor left the gradients f times too large here, and their norm and clipping
    // with them).
    comm_prescale_ = 1.0f;
    grad_post_scale_ = 1.0;
  } else if (options_.prescale_gradients) {
    comm_prescale_ = static_cast<float>(1.0 / n);
    grad_post_scale_ = 1.0;
  } else {
    comm_prescale_ = static_cast<float>(1.0 / options_.gradient_predivide_factor);
    grad_post_scale_ = options_.gradient_predivide_factor / n;
  }
}

Strategy::~Strategy() = default;  // stage 3 joins its worker first (the worker uses its members)

void Strategy::place_frozen() {
  const auto frozen = nn::frozen_parameters(model_);
  DS_CHECK(frozen.size() < model_.named_parameters().size(),
           "[zero] every parameter of the model is frozen (requires_grad false): nothing to train "
           "(with LoRA, check that lora_module_name matches some Linear modules)");
  if (frozen.empty()) return;
  for (const auto& [name, p] : frozen)
    DS_CHECK(p.is_materialized(),
             "[zero] frozen parameter '{}' holds no data (built under nn::PartitionedInit?); build "
             "the model whole when parameters are frozen",
             name);
  frozen_ = nn::flatten_parameters(frozen, options_.train_dtype, options_.train_dtype, 1,
                                   /*with_grads=*/false);
  if (group_->size() > 1) group_->broadcast(frozen_.params, 0, "initial frozen weights");
}

void Strategy::set_gradient_all_reduce(bool on) {
  DS_CHECK(on || options_.stage == 0,
           "[zero] the gradient all-reduce can be turned off at stage 0 only (stage {})",
           options_.stage);
  all_reduce_gradients_ = on;
}

double Strategy::global_sum_of_squares(const Tensor& g, const std::string& ctx) {
  DS_CHECK(is_floating(g.dtype()) && g.numel() == opt_numel_ && g.is_contiguous(),
           "[zero] the gradients for the norm must be ({},) floating point, got {} {}", opt_numel_,
           shape_str(g.shape()), dtype_name(g.dtype()));
  return norm_.reduce(norm_.local(g), ctx);
}

void Strategy::set_pipeline_parallel(std::shared_ptr<comm::Group> pipe) {
  norm_.set_pipeline_parallel(std::move(pipe));
}

void Strategy::set_expert_parallel(std::shared_ptr<comm::Group> ep,
                                   const std::set<std::string>& experts) {
  if (!ep || ep->size() == 1) return;
  DS_CHECK(!ep_, "[zero] set_expert_parallel() was already called");
  DS_CHECK(!replicas_,
           "[zero] MiCS (mics_shard_size) does not combine with expert parallelism here; use "
           "plain stage 3 or autoep_size 1");
  DS_CHECK(all_reduce_gradients_, "[zero] expert parallelism needs the gradient all-reduce");
  ep_dense_ = optimizer_ranges_of(experts, /*complement=*/true);
  std::vector<GradNorm::SharedRange> dense;
  for (auto [a, z] : ep_dense_) dense.push_back({a, z, ep->size()});
  norm_.set_expert_parallel(ep, std::move(dense));
  // Average over every data-parallel rank: the group's (the constructor's factors, also with
  // prescale_gradients, whose pre-division the buckets already hold) and the expert-parallel ones.
  grad_post_scale_ /= ep->size();
  ep_ = std::move(ep);
}

Tensor Strategy::reduced_gradients(const std::string& ctx) {
  Tensor g = reduce_gradients(ctx);
  if (!ep_ || ep_dense_.empty()) return g;
  // The dense ranges, packed, summed over the expert-parallel ranks, and unpacked.
  int64_t n = 0;
  for (auto [a, z] : ep_dense_) n += z - a;
  Tensor packed = Tensor::empty({n}, g.dtype(), g.device());
  int64_t at = 0;
  for (auto [a, z] : ep_dense_) {
    packed.flat_range(at, z - a).copy_from(g.flat_range(a, z - a));
    at += z - a;
  }
  ep_->all_reduce(packed, comm::ReduceOp::sum, ctx + " dense gradients over expert-parallel ranks");
  at = 0;
  for (auto [a, z] : ep_dense_) {
    g.flat_range(a, z - a).copy_from(packed.flat_range(at, z - a));
    at += z - a;
  }
  return g;
}

void Strategy::set_tensor_parallel(std::shared_ptr<comm::Group> tp,
                                   const std::map<std::string, int>& copies) {
  if (!tp || tp->size() == 1) return;
  std::set<std::string> cut;
  std::map<int, std::set<std::string>> shared;  // by number of copies > 1
  for (const auto& [name, c] : copies) {
    DS_CHECK(c >= 1 && c <= tp->size() && tp->size() % c == 0,
             "[zero] parameter '{}' is said to be held by {} of the {} tensor-parallel ranks", name,
             c, tp->size());
    cut.insert(name);
    if (c > 1) shared[c].insert(name);
  }
  std::vector<GradNorm::SharedRange> ranges;
  for (auto [a, z] : optimizer_ranges_of(cut, /*complement=*/true))
    ranges.push_back({a, z, tp->size()});
  for (const auto& [c, names] : shared)
    for (auto [a, z] : optimizer_ranges_of(names, /*complement=*/false))
      ranges.push_back({a, z, c});
  norm_.set_tensor_parallel(std::move(tp), std::move(ranges));
}

void Strategy::attach_optimizer(optim::Optimizer& opt,
                                const std::function<void(const std::string&)>& log) {
  DS_CHECK(!store_, "[zero] attach_optimizer() was already called");
  optimizer_steps_in_slices_ = opt.steps_in_slices();
  // In fp32 training the parameters are the master weights, unless they live on NVMe.
  const bool master_is_params = options_.train_dtype == DType::f32 && !params_on_nvme();
  if (options_.nvme_optimizer) {
    // The store is written sub-group by sub-group; initial_master() fills each (stage 3 computes
    // them there, so no full fp32 copy has to exist in RAM).
    store_ = nvme_state_store(
        *options_.nvme_optimizer, group_->rank(), opt_numel_,
        master_is_params ? master_ : Tensor(),
        [this](int64_t begin, int64_t numel, float* out) { initial_master(begin, numel, out); },
        opt, log);
    if (store_->holds_master()) master_ = Tensor();  // the swap file has them now
    if (log) log(store_->describe());
  } else {
    DS_CHECK(master_.defined(), "[zero] internal: RAM optimizer state without master weights");
    // Parameters on NVMe are written one sub-group at a time: step the RAM state in the same
    // sub-groups.
    store_ = host_state_store(master_, opt,
                              params_on_nvme() ? io::align_up(options_.sub_group_size, 2048) : 0);
  }
  on_attached();
}

void Strategy::initial_master(int64_t begin, int64_t numel, float* out) {
  DS_CHECK(master_.defined() && begin >= 0 && begin + numel <= master_.numel(),
           "[zero] internal: initial master weights [{}, {}) requested without master weights",
           begin, begin + numel);
  std::memcpy(out, master_.data<float>() + begin, static_cast<size_t>(numel) * sizeof(float));
}

Strategy::OffloadStats Strategy::offload_stats() const {
  OffloadStats o;
  o.grad_bytes_in_backward = host_step_.bytes_sent_in_backward();
  if (!store_) return o;
  const StoreStats s = store_->stats();
  o.bytes_read = s.bytes_read;
  o.bytes_written = s.bytes_written;
  o.disk_bytes = s.disk_bytes;
  // The training thread's waits: the store's own when it steps on this thread, else the waits for
  // the background step.
  const detail::StepScheduler* bg = scheduler();
  const detail::StepScheduler::Stats w = bg ? bg->stats() : detail::StepScheduler::Stats{};
  o.wait_seconds = (bg && bg->background() ? 0.0 : s.io_wait_seconds) + w.wait_seconds;
  o.final_in_backward = w.final_in_backward;
  o.stepped_in_backward = w.stepped_in_backward;
  return o;
}

StateStore& Strategy::state() const {
  DS_CHECK(store_, "[zero] the optimizer state is not placed yet: call attach_optimizer()");
  return *store_;
}

void Strategy::optimizer_step(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                              const std::string& ctx) {
  DS_CHECK(is_floating(grads.dtype()) && grads.numel() == opt_numel_ && grads.is_contiguous(),
           "[zero] the optimizer needs ({},) floating-point gradients", opt_numel_);
  const DType train = options_.train_dtype;
  if (!offloaded()) {
    // Parameters on a GPU: the gradients (fp32 or 16-bit) come to the host optimizer in chunks.
    if (const Tensor dev = device_parameters(); dev.defined())
      return host_step_.run_for_device(opt, master_, grads, grad_scale, dev, train,
                                       options_.sub_group_size);
    return host_step_.run(opt, master_, grads, grad_scale, params16(), train);
  }
  DS_CHECK(!step_pending(), "[zero] {}: the previous optimizer step is still running; call "
           "synchronize() first", ctx);
  detail::StepScheduler* bg = scheduler();
  if (bg && bg->background()) {
    opt.begin_step();
    bg->start(state().chunk_numel(), state().chunks(), ctx,
              [this, &opt, grads, grad_scale, bg](const ChunkOrder& order) {
                step_chunks(opt, grads, grad_scale, order, bg);
              });
    return;
  }
  // Synchronous: a failed read or write on one rank must not leave the others waiting in the
  // parameter gather that follows: every rank learns of it.
  std::string error;
  try {
    opt.begin_step();
    step_chunks(opt, grads, grad_scale, ChunkOrder(), /*background=*/nullptr);
  } catch (const Error& e) {
    error = fmt::format("[zero] rank {}, {}, optimizer step on NVMe-offloaded state: {}",
                        group_->rank(), ctx, e.what());
  }
  comm::raise_if_any_failed(*group_, error, ctx + ": optimizer step on NVMe-offloaded state");
}

void Strategy::step_chunks(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                           const ChunkOrder& order, detail::StepScheduler* background) {
  // One sub-group at a time, as the state streams in. 16-bit gradients are widened per sub-group
  // (no full fp32 copy); new parameters go to params16() or, on NVMe, to the swap file as soon as
  // their sub-group is stepped.
  const DType train = options_.train_dtype;
  const DType out16_dtype = train != DType::f32 ? train : DType::bf16;
  const int64_t esize = static_cast<int64_t>(dtype_size(train));
  char* out16 = static_cast<char*>(params16());
  chunks_starting();
  auto visit = [&](const StateChunk& c) {
    if (background) background->before_chunk(c);  // a step during backward: gradients final
    void* out = params_on_nvme() ? params_out(c) : out16 ? out16 + c.begin * esize : nullptr;
    void* step_out = train == DType::f32 ? nullptr : out;
    auto compute = [&] {
      if (grads.dtype() == DType::f32) {
        opt.step_slice(c.master, grads.data<float>() + c.begin, c.states.data(), c.numel,
                       grad_scale, step_out, out16_dtype);
        return;
      }
      // 16-bit gradients: widened a cache-sized tile at a time, each stepped at once, so the fp32
      // copy never goes to memory (Adam is per element: the same results as one call).
      constexpr int64_t kTile = 16384;
      std::vector<float*> states(c.states.size());
      for (int64_t t = 0; t < c.numel; t += kTile) {
        const int64_t len = std::min(kTile, c.numel - t);
        for (size_t i = 0; i < states.size(); ++i) states[i] = c.states[i] + t;
        opt.step_slice(c.master + t, host_step_.widen(grads, c.begin + t, len), states.data(), len,
                       grad_scale, step_out ? static_cast<char*>(step_out) + t * esize : nullptr,
                       out16_dtype);
      }
    };
    // In the background the training thread steps the sub-group between two of its kernels
    // (step_posted_chunk(), with all the cores) and this thread only moves the data: computing
    // here would take a core from the training thread's parallel kernels, which then wait for it.
    if (!background || !background->hand_to_training_thread(compute)) compute();
    if (params_on_nvme()) {
      if (train == DType::f32)
        std::memcpy(out, c.master, static_cast<size_t>(c.numel) * sizeof(float));
      params_written(c);
    }
    const auto ready = chunk_stepped(c);
    if (background) background->mark_readable(ready);
  };
  if (order)
    state().for_each(Access::Update, order, visit);
  else
    state().for_each(Access::Update, visit);
  if (params_on_nvme()) params_flushed();
}

void Strategy::plan_step_in_backward(optim::Optimizer& opt, float grad_scale) {
  DS_CHECK(can_step_in_backward() && scheduler(),
           "[zero] internal: this strategy cannot step during backward");
  scheduler()->plan(opt, grad_scale);
}

bool Strategy::stepping_in_backward() const {
  const detail::StepScheduler* bg = scheduler();
  return bg && bg->in_backward();
}

bool Strategy::step_pending() const {
  const detail::StepScheduler* bg = scheduler();
  return bg && bg->pending();
}

bool Strategy::start_planned_step(const std::string& ctx) {
  detail::StepScheduler* bg = scheduler();
  float grad_scale = 1.0f;
  optim::Optimizer* opt = bg ? bg->take_plan(&grad_scale) : nullptr;
  if (!opt) return false;
  DS_CHECK(!bg->pending(), "[zero] {}: the previous optimizer step is still running", ctx);
  Tensor grads = reduced_gradients(ctx);
  opt->begin_step();
  bg->start_in_backward(state().chunk_numel(), state().chunks(), grads, ctx,
                        [this, opt, grads, grad_scale, bg](const ChunkOrder& order) {
                          step_chunks(*opt, grads, grad_scale, order, bg);
                        });
  return true;
}

double Strategy::step_in_backward_sum_of_squares(const std::string& ctx) {
  DS_CHECK(scheduler(), "[zero] internal: no optimizer step ran in a finished backward");
  return norm_.reduce(scheduler()->take_in_backward_sum(), ctx);
}

void Strategy::join_step() noexcept {
  if (detail::StepScheduler* bg = scheduler()) bg->join();
}

void Strategy::synchronize(const std::string& ctx) {
  if (!offloaded()) return;
  std::string error;
  if (detail::StepScheduler* bg = scheduler()) {
    bg->join();
    error = bg->take_failure();
  }
  comm::raise_if_any_failed(*group_, error, ctx + ": NVMe-offloaded optimizer step or parameters");
}

void Strategy::prefetch_optimizer_state(bool boundary) {
  if (!boundary || !store_ || step_pending() || !options_.prefetch_in_backward) return;
  store_->prefetch();
}

int64_t Strategy::master_bytes() const {
  // In fp32 training the master weights are the parameters, except under stage 3 with the
  // parameter pieces on NVMe: then master_ is the optimizer's own copy in RAM.
  const bool separate = options_.train_dtype != DType::f32 ||
                        (options_.stage == 3 && options_.nvme_params.has_value());
  return separate && master_.defined()
             ? static_cast<int64_t>(master_.nbytes())
             : 0;
}

void Strategy::round_master_into(const Tensor& dst) {
  state().for_each(Access::Read, [&](const StateChunk& c) {
    auto st = Storage::external(c.master, static_cast<size_t>(c.numel) * sizeof(float), kCPU);
    dst.flat_range(c.begin, c.numel).copy_from(Tensor::from_storage(st, {c.numel}, DType::f32));
  });
}

void Strategy::write_params_from_master() {
  const DType train = options_.train_dtype;
  state().for_each(Access::Read, [&](const StateChunk& c) {
    void* out = params_out(c);
    auto src = Storage::external(c.master, static_cast<size_t>(c.numel) * sizeof(float), kCPU);
    auto dst = Storage::external(out, static_cast<size_t>(c.numel) * dtype_size(train), kCPU);
    Tensor::from_storage(dst, {c.numel}, train)
        .copy_from(Tensor::from_storage(src, {c.numel}, DType::f32));
    params_written(c);
  });
  params_flushed();
}

std::unique_ptr<Strategy> make_strategy(nn::Module& model, std::shared_ptr<comm::Group> group,
                                        const Options& options) {
  DS_CHECK(group, "[zero] make_strategy needs a group");
  DS_CHECK(options.stage >= 0 && options.stage <= 3, "[zero] stage must be 0-3, got {}",
           options.stage);
  if (options.stage == 3) {
    return detail::make_stage3_strategy(model, std::move(group), options);
  }
  return detail::make_flat_strategy(model, std::move(group), options);
}

}  // namespace ds::zero
