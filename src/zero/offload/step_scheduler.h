#pragma once
// The background optimizer step of ZeRO stage 3 with NVMe offload (internal to zero/; the
// behaviour is described at Strategy::optimizer_step and "the optimizer step during backward" in
// include/ds/zero/strategy.h, and in docs/offload.md).
//
// Stage 3 owns one StepScheduler (stage3.cpp) and hands it to Strategy through its scheduler()
// hook; stages 0-2 have none and step synchronously. The scheduler owns the worker thread and
// decides *when* each sub-group is stepped; the strategy's sub-group loop
// (Strategy::step_chunks) decides *how*, and calls back into the scheduler at three points:
//
//   training thread                            worker (runs the pass given to start())
//   ---------------                            ---------------------------------------
//   plan(opt, scale)          engine, before the boundary backward
//   start_in_backward(...)    that backward    for each sub-group k of `order`:
//   grads_final(b, e)         as pieces are      before_chunk(k)    waits until its gradients
//                             reduced                               are final (step in backward)
//   backward_finished()       end of backward    hand_to_training_thread(adam)  the training
//   take_in_backward_sum()    engine's step()                       thread runs it between
//   start(...)                a step after                          its kernels
//                             backward           mark_readable(ranges)  new parameters written
//   wait_stepped(b, e)        before a gather
//   join(), take_failure()    synchronize()
//
// Sub-group k is elements [k * chunk, min((k + 1) * chunk, numel)) of the optimizer range.
//
// Threading: the methods in the left column belong to the training thread, those in the right to
// the worker; stats() and record_failure() may be called from either. One mutex (mu_) guards the
// state both threads touch; the training-thread-only parts are marked below.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/optim/optimizer.h"
#include "ds/zero/state_store.h"

namespace ds::zero::detail {

class StepScheduler {
 public:
  // numel: the optimizer range (elements); background: optimizer steps run on the worker
  // (zero::Options::overlap_step with anything offloaded). Without it the scheduler only carries
  // failures to synchronize(). rank: for messages.
  StepScheduler(int64_t numel, bool background, int rank);
  ~StepScheduler();  // join()
  StepScheduler(const StepScheduler&) = delete;
  StepScheduler& operator=(const StepScheduler&) = delete;

  bool background() const { return background_; }

  // ---- starting a step (training thread) ----
  // A pass of the strategy's sub-group loop over the sub-groups `order` returns, on the worker.
  using Pass = std::function<void(const ChunkOrder& order)>;
  // Starts the worker over every sub-group in ascending order (a step after backward). The
  // optimizer's begin_step() was called.
  void start(int64_t chunk_numel, int64_t chunks, const std::string& ctx, Pass pass);
  // The step during backward: remembers `opt` and the gradient scale until the boundary
  // backward starts it (planned()).
  void plan(optim::Optimizer& opt, float grad_scale);
  // The plan, once (nullptr when none); its gradient scale in `grad_scale`.
  optim::Optimizer* take_plan(float* grad_scale);
  // Starts the planned step over `grads` (optimizer_numel,): sub-groups from the top down while
  // the backward runs, then the rest bottom up. The optimizer's begin_step() was called.
  void start_in_backward(int64_t chunk_numel, int64_t chunks, const Tensor& grads,
                         const std::string& ctx, Pass pass);
  // A worker was started and join() has not been called since.
  bool pending() const { return thread_.joinable(); }

  // ---- the step during backward (training thread) ----
  // A step was started in a backward and take_in_backward_sum() was not called since.
  bool in_backward() const { return in_backward_.active; }
  // The gradients of elements [begin, end) of the optimizer range are final (stage 3: as each
  // parameter's reduced piece is complete); no-op unless a step runs in this backward.
  void grads_final(int64_t begin, int64_t end);
  // The backward ended: every gradient is final.
  void backward_finished();
  // After that backward: this rank's sum of squares of the gradients, from the sub-groups'
  // partial sums in sub-group order (deterministic). Ends the in-backward state.
  double take_in_backward_sum();

  // ---- waiting (training thread) ----
  // Blocks until the running step has made parameters [begin, end) readable, running posted
  // Adam jobs meanwhile. At once when none runs, or when it failed (the failure is raised at the
  // next synchronize()). While the backward that started a step runs, the parameters it still
  // needs are not stepped yet: no wait.
  void wait_stepped(int64_t begin, int64_t end);
  bool stepped(int64_t begin, int64_t end);
  // Waits for the worker to end without raising its failure (also destructors).
  void join() noexcept;

  // ---- failures (either thread) ----
  // Remembers the first failure, to be raised on every rank at the next synchronize(): a rank
  // must keep issuing its collectives until then, or the others would wait for it (the worker's
  // own failures, and stage 3's parameter reads).
  void record_failure(const std::string& what);
  // The failure recorded since the last call ("" when none); call after join().
  std::string take_failure();

  // ---- statistics (either thread) ----
  struct Stats {
    double wait_seconds = 0;  // the training thread waited for the worker (helping excluded)
    int64_t final_in_backward = 0, stepped_in_backward = 0;  // Strategy::OffloadStats
  };
  Stats stats() const;

  // ---- the worker's side (called by Strategy::step_chunks on the worker) ----
  // Before stepping sub-group c: in a step started during backward, waits until its gradients
  // are final. Throws when that backward was abandoned.
  void before_chunk(const StateChunk& c);
  // Asks the training thread to run `job` (a sub-group's Adam) and waits for it; false when the
  // step was abandoned (the worker then runs it). The training thread runs posted jobs between
  // its kernels (grads_final) and whenever it would wait for the worker (wait_stepped, join), so
  // the Adam work gets all the cores and never competes with the training thread's parallel
  // kernels; the worker only moves data.
  bool hand_to_training_thread(const std::function<void()>& job);
  // The new parameters of `ranges` are readable now.
  void mark_readable(const std::vector<std::pair<int64_t, int64_t>>& ranges);

 private:
  void start_worker(int64_t chunk_numel, int64_t chunks, const std::string& ctx, Pass pass,
                    ChunkOrder order);
  void step_posted_chunk();
  // Training thread: waits on cv_ (lock held) until done(), running posted jobs meanwhile;
  // returns the seconds spent running them.
  double wait_helping(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done);
  // Training thread: the partial sum of sub-group k, then k is ready; `early`: before the end of
  // the backward.
  void chunk_final(int64_t k, bool early);
  // Both with mu_ held.
  void mark_readable_locked(int64_t begin, int64_t end);
  bool readable_locked(int64_t begin, int64_t end) const;

  const int64_t numel_;
  const bool background_;
  const int rank_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;        // guarded by mu_, as the members below
  int64_t chunk_ = 1;           // the store's sub-group size, while a step runs
  std::vector<char> readable_;  // per sub-group: its new parameters are readable
  std::string failure_;
  double wait_seconds_ = 0;
  int64_t final_in_backward_ = 0, stepped_in_backward_ = 0;
  bool pass_in_backward_ = false;  // the running pass was started in a backward (worker's copy)
  // The step during backward. `active`, `pending` and the plan belong to the training thread; the
  // rest is guarded by mu_.
  enum class PostState { None, Posted, Taken, Done, Failed };
  struct InBackward {
    optim::Optimizer* planned = nullptr;  // plan()
    float grad_scale = 1.0f;
    bool active = false;           // started, until take_in_backward_sum()
    bool backward_done = false;    // end of the backward: the order turns ascending
    bool abandoned = false;        // join() before the backward ended: the worker stops
    Tensor grads;                  // the gradients being stepped
    std::vector<int64_t> pending;  // per sub-group: elements whose gradient is not final yet
    std::vector<char> ready;       // per sub-group: gradients final, partial sum taken
    std::vector<double> squares;   // per sub-group: sum of squares of its gradients
    int64_t low = 0, high = 0;     // sub-groups [low, high) not yet handed to the worker
    // A sub-group's Adam handed by the worker to the training thread (any background step, not
    // only one started in backward).
    PostState post = PostState::None;
    const std::function<void()>* posted = nullptr;
    std::string post_error;
  } in_backward_;
};

}  // namespace ds::zero::detail
