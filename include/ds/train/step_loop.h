#pragma once
// The step loop every trainer runs (train::Trainer, the LM trainer, and train::TaskTrainer, the
// task trainers' base): fit()'s schedule of steps, evaluations and checkpoints, the step report
// read off the engine, and the check that a run applied a step. The trainers supply their own
// step (batches, pipelines), evaluation and save.
//
// Collectives and threading: as the trainer calling them (every rank, in the same order).
#include <cstdint>
#include <functional>

#include "ds/runtime/engine.h"
#include "ds/train/trainer.h"

namespace ds::train {

// The numbers of the step the engine just ran (global step and samples after it, the grad norm,
// loss scale and skips); the caller sets tokens_per_second.
StepReport engine_step_report(const runtime::Engine& engine, double loss, double lr, double seconds,
                              int64_t total_steps);

// What fit() does around the steps, supplied by the trainer.
struct FitCalls {
  std::function<int64_t()> step;  // one optimizer step; returns the global step after it
  std::function<void()> evaluate_now;
  std::function<void()> save;
  std::function<bool()> saved_now;  // whether the current step has a checkpoint already
};

// Steps up to total_steps, evaluating every `eval_every` steps and saving every `save_steps` (0:
// never; neither at the last step, which the end does), then on_steps_done, waits for the engine,
// and evaluates and saves at the end (unless that step was saved). Throws "[ds_train] every one of
// the N steps of this run was skipped ..." when no step of this call applied: its checkpoint and
// export would be the starting weights. Returns the steps run.
int64_t run_fit(runtime::Engine& engine, TrainerObserver& observer, int64_t total_steps,
                int64_t eval_every, int64_t save_steps, const FitCalls& calls);

}  // namespace ds::train
