// The memory model of ZeRO's model states (memory_model.h).
#include "ds/zero/memory_model.h"

#include <algorithm>

#include "ds/core/error.h"
#include "ds/zero/strategy.h"

namespace ds::zero {

namespace {

int64_t bytes_of(DType t) {
  return static_cast<int64_t>(dtype_size(t));
}

// A state of b bytes per element, whole below `sharded_from` and sharded from that stage on.
PerElement term(int stage, int sharded_from, int64_t b) {
  return stage >= sharded_from ? PerElement{0, b} : PerElement{b, 0};
}

// Elements a rank holds: `whole` of a replicated state, `shard` of a sharded one, and stage 3's
// persistent parameters (elements of their padded full buffers).
struct Held {
  int64_t whole = 0, shard = 0, persistent = 0;
};

RankMemory memory_of(const MemorySpec& s, const Held& h, int64_t frozen) {
  const PerElementBytes e = per_element_bytes(s);
  auto bytes = [&](const PerElement& pe) { return pe.whole * h.whole + pe.sharded * h.shard; };
  const int64_t psize = bytes_of(s.param_dtype);
  RankMemory m;
  m.params = bytes(e.params) + (h.persistent + frozen) * psize;
  m.grads = bytes(e.grads);
  m.master_weights = bytes(e.master_weights);
  m.optimizer_states = bytes(e.moments);
  m.grad_copy = bytes(e.grad_copy);
  m.host = bytes(e.host);
  m.gathered = e.gathered * s.largest_layer;
  const int64_t opt_elems = s.stage >= 1 ? h.shard : h.whole;
  if (const int64_t per = e.disk_optimizer.whole + e.disk_optimizer.sharded; per > 0) {
    // The NVMe store: `ratio` of the state in swap files, the rest in RAM, and a ring of
    // buffer_count sub-groups (zero/state_store.h) through which the swapped part is stepped.
    const int64_t all = bytes(e.disk_optimizer);
    const int64_t moved =
        static_cast<int64_t>(static_cast<double>(all) * std::clamp(s.optimizer_ratio, 0.0, 1.0));
    const int64_t ring = s.optimizer_buffer_count * std::min(s.sub_group_size, opt_elems) * per;
    m.disk_optimizer = moved;
    m.optimizer_states += all - moved + ring;
    m.buffers += ring;
  }
  if (e.disk_params.sharded > 0) {
    // The parameter file (zero/offload/param_file.h): max_in_cpu elements of the shard stay in
    // RAM, the rest is read through buffer_count x buffer_size elements of read-ahead.
    const int64_t kept = std::min(h.shard, std::max<int64_t>(0, s.param_max_in_cpu));
    const int64_t ahead = std::min(h.shard, s.param_buffer_count * s.param_buffer_size);
    m.params += (kept + ahead) * psize;
    m.disk_params = (h.shard - kept) * psize;
    m.buffers += ahead * psize;
  }
  return m;
}

}  // namespace

MemorySpec memory_spec(const Options& o, int world_size, int state_floats) {
  MemorySpec s;
  s.stage = o.stage;
  // MiCS partitions over its shard groups.
  s.world_size = o.stage == 3 && o.mics_shard_size > 0 && o.mics_shard_size < world_size
                     ? static_cast<int>(o.mics_shard_size)
                     : world_size;
  s.param_dtype = o.train_dtype;
  s.grad_dtype = o.grad_dtype;
  s.state_floats = state_floats;
  s.sub_group_size = o.sub_group_size;
  s.persistence_threshold = o.param_persistence_threshold;
  if (o.nvme_optimizer) {
    s.optimizer = OffloadTarget::nvme;
    s.optimizer_ratio = o.nvme_optimizer->ratio;
    s.optimizer_buffer_count = o.nvme_optimizer->buffer_count;
    s.sub_group_size = o.nvme_optimizer->sub_group_size;
  }
  if (o.nvme_params && o.stage == 3) {
    s.params = OffloadTarget::nvme;
    s.param_max_in_cpu = o.nvme_params->max_in_cpu;
    s.param_buffer_count = o.nvme_params->buffer_count;
    s.param_buffer_size = o.nvme_params->buffer_size;
  }
  return s;
}

PerElementBytes per_element_bytes(const MemorySpec& s) {
  DS_CHECK(s.stage >= 0 && s.stage <= 3, "[zero] memory model: ZeRO stage must be 0-3, got {}",
           s.stage);
  DS_CHECK(s.world_size >= 1, "[zero] memory model: world size must be >= 1, got {}", s.world_size);
  DS_CHECK(s.state_floats >= 0, "[zero] memory model: state_floats must be >= 0, got {}",
           s.state_floats);
  const bool sixteen = s.param_dtype != DType::f32;
  const bool grads16 = s.grad_dtype != DType::f32;
  const bool params_offload = s.stage == 3 && s.params != OffloadTarget::none;
  PerElementBytes e;
  e.params = term(s.stage, 3, bytes_of(s.param_dtype));
  e.grads = term(s.stage, 2, bytes_of(s.grad_dtype));
  // fp32 training steps the parameters themselves, unless they live on disk (then the optimizer
  // keeps its own fp32 copy: src/zero/stage3.cpp).
  const bool master = sixteen || (s.params == OffloadTarget::nvme && params_offload);
  e.master_weights = term(s.stage, 1, master ? 4 : 0);
  e.moments = term(s.stage, 1, 4 * static_cast<int64_t>(s.state_floats));
  // An in-RAM whole-tensor optimizer (Lamb, SGD) reads 16-bit gradients through an fp32 copy of
  // its range; Adam widens them a chunk at a time, anything on NVMe one sub-group at a time
  // (Strategy::step_16bit_gradients, Strategy::offloaded()).
  const bool nvme =
      s.optimizer == OffloadTarget::nvme || (s.params == OffloadTarget::nvme && params_offload);
  e.grad_copy = term(s.stage, 1, grads16 && !nvme && s.whole_tensor_optimizer ? 4 : 0);
  e.gathered = s.stage == 3 ? 2 * bytes_of(s.param_dtype) : 0;

  if (s.optimizer == OffloadTarget::cpu) {
    // DeepSpeed's ZeRO-Offload: fp32 gradients, master weights (fp32 even in fp32 training: the
    // host's copy) and moments on the host. From stage 2 on each bucket is reduced straight into
    // the host's gradient partition, so no gradient stays on the device; stages 0-1 still reduce
    // the whole gradient buffer there.
    e.host = term(s.stage, 1, 4 + 4 + 4 * static_cast<int64_t>(s.state_floats));
    e.master_weights = e.moments = e.grad_copy = {};
    if (s.stage >= 2) e.grads = {};
  } else if (s.optimizer == OffloadTarget::nvme) {
    e.disk_optimizer = e.master_weights;
    e.disk_optimizer += e.moments;
    e.master_weights = e.moments = {};
  }
  if (params_offload) {
    if (s.params == OffloadTarget::cpu) {
      e.host += e.params;
    } else {
      e.disk_params = e.params;
    }
    e.params = {};
  }
  return e;
}

RankMemory model_state_memory(const MemorySpec& spec, int64_t trainable, int64_t frozen) {
  DS_CHECK(trainable >= 0 && frozen >= 0,
           "[zero] memory model: element counts must be >= 0, got {} trainable and {} frozen",
           trainable, frozen);
  const PartitionPlan plan = plan_partitions(trainable, spec.world_size);
  return memory_of(spec, {plan.padded_numel, plan.partition_numel, 0}, frozen);
}

RankMemory model_state_memory(const MemorySpec& spec, std::span<const int64_t> numels,
                              int64_t frozen) {
  int64_t total = 0;
  for (int64_t n : numels) {
    DS_CHECK(n >= 0, "[zero] memory model: a parameter has {} elements", n);
    total += n;
  }
  if (spec.stage < 3) return model_state_memory(spec, total, frozen);
  // Stage 3 (src/zero/stage3.cpp): parameter i contributes ceil(n_i / N) elements to every
  // rank's shard, padded to the partition alignment; persistent ones are also kept whole, in a
  // buffer of N pieces.
  const int64_t n = spec.world_size;
  DS_CHECK(n >= 1, "[zero] memory model: world size must be >= 1, got {}", n);
  Held h;
  for (int64_t numel : numels) {
    const int64_t part = (numel + n - 1) / n;
    h.shard += part;
    if (numel <= spec.persistence_threshold) h.persistent += n * part;
  }
  h.shard = (h.shard + kPartitionAlignment - 1) / kPartitionAlignment * kPartitionAlignment;
  h.whole = plan_partitions(total, spec.world_size).padded_numel;
  return memory_of(spec, h, frozen);
}

ModelStateBytes expected_model_state_bytes(int stage, const PartitionPlan& plan, DType param_dtype,
                                           DType grad_dtype, int state_floats) {
  MemorySpec s;
  s.stage = stage;
  s.world_size = plan.world_size;
  s.param_dtype = param_dtype;
  s.grad_dtype = grad_dtype;
  s.state_floats = state_floats;
  const RankMemory m = memory_of(s, {plan.padded_numel, plan.partition_numel, 0}, 0);
  return {m.params, m.grads, m.master_weights, m.optimizer_states};
}

}  // namespace ds::zero
