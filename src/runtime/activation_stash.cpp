// The activation_checkpointing section over autograd's checkpoint stash (activation_stash.h).
#include "ds/runtime/activation_stash.h"

#include <algorithm>

#include <fmt/format.h>

#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/ops/ops.h"

namespace ds::runtime {

ActivationStash::ActivationStash(bool to_host, bool synchronize,
                                 std::shared_ptr<comm::Group> partition, int64_t slots,
                                 std::function<void(const std::string&)> log)
    : to_host_(to_host), sync_(synchronize), log_(std::move(log)), slots_(slots) {
  if (partition && partition->size() > 1) partition_ = std::move(partition);
}

Tensor ActivationStash::into_slot(const Tensor& keep) {
  const int64_t n = keep.numel();
  if (!buffer_.defined()) {
    slot_numel_ = n;
    buffer_ = Tensor::empty({slots_ * n}, keep.dtype(), keep.device());
    for (int64_t s = slots_ - 1; s >= 0; --s) free_.push_back(s);
  }
  DS_CHECK(n == slot_numel_ && keep.dtype() == buffer_.dtype(),
           "[activation checkpointing] contiguous_memory_optimization keeps every checkpointed "
           "input in slots of one size ({} elements, from the first), but one has {}: turn "
           "contiguous_memory_optimization off for this model",
           slot_numel_, n);
  DS_CHECK(!free_.empty(),
           "[activation checkpointing] more checkpointed inputs are alive at once than "
           "activation_checkpointing.number_checkpoints = {} slots: set it to the number of "
           "checkpointed layers (times the micro-batches a pipeline keeps in flight)",
           slots_);
  const int64_t s = free_.back();
  free_.pop_back();
  stats_.most_in_slots = std::max(stats_.most_in_slots, slots_ - static_cast<int64_t>(free_.size()));
  Tensor slot = buffer_.flat_range(s * n, n);
  slot.copy_from(keep.flat_range(0, n));
  return slot;
}

void ActivationStash::release(const Tensor& stored) {
  if (!buffer_.defined() || stored.numel() != slot_numel_) return;
  const auto* base = static_cast<const char*>(buffer_.raw_data());
  const auto* at = static_cast<const char*>(stored.raw_data());
  const int64_t bytes = static_cast<int64_t>(stored.nbytes());
  const int64_t off = at - base;
  if (off < 0 || off % bytes != 0 || off / bytes >= slots_) return;  // not one of the slots
  free_.push_back(off / bytes);
}

Tensor ActivationStash::stash(const Tensor& x) {
  ++stats_.stashed;
  Tensor keep = x;
  if (partition_) {
    // The input is the same on every rank of the group (a tensor-parallel block's input is
    // replicated): each keeps 1/P of it, padded to equal parts for the all-gather.
    const int64_t n = x.numel(), P = partition_->size(), r = partition_->rank();
    const int64_t per = (n + P - 1) / P;
    const int64_t b = std::min(n, r * per), e = std::min(n, b + per);
    keep = Tensor::zeros({per}, x.dtype(), x.device());
    if (e > b) keep.flat_range(0, e - b).copy_from(x.contiguous().flat_range(b, e - b));
  }
  stats_.kept_bytes += static_cast<int64_t>(keep.nbytes());
  if (to_host_ && !keep.device().is_cpu()) {
    stats_.host_bytes += static_cast<int64_t>(keep.nbytes());
    keep = keep.to(kCPU);
  }
  if (slots_ > 0) keep = into_slot(keep.contiguous());
  return keep;
}

Tensor ActivationStash::unstash(const Tensor& stored, const Shape& shape, Device device,
                                DType dtype) {
  autograd::NoGradGuard no_grad;
  Tensor x = stored.device() == device ? stored : stored.to(device);
  if (partition_) {
    // Every rank of the group recomputes the same segments in the same order: the gathers pair.
    const int64_t per = x.numel();
    Tensor all = Tensor::empty({per * partition_->size()}, x.dtype(), device);
    partition_->all_gather(x, all, "activation checkpoint input (partition_activations)");
    x = all.flat_range(0, shape_numel(shape));
  }
  return ops::reshape(x, shape).to(dtype);
}

void ActivationStash::at_boundary(Device device) {
  if (!sync_ && !log_) return;
  backend::get(device).synchronize();  // profile: the forward's kernels are done when timed
  if (sync_) ++stats_.synchronized;
}

void ActivationStash::timed(const char* phase, double seconds) {
  ++stats_.timed;
  log_(fmt::format("time (ms) | {}: {:.2f}", phase, seconds * 1e3));
}

ActivationStashScope::ActivationStashScope(const config::ActivationCheckpointingConfig& c,
                                           std::shared_ptr<comm::Group> tensor_parallel,
                                           std::function<void(const std::string&)> log) {
  const bool partition = c.partition_activations && tensor_parallel && tensor_parallel->size() > 1;
  const int64_t slots = c.contiguous_memory_optimization ? c.number_checkpoints.value_or(0) : 0;
  const bool profile = c.profile && log;
  if (!c.cpu_checkpointing && !c.synchronize_checkpoint_boundary && !partition && slots == 0 &&
      !profile)
    return;
  stash_ = std::make_shared<ActivationStash>(
      c.cpu_checkpointing, c.synchronize_checkpoint_boundary,
      partition ? std::move(tensor_parallel) : nullptr, slots,
      profile ? std::move(log) : std::function<void(const std::string&)>());
  previous_ = autograd::set_checkpoint_stash(stash_);
}

ActivationStashScope::~ActivationStashScope() {
  if (stash_) autograd::set_checkpoint_stash(std::move(previous_));
}

}  // namespace ds::runtime
