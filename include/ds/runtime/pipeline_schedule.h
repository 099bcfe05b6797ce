#pragma once
// DeepSpeed's pipeline schedules (deepspeed/runtime/pipe/schedule.py; docs/parallelism.md)
// as instruction lists: a schedule is a sequence of steps, each a list of instructions one stage
// runs in order. Pure functions of (micro_batches, stages, stage): the pipeline engine executes
// them, tests compare them with DeepSpeed's own (tests/fixtures/generators/gen_pipeline_schedule_fixture.py).
//
// train_schedule: synchronous 1F1B (PipeDream-Flush). Every stage runs 2 (m + p - 1) steps; stage s
// runs the forward of micro-batch i at step 2i + s and its backward at step 2i + 2p - 1 - s.
// Sends are deferred to the next step, so adjacent stages (opposite parity) pair every send with
// a receive in order, and a stage holds at most min(p - s, m) micro-batches' activations. The last
// step ends with ReduceTiedGrads, ReduceGrads, OptimizerStep.
//
// inference_schedule: m + p - 1 steps; stage s forwards micro-batch k - s at step k; even stages
// send before they receive, odd stages the reverse.
#include <string>
#include <vector>

namespace ds::runtime {

enum class PipeOp {
  load_micro_batch,
  forward,
  backward,
  send_activation,
  recv_activation,
  send_grad,
  recv_grad,
  reduce_tied_grads,
  reduce_grads,
  optimizer_step,
};

struct PipeInstr {
  PipeOp op;
  int micro_batch = -1;  // the micro-batch an instruction works on; -1 for the three step ones
  bool operator==(const PipeInstr&) const = default;
};

using PipeStep = std::vector<PipeInstr>;

std::vector<PipeStep> train_schedule(int micro_batches, int stages, int stage);
std::vector<PipeStep> inference_schedule(int micro_batches, int stages, int stage);

// DeepSpeed's class name of the instruction ("SendActivation", "OptimizerStep", ...).
const char* pipe_op_name(PipeOp op);
// DeepSpeed's buffer ids: TrainSchedule uses micro_batch mod max(2, min(p - s, m)).
int train_buffer_count(int micro_batches, int stages, int stage);

}  // namespace ds::runtime
