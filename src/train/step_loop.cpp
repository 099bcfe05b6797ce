#include "ds/train/step_loop.h"

#include "ds/core/error.h"

namespace ds::train {

StepReport engine_step_report(const runtime::Engine& engine, double loss, double lr, double seconds,
                              int64_t total_steps) {
  StepReport r;
  r.loss = loss;
  r.seconds = seconds;
  r.step = engine.global_steps();
  r.total_steps = total_steps;
  r.samples = engine.global_samples();
  r.lr = lr;
  r.grad_norm = engine.last_grad_norm();
  r.loss_scale = engine.loss_scale();
  r.skipped_steps = engine.skipped_steps();
  return r;
}

int64_t run_fit(runtime::Engine& engine, TrainerObserver& observer, int64_t total_steps,
                int64_t eval_every, int64_t save_steps, const FitCalls& calls) {
  const int64_t first_step = engine.global_steps();
  const int64_t skipped_before = engine.skipped_steps();
  while (engine.global_steps() < total_steps) {
    const int64_t s = calls.step();
    if (eval_every > 0 && s % eval_every == 0 && s != total_steps) calls.evaluate_now();
    if (save_steps > 0 && s % save_steps == 0 && s != total_steps) calls.save();
  }
  observer.on_steps_done();
  engine.synchronize();  // the last optimizer step may still run in the background (offload)

  // A run that never applied a step trained nothing: its checkpoint and export would be the
  // starting weights. Fail instead of reporting success.
  const int64_t steps_run = engine.global_steps() - first_step;
  if (steps_run > 0 && engine.skipped_steps() - skipped_before >= steps_run)
    DS_THROW(
        "[ds_train] every one of the {} steps of this run was skipped for non-finite gradients: "
        "the model did not train and nothing was saved. Lower --learning_rate, set "
        "gradient_clipping, use bf16 instead of fp16, or check the data",
        steps_run);
  // The final checkpoint first: an evaluation that fails (a bad eval set, a generation error)
  // must never cost the training.
  if (!calls.saved_now()) calls.save();
  try {
    calls.evaluate_now();
  } catch (const std::exception& e) {
    DS_THROW(
        "{}\n[ds_train] the final evaluation failed, but the training is kept: the checkpoint of "
        "step {} is saved (ds_to_fp32 exports it; --resume_from_checkpoint latest --eval_only "
        "evaluates it again once the cause is fixed)",
        e.what(), engine.global_steps());
  }
  return steps_run;
}

}  // namespace ds::train
