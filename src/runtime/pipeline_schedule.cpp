#include "ds/runtime/pipeline_schedule.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::runtime {
namespace {

void check(int micro_batches, int stages, int stage) {
  DS_CHECK(micro_batches >= 1 && stages >= 1 && stage >= 0 && stage < stages,
           "[pipeline] a schedule needs micro_batches >= 1 and 0 <= stage < stages, got m={} "
           "p={} stage={}",
           micro_batches, stages, stage);
}

}  // namespace

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::load_micro_batch: return "LoadMicroBatch";
    case PipeOp::forward: return "ForwardPass";
    case PipeOp::backward: return "BackwardPass";
    case PipeOp::send_activation: return "SendActivation";
    case PipeOp::recv_activation: return "RecvActivation";
    case PipeOp::send_grad: return "SendGrad";
    case PipeOp::recv_grad: return "RecvGrad";
    case PipeOp::reduce_tied_grads: return "ReduceTiedGrads";
    case PipeOp::reduce_grads: return "ReduceGrads";
    case PipeOp::optimizer_step: return "OptimizerStep";
  }
  return "?";
}

int train_buffer_count(int micro_batches, int stages, int stage) {
  return std::max(2, std::min(stages - stage, micro_batches));
}

std::vector<PipeStep> train_schedule(int m, int p, int s) {
  check(m, p, s);
  auto valid = [&](int mb) { return mb >= 0 && mb < m; };
  const bool has_prev = s > 0, has_next = s < p - 1;
  // Step -> (micro-batch, forward?): forwards on steps of the stage's parity.
  auto micro_batch_of = [&](int step, bool& forward) {
    const bool even_step = step % 2 == 0, even_stage = s % 2 == 0;
    forward = even_step == even_stage;
    if (forward) return (even_step ? step / 2 : (step - 1) / 2) - s / 2;
    return even_step ? step / 2 - p + (s + 1) / 2 : (step - 1) / 2 - p + 1 + s / 2;
  };
  const int total = 2 * (m + p - 1);
  std::vector<PipeStep> steps;
  int prev = -1;
  for (int step = 0; step < total; ++step) {
    bool forward = false;
    const int mb = micro_batch_of(step, forward);
    PipeStep cmds;
    if (forward) {
      if (valid(prev) && has_prev) cmds.push_back({PipeOp::send_grad, prev});
      if (valid(mb) && has_prev) cmds.push_back({PipeOp::recv_activation, mb});
    } else {
      if (valid(mb) && has_next) cmds.push_back({PipeOp::recv_grad, mb});
      if (valid(prev) && has_next) cmds.push_back({PipeOp::send_activation, prev});
    }
    if ((s == 0 || s == p - 1) && forward && valid(mb))
      cmds.push_back({PipeOp::load_micro_batch, mb});
    if (valid(mb)) cmds.push_back({forward ? PipeOp::forward : PipeOp::backward, mb});
    if (step == total - 1) {
      cmds.push_back({PipeOp::reduce_tied_grads, -1});
      cmds.push_back({PipeOp::reduce_grads, -1});
      cmds.push_back({PipeOp::optimizer_step, -1});
    }
    prev = mb;
    steps.push_back(std::move(cmds));
  }
  return steps;
}

std::vector<PipeStep> inference_schedule(int m, int p, int s) {
  check(m, p, s);
  auto valid = [&](int mb) { return mb >= 0 && mb < m; };
  const bool has_prev = s > 0, has_next = s < p - 1;
  std::vector<PipeStep> steps;
  for (int step = 0; step < m + p - 1; ++step) {
    const int mb = step - s;
    PipeStep cmds;
    if ((s == 0 || s == p - 1) && valid(mb)) cmds.push_back({PipeOp::load_micro_batch, mb});
    const PipeInstr send{PipeOp::send_activation, mb - 1}, recv{PipeOp::recv_activation, mb};
    const bool do_send = has_next && valid(mb - 1), do_recv = has_prev && valid(mb);
    if (s % 2 == 0) {
      if (do_send) cmds.push_back(send);
      if (do_recv) cmds.push_back(recv);
    } else {
      if (do_recv) cmds.push_back(recv);
      if (do_send) cmds.push_back(send);
    }
    if (valid(mb)) cmds.push_back({PipeOp::forward, mb});
    steps.push_back(std::move(cmds));
  }
  return steps;
}

}  // namespace ds::runtime
