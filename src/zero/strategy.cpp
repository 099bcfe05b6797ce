// What every ZeRO strategy shares: gradient averaging factors, the global gradient norm, and the
// factory that picks the stage family.
#include "ds/zero/strategy.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "strategies.h"

namespace ds::zero {

Strategy::Strategy(nn::Module& model, std::shared_ptr<comm::Group> group, Options options)
    : model_(model), group_(std::move(group)), options_(options) {
  const int n = group_->size();
  if (options_.prescale_gradients) {
    comm_prescale_ = static_cast<float>(1.0 / n);
    grad_post_scale_ = 1.0;
  } else {
    comm_prescale_ = static_cast<float>(1.0 / options_.gradient_predivide_factor);
    grad_post_scale_ = options_.gradient_predivide_factor / n;
  }
}

Strategy::~Strategy() {
  join_step();  // derived strategies join first (the worker uses their members); a safety net
}

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

double Strategy::global_sum_of_squares(const Tensor& g, const std::string& ctx) {
  DS_CHECK(is_floating(g.dtype()) && g.numel() == opt_numel_ && g.is_contiguous(),
           "[zero] the gradients for the norm must be ({},) floating point, got {} {}", opt_numel_,
           shape_str(g.shape()), dtype_name(g.dtype()));
  double sq = local_sum_of_squares(g);
  if (tp_) {
    // A part held by c tp ranks is counted 1/c times on each, so once over the tp group.
    for (const SharedRange& r : tp_shared_)
      sq -= local_sum_of_squares(g.flat_range(r.begin, r.end - r.begin)) * (1.0 - 1.0 / r.copies);
  }
  return reduce_sum_of_squares(sq, ctx);
}

double Strategy::local_sum_of_squares(const Tensor& g) const {
  return backend::get(g.device()).sum_of_squares(g);
}

double Strategy::reduce_sum_of_squares(double sq, const std::string& ctx) {
  if (partitioned_) {
    // Global norm over the partitions; inf/NaN on any rank reaches every rank through the sum.
    float part = static_cast<float>(sq);
    group_->all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum, ctx + " gradient norm");
    sq = part;
  }
  if (tp_) {
    float part = static_cast<float>(sq);
    tp_->all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum,
                    ctx + " gradient norm over tensor-parallel ranks");
    sq = part;
  }
  if (pipe_) {
    float part = static_cast<float>(sq);
    pipe_->all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum,
                      ctx + " gradient norm over pipeline stages");
    sq = part;
  }
  return sq;
}

void Strategy::set_pipeline_parallel(std::shared_ptr<comm::Group> pipe) {
  if (pipe && pipe->size() > 1) pipe_ = std::move(pipe);
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
  tp_shared_.clear();
  for (auto [a, z] : optimizer_ranges_of(cut, /*complement=*/true))
    tp_shared_.push_back({a, z, tp->size()});
  for (const auto& [c, names] : shared)
    for (auto [a, z] : optimizer_ranges_of(names, /*complement=*/false))
      tp_shared_.push_back({a, z, c});
  tp_ = std::move(tp);
}

void Strategy::attach_optimizer(optim::Optimizer& opt,
                                const std::function<void(const std::string&)>& log) {
  DS_CHECK(!store_, "[zero] attach_optimizer() was already called");
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
  if (!store_) return o;
  const StoreStats s = store_->stats();
  o.bytes_read = s.bytes_read;
  o.bytes_written = s.bytes_written;
  o.disk_bytes = s.disk_bytes;
  // The training thread's waits: the store's own when it steps on this thread, else the waits for
  // the background step.
  o.wait_seconds = (background_steps() ? 0.0 : s.io_wait_seconds) + step_wait_seconds();
  std::lock_guard<std::mutex> lock(step_mu_);
  o.final_in_backward = final_in_backward_;
  o.stepped_in_backward = stepped_in_backward_;
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
    // Everything in RAM: one call over the whole range (Lamb's trust ratios need it).
    DS_CHECK(grads.dtype() == DType::f32, "[zero] in-RAM optimizer steps take fp32 gradients");
    opt.step(master_.data<float>(), grads.data<float>(), opt_numel_, grad_scale, params16(),
             train != DType::f32 ? train : DType::bf16);
    return;
  }
  DS_CHECK(!step_pending(), "[zero] {}: the previous optimizer step is still running; call "
           "synchronize() first", ctx);
  if (background_steps()) {
    opt.begin_step();
    const int64_t n = state().chunks();
    auto next = std::make_shared<int64_t>(0);
    start_worker(opt, grads, grad_scale, ctx,
                 [next, n]() -> int64_t { return *next < n ? (*next)++ : -1; });
    return;
  }
  // Synchronous: a failed read or write on one rank must not leave the others waiting in the
  // parameter gather that follows: every rank learns of it.
  std::string error;
  try {
    opt.begin_step();
    step_chunks(opt, grads, grad_scale, /*background=*/false, ChunkOrder());
  } catch (const Error& e) {
    error = fmt::format("[zero] rank {}, {}, optimizer step on NVMe-offloaded state: {}",
                        group_->rank(), ctx, e.what());
  }
  comm::raise_if_any_failed(*group_, error, ctx + ": optimizer step on NVMe-offloaded state");
}

void Strategy::start_worker(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                            const std::string& ctx, ChunkOrder order) {
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    step_running_ = true;
    chunk_ = state().chunk_numel();
    readable_.assign(static_cast<size_t>(state().chunks()), 0);
  }
  step_thread_ = std::thread([this, &opt, grads, grad_scale, ctx, order = std::move(order)] {
    limit_this_thread(1);  // the cores belong to the forward's kernels; this thread mostly waits
    std::string error;
    try {
      step_chunks(opt, grads, grad_scale, /*background=*/true, order);
    } catch (const std::exception& e) {
      error = fmt::format("[zero] rank {}, {}, optimizer step on NVMe-offloaded state: {}",
                          group_->rank(), ctx, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(step_mu_);
      if (!error.empty() && failure_.empty()) failure_ = error;
      step_running_ = false;
    }
    step_cv_.notify_all();
  });
}

void Strategy::step_chunks(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                           bool background, const ChunkOrder& order) {
  // One sub-group at a time, as the state streams in. 16-bit gradients are widened per sub-group
  // (no full fp32 copy); new parameters go to params16() or, on NVMe, to the swap file as soon as
  // their sub-group is stepped.
  const DType train = options_.train_dtype;
  const DType out16_dtype = train != DType::f32 ? train : DType::bf16;
  const int64_t esize = static_cast<int64_t>(dtype_size(train));
  char* out16 = static_cast<char*>(params16());
  const bool in_backward = background && in_backward_.active;
  chunks_starting();
  auto visit = [&](const StateChunk& c) {
    if (in_backward) {
      // Stepped during backward: only once its gradients are final.
      const auto k = static_cast<size_t>(c.begin / state().chunk_numel());
      std::unique_lock<std::mutex> lock(step_mu_);
      step_cv_.wait(lock, [&] { return in_backward_.ready[k] != 0 || in_backward_.abandoned; });
      DS_CHECK(!in_backward_.abandoned,
               "the backward that started this step ended without finishing (an earlier error)");
      if (!in_backward_.backward_done) ++stepped_in_backward_;
    }
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
        opt.step_slice(c.master + t, widen_gradients(grads, c.begin + t, len), states.data(), len,
                       grad_scale, step_out ? static_cast<char*>(step_out) + t * esize : nullptr,
                       out16_dtype);
      }
    };
    // In the background the training thread steps the sub-group between two of its kernels
    // (step_posted_chunk(), with all the cores) and this thread only moves the data: computing
    // here would take a core from the training thread's parallel kernels, which then wait for it.
    if (!background || !hand_to_training_thread(compute)) compute();
    if (params_on_nvme()) {
      if (train == DType::f32)
        std::memcpy(out, c.master, static_cast<size_t>(c.numel) * sizeof(float));
      params_written(c);
    }
    const auto ready = chunk_stepped(c);
    if (background) {
      {
        std::lock_guard<std::mutex> lock(step_mu_);
        for (auto [b, e] : ready) mark_readable_locked(b, e);
      }
      step_cv_.notify_all();
    }
  };
  if (order)
    state().for_each(Access::Update, order, visit);
  else
    state().for_each(Access::Update, visit);
  if (params_on_nvme()) params_flushed();
}

bool Strategy::hand_to_training_thread(const std::function<void()>& job) {
  std::unique_lock<std::mutex> lock(step_mu_);
  InBackward& b = in_backward_;
  if (b.abandoned) return false;
  b.posted = &job;
  b.post = PostState::Posted;
  step_cv_.notify_all();  // a training thread waiting in wait_stepped() or join_step() takes it
  step_cv_.wait(lock, [&] {
    return b.post == PostState::Done || b.post == PostState::Failed ||
           (b.post == PostState::Posted && b.abandoned);
  });
  const PostState was = std::exchange(b.post, PostState::None);
  b.posted = nullptr;
  if (was == PostState::Failed)
    throw Error(std::exchange(b.post_error, {}));  // the training thread's error, on this thread
  return was == PostState::Done;
}

void Strategy::step_posted_chunk() {
  const std::function<void()>* job = nullptr;
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    if (in_backward_.post != PostState::Posted) return;
    in_backward_.post = PostState::Taken;
    job = in_backward_.posted;
  }
  PostState result = PostState::Done;
  std::string error;
  try {
    (*job)();
  } catch (const std::exception& e) {
    result = PostState::Failed;  // raised by the worker, then on every rank at synchronize()
    error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    in_backward_.post = result;
    in_backward_.post_error = std::move(error);
  }
  step_cv_.notify_all();
}

double Strategy::wait_helping(std::unique_lock<std::mutex>& lock,
                              const std::function<bool()>& done) {
  double worked = 0;
  while (!done()) {
    if (in_backward_.post == PostState::Posted) {
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      step_posted_chunk();
      worked += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      continue;
    }
    step_cv_.wait(lock);
  }
  return worked;
}

void Strategy::mark_readable_locked(int64_t begin, int64_t end) {
  // A sub-group is readable once the whole of it is (the RAM part of the parameters may end
  // inside one: its two writes are reported apart).
  const auto n = static_cast<int64_t>(readable_.size());
  for (int64_t k = begin / chunk_; k < n && k * chunk_ < end; ++k)
    if (begin <= k * chunk_ && end >= std::min((k + 1) * chunk_, opt_numel_))
      readable_[static_cast<size_t>(k)] = 1;
}

bool Strategy::readable_locked(int64_t begin, int64_t end) const {
  if (!step_running_ || (in_backward_.active && !in_backward_.backward_done)) return true;
  for (int64_t k = begin / chunk_; k * chunk_ < end; ++k)
    if (!readable_[static_cast<size_t>(k)]) return false;
  return true;
}

bool Strategy::stepped(int64_t begin, int64_t end) {
  std::lock_guard<std::mutex> lock(step_mu_);
  return readable_locked(begin, end);
}

void Strategy::wait_stepped(int64_t begin, int64_t end) {
  step_posted_chunk();
  std::unique_lock<std::mutex> lock(step_mu_);
  if (readable_locked(begin, end)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double worked = wait_helping(lock, [&] { return readable_locked(begin, end); });
  step_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - worked;
}

void Strategy::plan_step_in_backward(optim::Optimizer& opt, float grad_scale) {
  DS_CHECK(can_step_in_backward(), "[zero] internal: this strategy cannot step during backward");
  in_backward_.planned = &opt;
  in_backward_.grad_scale = grad_scale;
}

bool Strategy::start_planned_step(const std::string& ctx) {
  optim::Optimizer* opt = std::exchange(in_backward_.planned, nullptr);
  if (!opt) return false;
  DS_CHECK(!step_pending(), "[zero] {}: the previous optimizer step is still running", ctx);
  const int64_t n = state().chunks(), chunk = state().chunk_numel();
  Tensor grads = reduced_gradients(ctx);
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    InBackward& b = in_backward_;
    b.active = true;
    b.backward_done = false;
    b.abandoned = false;
    b.grads = grads;
    b.pending.assign(static_cast<size_t>(n), 0);
    for (int64_t k = 0; k < n; ++k)
      b.pending[static_cast<size_t>(k)] = std::min(chunk, opt_numel_ - k * chunk);
    b.ready.assign(static_cast<size_t>(n), 0);
    b.squares.assign(static_cast<size_t>(n), 0.0);
    b.low = 0;
    b.high = n;
  }
  opt->begin_step();
  // Top down while the backward runs, then bottom up: decided as the worker reads ahead.
  start_worker(*opt, grads, in_backward_.grad_scale, ctx, [this]() -> int64_t {
    std::lock_guard<std::mutex> lock(step_mu_);
    InBackward& b = in_backward_;
    if (b.low >= b.high) return -1;
    return b.backward_done ? b.low++ : --b.high;
  });
  return true;
}

void Strategy::grads_final(int64_t begin, int64_t end) {
  if (!in_backward_.active || in_backward_.backward_done) return;
  const int64_t chunk = chunk_;
  for (int64_t k = begin / chunk; k * chunk < end; ++k) {
    const int64_t overlap = std::min(end, (k + 1) * chunk) - std::max(begin, k * chunk);
    int64_t& left = in_backward_.pending[static_cast<size_t>(k)];  // training thread only
    DS_CHECK(left >= overlap, "[zero] internal: gradients of [{}, {}) final twice", begin, end);
    left -= overlap;
    if (left == 0) chunk_final(k, /*early=*/true);
  }
  step_posted_chunk();
}

void Strategy::chunk_final(int64_t k, bool early) {
  const int64_t b = k * chunk_, e = std::min(opt_numel_, b + chunk_);
  // The worker does not touch a sub-group before it is ready: its gradients are the training
  // thread's until then.
  const double sq = local_sum_of_squares(in_backward_.grads.flat_range(b, e - b));
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    in_backward_.squares[static_cast<size_t>(k)] = sq;
    in_backward_.ready[static_cast<size_t>(k)] = 1;
    if (early) ++final_in_backward_;
  }
  step_cv_.notify_all();
}

void Strategy::backward_finished() {
  if (!in_backward_.active || in_backward_.backward_done) return;
  // Sub-groups holding a parameter that got no gradient (unused in this forward) or padding.
  for (size_t k = 0; k < in_backward_.pending.size(); ++k)
    if (in_backward_.pending[k] > 0) {
      in_backward_.pending[k] = 0;
      chunk_final(static_cast<int64_t>(k), /*early=*/false);
    }
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    in_backward_.backward_done = true;
  }
  step_cv_.notify_all();
}

double Strategy::step_in_backward_sum_of_squares(const std::string& ctx) {
  DS_CHECK(in_backward_.active && in_backward_.backward_done,
           "[zero] internal: no optimizer step ran in a finished backward");
  double sq = 0.0;
  for (double s : in_backward_.squares) sq += s;  // in sub-group order: deterministic
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    in_backward_.active = false;  // the worker read it when it started
  }
  in_backward_.grads = Tensor();
  return reduce_sum_of_squares(sq, ctx);
}

void Strategy::record_failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(step_mu_);
  if (failure_.empty()) failure_ = what;
}

void Strategy::join_step() noexcept {
  if (!step_thread_.joinable()) return;
  {
    // A backward that started a step and never finished (an error left it): the worker would wait
    // for its gradients forever. It stops instead.
    std::lock_guard<std::mutex> lock(step_mu_);
    if (in_backward_.active && !in_backward_.backward_done) in_backward_.abandoned = true;
  }
  step_cv_.notify_all();
  const auto t0 = std::chrono::steady_clock::now();
  double worked = 0;
  {
    std::unique_lock<std::mutex> lock(step_mu_);
    worked = wait_helping(lock, [&] { return !step_running_; });
  }
  step_thread_.join();
  std::lock_guard<std::mutex> lock(step_mu_);
  step_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - worked;
}

double Strategy::step_wait_seconds() const {
  std::lock_guard<std::mutex> lock(step_mu_);
  return step_wait_seconds_;
}

void Strategy::synchronize(const std::string& ctx) {
  if (!offloaded()) return;
  join_step();
  std::string error;
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    error.swap(failure_);
  }
  comm::raise_if_any_failed(*group_, error, ctx + ": NVMe-offloaded optimizer step or parameters");
}

void Strategy::prefetch_optimizer_state(bool boundary) {
  if (!boundary || !store_ || step_pending()) return;
  const char* env = std::getenv("DS_OFFLOAD_PREFETCH");
  if (env && std::string(env) == "0") return;
  store_->prefetch();
}

const float* Strategy::widen_gradients(const Tensor& grads, int64_t begin, int64_t numel) {
  if (!grad_chunk_.defined() || grad_chunk_.numel() < numel) grad_chunk_ = Tensor::empty({numel});
  grad_chunk_.flat_range(0, numel).copy_from(grads.flat_range(begin, numel));
  return grad_chunk_.data<float>();
}

int64_t Strategy::master_bytes() const {
  return options_.train_dtype != DType::f32 && master_.defined()
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
  if (options.stage == 3) return detail::make_stage3_strategy(model, std::move(group), options);
  return detail::make_flat_strategy(model, std::move(group), options);
}

}  // namespace ds::zero
