// The activation_checkpointing section over autograd's checkpoint stash (activation_stash.h).
#include "ds/runtime/activation_stash.h"

#include "ds/backend/backend.h"

namespace ds::runtime {

Tensor ActivationStash::stash(const Tensor& x) {
  ++stats_.stashed;
  if (!to_host_ || x.device().is_cpu()) return x;
  stats_.host_bytes += static_cast<int64_t>(x.nbytes());
  return x.to(kCPU);
}

Tensor ActivationStash::unstash(const Tensor& stored, Device device, DType dtype) {
  Tensor x = stored.device() == device ? stored : stored.to(device);
  return x.to(dtype);
}

void ActivationStash::at_boundary(Device device) {
  if (!sync_) return;
  backend::get(device).synchronize();
  ++stats_.synchronized;
}

ActivationStashScope::ActivationStashScope(const config::ActivationCheckpointingConfig& c) {
  if (!c.cpu_checkpointing && !c.synchronize_checkpoint_boundary) return;
  stash_ = std::make_shared<ActivationStash>(c.cpu_checkpointing, c.synchronize_checkpoint_boundary);
  previous_ = autograd::set_checkpoint_stash(stash_);
}

ActivationStashScope::~ActivationStashScope() {
  if (stash_) autograd::set_checkpoint_stash(std::move(previous_));
}

}  // namespace ds::runtime
