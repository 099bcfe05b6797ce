// The background optimizer step of stage 3 with offload: the worker thread, the order it takes
// the sub-groups in, and the hand-offs between it and the training thread (step_scheduler.h).
#include "step_scheduler.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::zero::detail {

StepScheduler::StepScheduler(int64_t numel, bool background, int rank)
    : numel_(numel), background_(background), rank_(rank) {}

StepScheduler::~StepScheduler() {
  join();
}

void StepScheduler::start(int64_t chunk_numel, int64_t chunks, const std::string& ctx, Pass pass) {
  auto next = std::make_shared<int64_t>(0);
  start_worker(chunk_numel, chunks, ctx, std::move(pass),
               [next, chunks]() -> int64_t { return *next < chunks ? (*next)++ : -1; });
}

void StepScheduler::plan(optim::Optimizer& opt, float grad_scale) {
  in_backward_.planned = &opt;
  in_backward_.grad_scale = grad_scale;
}

optim::Optimizer* StepScheduler::take_plan(float* grad_scale) {
  *grad_scale = in_backward_.grad_scale;
  return std::exchange(in_backward_.planned, nullptr);
}

void StepScheduler::start_in_backward(int64_t chunk_numel, int64_t chunks, const Tensor& grads,
                                      const std::string& ctx, Pass pass) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    InBackward& b = in_backward_;
    b.active = true;
    b.backward_done = false;
    b.abandoned = false;
    b.grads = grads;
    b.pending.assign(static_cast<size_t>(chunks), 0);
    for (int64_t k = 0; k < chunks; ++k)
      b.pending[static_cast<size_t>(k)] = std::min(chunk_numel, numel_ - k * chunk_numel);
    b.ready.assign(static_cast<size_t>(chunks), 0);
    b.squares.assign(static_cast<size_t>(chunks), 0.0);
    b.low = 0;
    b.high = chunks;
  }
  // Top down while the backward runs, then bottom up: decided as the worker reads ahead.
  start_worker(chunk_numel, chunks, ctx, std::move(pass), [this]() -> int64_t {
    std::lock_guard<std::mutex> lock(mu_);
    InBackward& b = in_backward_;
    if (b.low >= b.high) return -1;
    return b.backward_done ? b.low++ : --b.high;
  });
}

void StepScheduler::start_worker(int64_t chunk_numel, int64_t chunks, const std::string& ctx,
                                 Pass pass, ChunkOrder order) {
  DS_CHECK(background_, "[zero] internal: a background step without a background scheduler");
  DS_CHECK(!pending(), "[zero] {}: the previous optimizer step is still running", ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
    chunk_ = chunk_numel;
    readable_.assign(static_cast<size_t>(chunks), 0);
  }
  pass_in_backward_ = in_backward_.active;  // read by the worker only, from now on
  thread_ = std::thread([this, ctx, pass = std::move(pass), order = std::move(order)] {
    limit_this_thread(1);  // the cores belong to the forward's kernels; this thread mostly waits
    std::string error;
    try {
      pass(order);
    } catch (const std::exception& e) {
      error = fmt::format("[zero] rank {}, {}, optimizer step on NVMe-offloaded state: {}", rank_,
                          ctx, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error.empty() && failure_.empty()) failure_ = error;
      running_ = false;
    }
    cv_.notify_all();
  });
}

void StepScheduler::before_chunk(const StateChunk& c) {
  if (!pass_in_backward_) return;
  // Stepped during backward: only once its gradients are final.
  const auto k = static_cast<size_t>(c.begin / chunk_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_backward_.ready[k] != 0 || in_backward_.abandoned; });
  DS_CHECK(!in_backward_.abandoned,
           "the backward that started this step ended without finishing (an earlier error)");
  if (!in_backward_.backward_done) ++stepped_in_backward_;
}

bool StepScheduler::hand_to_training_thread(const std::function<void()>& job) {
  std::unique_lock<std::mutex> lock(mu_);
  InBackward& b = in_backward_;
  if (b.abandoned) return false;
  b.posted = &job;
  b.post = PostState::Posted;
  cv_.notify_all();  // a training thread waiting in wait_stepped() or join() takes it
  cv_.wait(lock, [&] {
    return b.post == PostState::Done || b.post == PostState::Failed ||
           (b.post == PostState::Posted && b.abandoned);
  });
  const PostState was = std::exchange(b.post, PostState::None);
  b.posted = nullptr;
  if (was == PostState::Failed)
    throw Error(std::exchange(b.post_error, {}));  // the training thread's error, on this thread
  return was == PostState::Done;
}

void StepScheduler::mark_readable(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto [b, e] : ranges) mark_readable_locked(b, e);
  }
  cv_.notify_all();
}

void StepScheduler::step_posted_chunk() {
  const std::function<void()>* job = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    in_backward_.post = result;
    in_backward_.post_error = std::move(error);
  }
  cv_.notify_all();
}

double StepScheduler::wait_helping(std::unique_lock<std::mutex>& lock,
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
    cv_.wait(lock);
  }
  return worked;
}

void StepScheduler::mark_readable_locked(int64_t begin, int64_t end) {
  // A sub-group is readable once the whole of it is (the RAM part of the parameters may end
  // inside one: its two writes are reported apart).
  const auto n = static_cast<int64_t>(readable_.size());
  for (int64_t k = begin / chunk_; k < n && k * chunk_ < end; ++k)
    if (begin <= k * chunk_ && end >= std::min((k + 1) * chunk_, numel_))
      readable_[static_cast<size_t>(k)] = 1;
}

bool StepScheduler::readable_locked(int64_t begin, int64_t end) const {
  if (!running_ || (in_backward_.active && !in_backward_.backward_done)) return true;
  for (int64_t k = begin / chunk_; k * chunk_ < end; ++k)
    if (!readable_[static_cast<size_t>(k)]) return false;
  return true;
}

bool StepScheduler::stepped(int64_t begin, int64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  return readable_locked(begin, end);
}

void StepScheduler::wait_stepped(int64_t begin, int64_t end) {
  step_posted_chunk();
  std::unique_lock<std::mutex> lock(mu_);
  if (readable_locked(begin, end)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double worked = wait_helping(lock, [&] { return readable_locked(begin, end); });
  wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - worked;
}

void StepScheduler::grads_final(int64_t begin, int64_t end) {
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

void StepScheduler::chunk_final(int64_t k, bool early) {
  const int64_t b = k * chunk_, e = std::min(numel_, b + chunk_);
  // The worker does not touch a sub-group before it is ready: its gradients are the training
  // thread's until then.
  const Tensor g = in_backward_.grads.flat_range(b, e - b);
  const double sq = backend::get(g.device()).sum_of_squares(g);
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_backward_.squares[static_cast<size_t>(k)] = sq;
    in_backward_.ready[static_cast<size_t>(k)] = 1;
    if (early) ++final_in_backward_;
  }
  cv_.notify_all();
}

void StepScheduler::backward_finished() {
  if (!in_backward_.active || in_backward_.backward_done) return;
  // Sub-groups holding a parameter that got no gradient (unused in this forward) or padding.
  for (size_t k = 0; k < in_backward_.pending.size(); ++k)
    if (in_backward_.pending[k] > 0) {
      in_backward_.pending[k] = 0;
      chunk_final(static_cast<int64_t>(k), /*early=*/false);
    }
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_backward_.backward_done = true;
  }
  cv_.notify_all();
}

double StepScheduler::take_in_backward_sum() {
  DS_CHECK(in_backward_.active && in_backward_.backward_done,
           "[zero] internal: no optimizer step ran in a finished backward");
  double sq = 0.0;
  for (double s : in_backward_.squares) sq += s;  // in sub-group order: deterministic
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_backward_.active = false;  // the worker read it when it started
  }
  in_backward_.grads = Tensor();
  return sq;
}

void StepScheduler::record_failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = what;
}

std::string StepScheduler::take_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(failure_, {});
}

void StepScheduler::join() noexcept {
  if (!thread_.joinable()) return;
  {
    // A backward that started a step and never finished (an error left it): the worker would wait
    // for its gradients forever. It stops instead.
    std::lock_guard<std::mutex> lock(mu_);
    if (in_backward_.active && !in_backward_.backward_done) in_backward_.abandoned = true;
  }
  cv_.notify_all();
  const auto t0 = std::chrono::steady_clock::now();
  double worked = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    worked = wait_helping(lock, [&] { return !running_; });
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - worked;
}

StepScheduler::Stats StepScheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {wait_seconds_, final_in_backward_, stepped_in_backward_};
}

}  // namespace ds::zero::detail
