#pragma once
// What the pipeline engine (runtime/pipeline_engine.h) needs from the module one rank runs as its
// stage of a pipeline. A model that can be cut into stages (models::GPT with a PipeRange)
// implements it beside nn::Module:
//
//   first stage   forward(ids (B, T) int)          -> hidden states (B, T, C)
//   middle        forward(hidden (B, T, C))         -> hidden states (B, T, C)
//   last stage    loss(input, targets (B, T) int)   -> the scalar loss (its forward gives logits)
//
// One stage may be first and last (a pipeline of one). Hidden states travel between stages in
// the dtype forward() returns.
//
// Tied weights (GPT-2's wte, used by the embedding on the first stage and the LM head on the
// last): the first stage owns the parameter (tied_embedding_weight()); the last stage multiplies
// by a copy that is not a parameter (tied_head_weight(), with requires_grad so that backward
// fills its .grad). The engine sends the copy's gradient to the owner before the owner's last
// backward of a batch, and the owner's updated values back after each step: the weight exists
// once in the optimizer and the gradient norm, as in the one-process model.
#include <cstdint>

#include "ds/core/tensor.h"

namespace ds::nn {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual bool is_first_stage() const = 0;  // takes token ids
  virtual bool is_last_stage() const = 0;   // computes the loss
  // C of the hidden states (B, T, C) this stage receives and sends.
  virtual int64_t hidden_size() const = 0;
  // pipeline.activation_checkpoint_interval: recompute runs of k layers in backward (0 = off).
  virtual void set_activation_checkpoint_interval(int k) = 0;
  // The last stage's copy of a tied weight (undefined when there is none on this stage).
  virtual Tensor tied_head_weight() const { return {}; }
  // The first stage's tied parameter whose copy lives on the last stage (undefined otherwise).
  virtual Tensor tied_embedding_weight() const { return {}; }
};

}  // namespace ds::nn
