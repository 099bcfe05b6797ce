// The activation_checkpointing section over autograd's checkpoint stash (activation_stash.h).
#include "ds/runtime/activation_stash.h"

#include <algorithm>

#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/ops/ops.h"

namespace ds::runtime {

ActivationStash::ActivationStash(bool to_host, bool synchronize,
                                 std::shared_ptr<comm::Group> partition)
    : to_host_(to_host), sync_(synchronize) {
  if (partition && partition->size() > 1) partition_ = std::move(partition);
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
  if (!sync_) return;
  backend::get(device).synchronize();
  ++stats_.synchronized;
}

ActivationStashScope::ActivationStashScope(const config::ActivationCheckpointingConfig& c,
                                           std::shared_ptr<comm::Group> tensor_parallel) {
  const bool partition = c.partition_activations && tensor_parallel && tensor_parallel->size() > 1;
  if (!c.cpu_checkpointing && !c.synchronize_checkpoint_boundary && !partition) return;
  stash_ = std::make_shared<ActivationStash>(c.cpu_checkpointing, c.synchronize_checkpoint_boundary,
                                             partition ? std::move(tensor_parallel) : nullptr);
  previous_ = autograd::set_checkpoint_stash(stash_);
}

ActivationStashScope::~ActivationStashScope() {
  if (stash_) autograd::set_checkpoint_stash(std::move(previous_));
}

}  // namespace ds::runtime
