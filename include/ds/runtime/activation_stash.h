#pragma once
// DeepSpeed's activation_checkpointing section, applied to what a checkpointed segment keeps
// (autograd::CheckpointStash, ds/autograd/checkpoint.h): segments are the layers ds_train's
// --gradient_checkpointing (or a model's set_gradient_checkpointing) wraps.
//
//   cpu_checkpointing               each segment's input waits in host memory and comes back to
//                                   the device for the recompute: a GPU run keeps none of the
//                                   L x B x T x C checkpoint values on the device (on a CPU run
//                                   they are in host memory already: nothing changes).
//   synchronize_checkpoint_boundary the device is synchronized after each segment's forward
//                                   (DeepSpeed's torch.cuda.synchronize() there; for timing).
//   partition_activations           with tensor parallelism, each tensor-parallel rank keeps 1/tp
//                                   of a segment's input (which every rank of the group holds
//                                   whole) and the group all-gathers it for the recompute
//                                   (DeepSpeed's partition_activations over Megatron's mp group).
//                                   Without tensor parallelism it changes nothing (and says so).
//   contiguous_memory_optimization  (with partition_activations, as DeepSpeed requires) the kept
//   + number_checkpoints            inputs go into one buffer of number_checkpoints slots,
//                                   allocated at the first checkpoint (on the device, or in host
//                                   memory under cpu_checkpointing) instead of an allocation each;
//                                   a slot is free again once its layer is recomputed. More inputs
//                                   alive at once than slots is an error naming number_checkpoints.
//   profile                         each checkpointed segment's forward and its recompute with its
//                                   backward are timed (the device synchronized first) and logged
//                                   as DeepSpeed's timers print them: "time (ms) | forward: 1.23".
//
//   ActivationStashScope scope(config.activation_checkpointing);   // the engine holds one
//   ... forward / backward ...
//   scope.stash()->stats();   // segments stashed, bytes that went to host memory
//
// Threading: the training thread. Lifetime: the scope installs its stash for its own lifetime and
// puts the previous one back; segments recorded under it keep it until their backward.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ds/autograd/checkpoint.h"
#include "ds/comm/group.h"
#include "ds/config/config.h"

namespace ds::runtime {

class ActivationStash final : public autograd::CheckpointStash {
 public:
  struct Stats {
    int64_t stashed = 0;        // segments stashed
    int64_t kept_bytes = 0;     // bytes kept of their inputs (1/tp of each when partitioned)
    int64_t host_bytes = 0;     // of them, bytes copied to host memory (cpu_checkpointing)
    int64_t synchronized = 0;   // boundaries synchronized
    int64_t most_in_slots = 0;  // contiguous slots in use at once, at most
    int64_t timed = 0;          // forward and backward timings logged (profile)
  };

  // partition: the tensor-parallel group inputs are cut over (null or of size 1: none). Its
  // all-gathers run in backward, a collective over the group. slots > 0: contiguous buffers of
  // that many checkpoints.
  // log: where profile's lines go (profile on when set).
  ActivationStash(bool to_host, bool synchronize, std::shared_ptr<comm::Group> partition = nullptr,
                  int64_t slots = 0, std::function<void(const std::string&)> log = {});
  Tensor stash(const Tensor& x) override;
  Tensor unstash(const Tensor& stored, const Shape& shape, Device device, DType dtype) override;
  void at_boundary(Device device) override;
  void release(const Tensor& stored) override;
  bool timing() const override { return static_cast<bool>(log_); }
  void timed(const char* phase, double seconds) override;
  const Stats& stats() const { return stats_; }

 private:
  bool to_host_, sync_;
  std::shared_ptr<comm::Group> partition_;
  std::function<void(const std::string&)> log_;  // profile
  // contiguous_memory_optimization: slots_ checkpoints of slot_numel_ elements in buffer_, the
  // free ones in free_ (allocated at the first stash).
  Tensor into_slot(const Tensor& keep);
  int64_t slots_ = 0, slot_numel_ = 0;
  Tensor buffer_;
  std::vector<int64_t> free_;
  Stats stats_;
};

class ActivationStashScope {
 public:
  // Installs a stash when the section asks for cpu_checkpointing, synchronize_checkpoint_boundary
  // or partition_activations with a tensor-parallel group of more than one rank; nothing
  // otherwise.
  explicit ActivationStashScope(const config::ActivationCheckpointingConfig& c,
                                std::shared_ptr<comm::Group> tensor_parallel = nullptr,
                                std::function<void(const std::string&)> log = {});
  ~ActivationStashScope();
  ActivationStashScope(const ActivationStashScope&) = delete;
  ActivationStashScope& operator=(const ActivationStashScope&) = delete;

  const ActivationStash* stash() const { return stash_.get(); }  // null when none

 private:
  std::shared_ptr<ActivationStash> stash_;
  std::shared_ptr<autograd::CheckpointStash> previous_;
};

}  // namespace ds::runtime
