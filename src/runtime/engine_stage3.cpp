// ZeRO stage 3: parameter partitioning (reference/deepspeed-behaviour.md §6).
//
// Layout: parameter i (numel_i elements) is padded to N * part_i, part_i = ceil(numel_i / N), and
// rank r holds elements [r * part_i, (r + 1) * part_i) of it. A rank's pieces of all parameters
// sit back to back in its shard buffers (master weights, moments, gradients, and the training-dtype
// copy that is all-gathered), so the optimizer runs on one contiguous range as in stages 1-2.
//
// Each parameter keeps its TensorImpl; its storage becomes a (N * part_i) buffer that is released
// between uses. Tensors saved for backward share that Storage object, so re-gathering before a
// module's backward makes their data reappear in place.
#include <algorithm>
#include <cstring>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/gpt.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"

namespace ds::runtime {

void Engine::stage3_setup() {
  const int n = group_->size(), r = group_->rank();
  const DType train = config_.training_dtype();
  const auto persist =
      static_cast<int64_t>(config_.zero_optimization.stage3_param_persistence_threshold);
  auto named = model_->named_parameters();

  // Shard plan, and the flat coordinates (unpadded concatenation) checkpoints are written in.
  int64_t flat_offset = 0, shard_offset = 0;
  for (auto& [name, p] : named) {
    Stage3Param sp;
    sp.param = p;
    sp.numel = p.numel();
    sp.part = (sp.numel + n - 1) / n;
    sp.shard_offset = shard_offset;
    sp.persistent = sp.numel <= persist;
    flat_.entries.push_back({name, p.shape(), flat_offset, sp.numel});
    flat_offset += sp.numel;
    shard_offset += sp.part;
    s3_.push_back(std::move(sp));
  }
  flat_.numel = flat_offset;
  plan_ = zero::plan_partitions(flat_.numel, n);
  opt_begin_ = 0;
  opt_numel_ = (shard_offset + zero::kPartitionAlignment - 1) / zero::kPartitionAlignment *
               zero::kPartitionAlignment;
  master_ = Tensor::zeros({opt_numel_});
  grads_part_ = Tensor::zeros({opt_numel_}, grad_dtype_);
  if (grad_dtype_ != DType::f32) grads32_ = Tensor::zeros({opt_numel_});

  // This rank's pieces: from the parameters when the model was built whole, otherwise from the
  // model's initialisation function (the model was built under nn::PartitionedInit).
  auto* gpt = dynamic_cast<models::GPT*>(model_.get());
  const auto init_plan = gpt ? gpt->init_plan() : std::vector<models::ParamInit>{};
  float* master = master_.data<float>();
  for (size_t i = 0; i < s3_.size(); ++i) {
    auto& sp = s3_[i];
    const int64_t begin = std::min(sp.numel, r * sp.part),
                  end = std::min(sp.numel, (r + 1) * sp.part);
    if (sp.param.is_materialized()) {
      Tensor src = sp.param.contiguous().flat_range(begin, end - begin);
      convert(src.raw_data(), src.dtype(), master + sp.shard_offset, DType::f32,
              static_cast<size_t>(end - begin));
    } else {
      DS_CHECK(gpt,
               "[engine] parameter '{}' holds no data and the model has no initialisation "
               "function for shards; build it whole or make it a models::GPT",
               flat_.entries[i].name);
      models::GPT::init_values(init_plan[i], gpt->config().seed, i, begin, end - begin,
                               master + sp.shard_offset);
    }
    // Rebind the parameter to its own gatherable buffer, released until first use.
    sp.full = Storage::allocate(static_cast<size_t>(n * sp.part) * dtype_size(train));
    TensorImpl* impl = sp.param.impl();
    impl->storage = sp.full;
    impl->offset = 0;
    impl->strides = contiguous_strides(impl->shape);
    impl->dtype = train;
    impl->grad = Tensor();
    sp.full->release();
  }
  shard_params_ = train == DType::f32 ? master_ : master_.to(train);

  // Module hooks: gather a module's own parameters around its forward and backward.
  for (auto& [mname, module] : model_->named_modules()) {
    std::vector<int> mine;
    for (auto& [pname, p] : module->own_parameters())
      for (size_t i = 0; i < s3_.size(); ++i)
        if (s3_[i].param.same(p)) mine.push_back(static_cast<int>(i));
    if (mine.empty()) continue;
    const std::string label = mname.empty() ? module->type_name() : mname;
    module->register_forward_pre_hook(
        [this, mine, label](nn::Module&, const Tensor&) { stage3_gather(mine, label); });
    module->register_forward_hook(
        [this, mine](nn::Module&, const Tensor&, const Tensor&) { stage3_release(mine); });
    module->register_backward_pre_hook(
        [this, mine, label](nn::Module&) { stage3_gather(mine, label + " (backward)"); });
    module->register_backward_hook([this, mine](nn::Module&) { stage3_release(mine); });
  }
  for (size_t i = 0; i < s3_.size(); ++i)
    s3_[i].param.add_grad_ready_hook(
        [this, i](const Tensor& p) { stage3_on_grad_ready(static_cast<int>(i), p); });
  stage3_after_step();  // persistent parameters are gathered once and kept
}

void Engine::stage3_begin_micro_step(bool training) {
  s3_pos_ = 0;
  s3_follow_trace_ = training && !s3_recording_ && !s3_trace_.empty();
}

void Engine::stage3_end_micro_step() {
  if (s3_recording_ && !s3_trace_.empty()) s3_recording_ = false;
  s3_follow_trace_ = false;
}

void Engine::stage3_gather(const std::vector<int>& params, const std::string& why) {
  const DType train = config_.training_dtype();
  const size_t esz = dtype_size(train);
  if (s3_prefetching_.size() != s3_.size()) {
    s3_prefetching_.assign(s3_.size(), false);
    s3_prefetch_.assign(s3_.size(), comm::Work());
  }
  auto launch = [&](int i, const std::string& label) {
    auto& sp = s3_[static_cast<size_t>(i)];
    sp.full->materialize();
    const char* src = static_cast<const char*>(shard_params_.raw_data()) +
                      sp.shard_offset * static_cast<int64_t>(esz);
    return group_->all_gather_async(
        src, sp.full->data(), static_cast<size_t>(sp.part), train,
        fmt::format("gather {} for {}", flat_.entries[static_cast<size_t>(i)].name, label));
  };
  if (s3_recording_) s3_trace_.push_back(params);
  if (s3_follow_trace_) {
    if (s3_pos_ < s3_trace_.size() && s3_trace_[s3_pos_] == params) {
      ++s3_pos_;
    } else {
      s3_follow_trace_ = false;  // a different order than the first micro-step: no guessing
    }
  }
  std::vector<comm::Work> works;
  for (int i : params) {
    auto& sp = s3_[static_cast<size_t>(i)];
    if (s3_prefetching_[static_cast<size_t>(i)]) {
      works.push_back(s3_prefetch_[static_cast<size_t>(i)]);
      s3_prefetching_[static_cast<size_t>(i)] = false;
      continue;
    }
    if (sp.full->is_materialized()) continue;
    works.push_back(launch(i, why));
  }
  // Gather the next modules' parameters ahead, on the communication thread, while this module runs.
  if (s3_follow_trace_) {
    auto budget = static_cast<int64_t>(config_.zero_optimization.stage3_prefetch_bucket_size);
    // stage3_max_live_parameters bounds the elements gathered at once (this module's included).
    const auto max_live =
        static_cast<int64_t>(config_.zero_optimization.stage3_max_live_parameters);
    int64_t live = 0;
    for (const auto& sp : s3_)
      if (!sp.persistent && sp.full->is_materialized()) live += sp.numel;
    for (size_t k = s3_pos_; k < s3_trace_.size() && budget > 0; ++k)
      for (int i : s3_trace_[k]) {
        auto& sp = s3_[static_cast<size_t>(i)];
        if (sp.full->is_materialized() || s3_prefetching_[static_cast<size_t>(i)]) continue;
        if (live + sp.numel > max_live) {
          budget = 0;
          break;
        }
        live += sp.numel;
        s3_prefetch_[static_cast<size_t>(i)] = launch(i, "prefetch");
        ++s3_prefetch_count_;
        s3_prefetching_[static_cast<size_t>(i)] = true;
        budget -= sp.numel;
      }
  }
  for (auto& w : works) w.wait();
}

void Engine::stage3_release(const std::vector<int>& params) {
  // Parameters the trace uses again soon stay (stage3_max_reuse_distance, in elements).
  std::vector<bool> keep(params.size(), false);
  if (s3_follow_trace_) {
    auto distance = static_cast<int64_t>(config_.zero_optimization.stage3_max_reuse_distance);
    for (size_t k = s3_pos_; k < s3_trace_.size() && distance > 0; ++k)
      for (int j : s3_trace_[k]) {
        for (size_t a = 0; a < params.size(); ++a) keep[a] = keep[a] || params[a] == j;
        distance -= s3_[static_cast<size_t>(j)].numel;
      }
  }
  for (size_t a = 0; a < params.size(); ++a) {
    const int i = params[a];
    auto& sp = s3_[static_cast<size_t>(i)];
    if (keep[a] || sp.persistent || !sp.full->is_materialized()) continue;
    if (!s3_prefetching_.empty() && s3_prefetching_[static_cast<size_t>(i)]) continue;
    sp.full->release();
  }
}

void Engine::stage3_on_grad_ready(int i, const Tensor& p) {
  auto& sp = s3_[static_cast<size_t>(i)];
  const int n = group_->size();
  Tensor g = p.grad().contiguous();
  const DType gd = g.dtype(), cd = comm_dtype_;
  const size_t ges = dtype_size(gd);
  const char* gsrc = static_cast<const char*>(g.raw_data());
  // Rank r's piece of the parameter is [r * part, (r + 1) * part): the reduce-scatter of a chunk
  // [c, c + len) of every piece takes those N slices back to back, in the communication dtype
  // (the copy converts; past numel it is zero padding). Chunks of at most reduce_bucket_size
  // elements in all keep the staging of a large parameter (the embedding) bounded.
  const auto bucket =
      std::max<int64_t>(n, static_cast<int64_t>(config_.zero_optimization.reduce_bucket_size));
  const int64_t chunk = std::max<int64_t>(1, std::min(sp.part, bucket / n));
  for (int64_t c = 0; c < sp.part; c += chunk) {
    const int64_t len = std::min(chunk, sp.part - c);
    Tensor staging = Tensor::empty({n * len}, cd);
    char* dst = static_cast<char*>(staging.raw_data());
    const size_t ces = dtype_size(cd);
    for (int r = 0; r < n; ++r) {
      const int64_t from = r * sp.part + c;
      const int64_t have = std::clamp<int64_t>(sp.numel - from, 0, len);
      if (have > 0)
        convert(gsrc + from * static_cast<int64_t>(ges), gd,
                dst + r * len * static_cast<int64_t>(ces), cd, static_cast<size_t>(have));
      if (have < len)
        std::memset(dst + (r * len + have) * static_cast<int64_t>(ces), 0,
                    static_cast<size_t>(len - have) * ces);
    }
    if (comm_prescale_ != 1.0f && n > 1) ops::mul_(staging, comm_prescale_);
    Tensor out = n > 1 ? Tensor::empty({len}, cd) : staging;
    comm::Work w = n > 1 ? group_->reduce_scatter_async(
                               staging, out, comm::ReduceOp::sum,
                               fmt::format("step {} gradient of {}", global_steps_ + 1,
                                           flat_.entries[static_cast<size_t>(i)].name))
                         : comm::Work();
    s3_in_flight_.push_back({i, c, staging, out, w});
    // Fold finished reductions into the shard as backward goes, so that only the last few
    // chunks' staging is alive at any time.
    stage3_finish_reductions(buckets_in_flight());
  }
  p.set_grad({});
}

void Engine::stage3_finish_reductions(size_t keep_in_flight) {
  size_t done = 0;
  for (; s3_in_flight_.size() - done > keep_in_flight; ++done) {
    auto& pending = s3_in_flight_[done];
    pending.work.wait();
    const auto& sp = s3_[static_cast<size_t>(pending.param)];
    ops::add_(grads_part_.flat_range(sp.shard_offset + pending.offset, pending.out.numel()),
              pending.out);
  }
  s3_in_flight_.erase(s3_in_flight_.begin(),
                      s3_in_flight_.begin() + static_cast<std::ptrdiff_t>(done));
}

void Engine::stage3_after_step() {
  // New weights: finish and drop every gathered copy (prefetched ones hold old values), then gather
  // the persistent ones again.
  for (size_t i = 0; i < s3_prefetching_.size(); ++i)
    if (s3_prefetching_[i]) {
      s3_prefetch_[i].wait();
      s3_prefetching_[i] = false;
    }
  const bool follow = s3_follow_trace_, recording = s3_recording_;
  s3_follow_trace_ = false;
  s3_recording_ = false;
  std::vector<int> persistent;
  for (size_t i = 0; i < s3_.size(); ++i) {
    if (s3_[i].full->is_materialized()) s3_[i].full->release();
    if (s3_[i].persistent) persistent.push_back(static_cast<int>(i));
  }
  stage3_gather(persistent, "persistent parameters");
  s3_follow_trace_ = follow;
  s3_recording_ = recording;
}

std::vector<std::pair<std::string, Tensor>> Engine::stage3_gathered_weights() {
  // Collective: every rank gathers each parameter in turn; rank 0 keeps a copy.
  std::vector<std::pair<std::string, Tensor>> out;
  const bool recording = s3_recording_, follow = s3_follow_trace_;
  s3_recording_ = false;
  s3_follow_trace_ = false;
  for (size_t i = 0; i < s3_.size(); ++i) {
    stage3_gather({static_cast<int>(i)}, "checkpoint");
    if (group_->rank() == 0) out.emplace_back(flat_.entries[i].name, s3_[i].param.clone());
    stage3_release({static_cast<int>(i)});
  }
  s3_recording_ = recording;
  s3_follow_trace_ = follow;
  return out;
}

std::vector<std::pair<std::string, Tensor>> Engine::full_weights() {
  if (stage_ == 3) return stage3_gathered_weights();
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : model_->named_parameters()) out.emplace_back(name, p);
  return out;
}

}  // namespace ds::runtime
