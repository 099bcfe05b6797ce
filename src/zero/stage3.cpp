// ZeRO stage 3: parameter partitioning (the ZeRO paper, Rajbhandari et al. 2020; DeepSpeed's
// deepspeed/runtime/zero/stage3.py and partition_parameters.py; docs/zero.md).
//
// Layout: parameter i (numel_i elements) is padded to N * part_i, part_i = ceil(numel_i / N), and
// rank r holds elements [r * part_i, (r + 1) * part_i) of it. A rank's pieces of all parameters
// sit back to back in its shard buffers (master weights, moments, gradients, and the training-dtype
// copy that is all-gathered), so the optimizer runs on one contiguous range as in stages 1-2.
//
// Each parameter keeps its TensorImpl; its storage becomes a (N * part_i) buffer that is released
// between uses. Tensors saved for backward share that Storage object, so re-gathering before a
// module's backward makes their data reappear in place. Module hooks gather a module's own
// parameters around its forward and its backward and release them after, except persistent small
// ones; each parameter's gradient is reduce-scattered as soon as it is complete, in chunks of at
// most reduce_bucket_size elements. Prefetching along the recorded trace: prefetch.h.
//
// A model on a device (a GPU, or the `sim` device in tests) keeps the same layout with the
// shards in host memory (ZeRO-Infinity's offload_param "cpu": the ZeRO-Offload layout FlatStrategy
// uses on a GPU, docs/cuda.md): each parameter's gatherable buffer, its gradient and the reduction
// staging are on the device; the all-gather lands in host memory and is copied up by the Work's
// wait() (comm's Tensor overloads), each gradient chunk is packed on the device and copied down
// for the reduce-scatter, and the optimizer steps the host shards as on the CPU.
#include <algorithm>
#include <cstring>
#include <optional>

#include "ds/core/error.h"
#include "ds/ops/ops.h"
#include "ds/zero/quantize.h"
#include "offload/param_file.h"
#include "offload/step_scheduler.h"
#include "prefetch.h"
#include "strategies.h"

namespace ds::zero::detail {
namespace {

class Stage3Strategy final : public Strategy {
 public:
  // group: the ranks the parameters are partitioned over (MiCS: this rank's shard group);
  // replicas: MiCS's replica group, or null.
  Stage3Strategy(nn::Module& model, std::shared_ptr<comm::Group> group, const Options& o,
                 std::shared_ptr<comm::Group> replicas)
      : Strategy(model, std::move(group), o, std::move(replicas)) {
    const int n = group_->size(), r = group_->rank();
    set_partitioned(n > 1);
    device_ = model_device(model);
    start_hpz(o.hpz_partition_size);
    // Frozen parameters (LoRA's base) are not partitioned: they stay whole on every rank in
    // frozen_, outside the gathers, the gradient reduce-scatter and the optimizer's shard.
    place_frozen();
    const auto all = model_.named_parameters();
    std::vector<std::pair<std::string, Tensor>> named;
    std::vector<size_t> model_index;  // of each managed parameter in named_parameters()
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].second.requires_grad()) {
        named.push_back(all[i]);
        model_index.push_back(i);
      }

    // Shard plan, and the flat coordinates (unpadded concatenation) checkpoints are written in.
    int64_t flat_offset = 0, shard_offset = 0;
    for (auto& [name, p] : named) {
      Param sp;
      sp.param = p;
      sp.numel = p.numel();
      sp.part = (sp.numel + n - 1) / n;
      sp.shard_offset = shard_offset;
      sp.persistent = sp.numel <= o.param_persistence_threshold;
      sp.model_index = model_index[params_.size()];
      flat_.entries.push_back({name, p.shape(), flat_offset, sp.numel});
      flat_offset += sp.numel;
      shard_offset += sp.part;
      params_.push_back(std::move(sp));
    }
    flat_.numel = flat_offset;
    plan_ = plan_partitions(flat_.numel, n);
    opt_numel_ =
        (shard_offset + kPartitionAlignment - 1) / kPartitionAlignment * kPartitionAlignment;
    grads_part_ = Tensor::zeros({opt_numel_}, o.grad_dtype);
    numel_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) numel_[i] = params_[i].numel;

    // This rank's pieces: from the parameters when the model was built whole, otherwise from the
    // model's initialisation of a range (the model was built under nn::PartitionedInit). When the
    // NVMe optimizer store will hold the only fp32 master weights and the model was built
    // piecewise, nothing is computed here: attach_optimizer() asks initial_master() for them one
    // sub-group at a time and the working pieces are written in the same pass, so neither the
    // fp32 master weights nor (with parameters on NVMe) the 16-bit pieces exist whole in RAM.
    bool built_whole = false;
    for (const auto& sp : params_) built_whole = built_whole || sp.param.is_materialized();
    deferred_init_ =
        o.nvme_optimizer && (o.train_dtype != DType::f32 || o.nvme_params) && !built_whole;
    if (!deferred_init_) {
      master_ = Tensor::zeros({opt_numel_});
      for (size_t i = 0; i < params_.size(); ++i) {
        const auto& sp = params_[i];
        init_piece(i, 0, std::min(sp.numel, (r + 1) * sp.part) - std::min(sp.numel, r * sp.part),
                   master_.data<float>() + sp.shard_offset);
      }
    }
    for (auto& sp : params_) {
      // Rebind the parameter to its own gatherable buffer, released until first use.
      sp.full = Storage::allocate(static_cast<size_t>(n * sp.part) * dtype_size(o.train_dtype),
                                  device_);
      TensorImpl* impl = sp.param.impl();
      impl->storage = sp.full;
      impl->offset = 0;
      impl->strides = contiguous_strides(impl->shape);
      impl->dtype = o.train_dtype;
      impl->grad = Tensor();
      sp.full->release();
    }
    if (deferred_init_) {
      if (!o.nvme_params) shard_params_ = Tensor::empty({opt_numel_}, o.train_dtype);
    } else {
      shard_params_ = o.train_dtype == DType::f32 ? master_ : master_.to(o.train_dtype);
    }
    if (o.nvme_params) {
      // The pieces move to the swap file (max_in_cpu of them stay in RAM); in fp32 training the
      // master weights stay the optimizer's (RAM or its own NVMe store), no longer the parameters.
      param_file_ = std::make_unique<ParamFile>(
          *o.nvme_params, r, o.train_dtype, opt_numel_,
          deferred_init_ ? nullptr : shard_params_.raw_data(), io::align_up(o.sub_group_size, 2048),
          o.log);
      if (o.log) o.log(param_file_->describe());
      shard_params_ = Tensor();
    }
    // Offloaded: optimizer steps run on the scheduler's worker unless overlap_step is off.
    scheduler_ = std::make_unique<StepScheduler>(opt_numel_, offloaded() && o.overlap_step, r);
    prefetch_.assign(params_.size(), comm::Work());
    prefetching_.assign(params_.size(), false);

    // Module hooks: gather a module's own parameters around its forward and backward.
    for (auto& [mname, module] : model_.named_modules()) {
      std::vector<int> mine;
      for (auto& [pname, p] : module->own_parameters())
        for (size_t i = 0; i < params_.size(); ++i)
          if (params_[i].param.same(p)) mine.push_back(static_cast<int>(i));
      if (mine.empty()) continue;
      const std::string label = mname.empty() ? module->type_name() : mname;
      module->register_forward_pre_hook(
          [this, mine, label](nn::Module&, const Tensor&) { gather(mine, label); });
      module->register_forward_hook(
          [this, mine](nn::Module&, const Tensor&, const Tensor&) { release(mine); });
      module->register_backward_pre_hook(
          [this, mine, label](nn::Module&) { gather(mine, label + " (backward)"); });
      module->register_backward_hook([this, mine](nn::Module&) { release(mine); });
    }
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].param.add_grad_ready_hook(
          [this, i](const Tensor& p) { on_grad_ready(static_cast<int>(i), p); });
    if (!deferred_init_) refresh();  // persistent parameters are gathered once and kept
  }

  ~Stage3Strategy() override { scheduler_->join(); }  // the worker uses the members below

  void* params16() override {
    return options_.train_dtype == DType::f32 || param_file_ ? nullptr : shard_params_.raw_data();
  }

  std::vector<optim::Segment> segments() const override {
    std::vector<optim::Segment> out;
    const int r = group_->rank();
    for (const auto& sp : params_)
      out.push_back({sp.shard_offset, std::clamp<int64_t>(sp.numel - r * sp.part, 0, sp.part)});
    return out;
  }

  std::vector<HeldRange> held_ranges() const override {
    std::vector<HeldRange> out;
    const int r = group_->rank();
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& sp = params_[i];
      const int64_t b = std::min(sp.numel, r * sp.part), e = std::min(sp.numel, (r + 1) * sp.part);
      if (b < e)
        out.push_back({flat_.entries[i].offset + b, flat_.entries[i].offset + e, sp.shard_offset});
    }
    return out;
  }

  MemoryBytes memory() const override {
    MemoryBytes b;
    // The shard of every parameter (fp32 training: the master weights themselves) plus the
    // persistent parameters, which every rank keeps whole.
    b.params = param_file_ ? param_file_->ram_elements() *
                                 static_cast<int64_t>(dtype_size(options_.train_dtype))
                           : static_cast<int64_t>(shard_params_.nbytes());
    for (const auto& sp : params_) {
      if (sp.persistent) b.params += static_cast<int64_t>(sp.full->nbytes());
      if (sp.secondary) b.params += static_cast<int64_t>(sp.secondary->nbytes());  // hpZ
    }
    b.params += frozen_bytes();
    b.grads = static_cast<int64_t>(grads_part_.nbytes());
    b.scratch = host_step_.scratch_bytes();
    b.master_weights = master_bytes();
    return b;
  }

  int64_t prefetched_gathers() const override { return prefetch_count_; }
  int64_t secondary_gathers() const override { return secondary_gathers_; }

  OffloadStats offload_stats() const override {
    OffloadStats o = Strategy::offload_stats();
    if (param_file_) {
      const io::Counters c = param_file_->counters();
      o.bytes_read += c.bytes_read;
      o.bytes_written += c.bytes_written;
      o.disk_bytes += param_file_->disk_bytes();
      // The training thread's waits: its reads, and the writes when it steps itself.
      o.wait_seconds += param_file_->read_wait_seconds() +
                        (scheduler_->background() ? 0.0 : param_file_->write_wait_seconds());
    }
    return o;
  }

  void begin_forward(bool training) override {
    if (!training) eval_recording_ = trace_.recording(), trace_.set_recording(false);
    trace_.begin_micro_step(training);
  }
  void end_eval() override {
    trace_.set_recording(eval_recording_);
    synchronize("evaluation");
  }

  void begin_backward(bool boundary, const std::string& ctx) override {
    ctx_ = ctx;
    // The background step (which owns the gradients until it ends) is done, and an I/O failure
    // anywhere reaches every rank before the gradients are reduced.
    synchronize(ctx);
    // A step planned for this backward starts now (its worker reads the state ahead itself).
    if (!(boundary && start_planned_step(ctx))) prefetch_optimizer_state(boundary);
  }
  void end_backward() override {
    finish_reductions(0);
    scheduler_->backward_finished();
    trace_.end_micro_step();
  }

  Tensor reduce_gradients(const std::string& ctx) override {
    // MiCS: each replica group reduced its own micro-batches; the shard's gradient is their sum.
    if (replicas_ && replicas_->size() > 1)
      replicas_->all_reduce(grads_part_, comm::ReduceOp::sum, ctx + " MiCS replica gradients");
    return grads_part_;
  }

  void after_step(const std::string&) override {
    if (!step_pending()) return refresh();
    // The step runs on: drop every gathered copy (old values), the persistent ones too; the
    // forward gathers each again once its sub-group is written (launch_gather).
    drop_gathered();
  }

  // During a background step the worker zeroes each sub-group's gradients once it is stepped.
  void zero_grads() override {
    if (!step_pending()) grads_part_.zero_();
  }

  std::vector<std::pair<std::string, Tensor>> full_weights() override {
    // Collective: every rank gathers each parameter in turn; rank 0 keeps a copy.
    synchronize("gathering the weights");
    std::vector<std::pair<std::string, Tensor>> out;
    const Trace::Paused paused = trace_.pause();
    for (size_t i = 0; i < params_.size(); ++i) {
      gather({static_cast<int>(i)}, "checkpoint", /*exact=*/true);
      if (group_->rank() == 0) out.emplace_back(flat_.entries[i].name, host_copy(params_[i].param));
      release({static_cast<int>(i)});
    }
    // Frozen parameters are whole on every rank already.
    if (group_->rank() == 0)
      for (const auto& [name, p] : nn::frozen_parameters(model_))
        out.emplace_back(name, host_copy(p));
    trace_.resume(paused);
    return out;
  }

  void keep_gathered(const Tensor& param) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].param.same(param)) continue;
      params_[i].persistent = true;
      const Trace::Paused paused = trace_.pause();
      gather({static_cast<int>(i)}, "a parameter kept whole", /*exact=*/true);
      trace_.resume(paused);
      return;
    }
    DS_THROW("[zero] keep_gathered: the tensor is not one of the model's trainable parameters");
  }

  std::vector<std::pair<int64_t, int64_t>> optimizer_ranges_of(const std::set<std::string>& names,
                                                               bool complement) const override {
    // This rank's piece of each parameter sits at its shard offset (past numel: padding, whose
    // gradients are zero).
    std::vector<std::pair<int64_t, int64_t>> out;
    const int r = group_->rank();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (names.count(flat_.entries[i].name) == (complement ? 1u : 0u)) continue;
      const auto& sp = params_[i];
      const int64_t len = std::clamp<int64_t>(sp.numel - r * sp.part, 0, sp.part);
      if (len > 0) out.emplace_back(sp.shard_offset, sp.shard_offset + len);
    }
    return out;
  }

  void load_parameters(
      const std::function<void(const std::string&, const Tensor&)>& read_param) override {
    // Frozen parameters (whole on every rank) come from the model file as they are.
    for (const auto& [name, p] : nn::frozen_parameters(model_)) read_param(name, p);
    // Each rank's piece is the rounded master weights, exactly as after an optimizer step.
    synchronize("loading a checkpoint");
    try {
      if (param_file_) {
        refresh_staged();
        write_params_from_master();
      } else if (options_.train_dtype != DType::f32) {
        round_master_into(shard_params_);
      }
    } catch (const Error& e) {
      // Reading the restored state back (or writing the pieces) failed here: every rank stops.
      scheduler_->record_failure(fmt::format("[zero] rank {}: writing the loaded parameters: {}",
                                             group_->rank(), e.what()));
    }
    synchronize("loading a checkpoint");
    refresh();
  }

 private:
  // Elements [from, from + count) of this rank's piece of parameter i (fp32) into out: from the
  // parameter when the model was built whole, else from the model's range initialisation.
  void init_piece(size_t i, int64_t from, int64_t count, float* out) const {
    const auto& sp = params_[i];
    const int64_t begin = std::min(sp.numel, group_->rank() * sp.part) + from;
    if (count <= 0) return;
    if (sp.param.is_materialized()) {
      Tensor dst = Tensor::from_storage(
          Storage::external(out, static_cast<size_t>(count) * sizeof(float), kCPU), {count},
          DType::f32);
      dst.copy_from(sp.param.contiguous().flat_range(begin, count));
      return;
    }
    DS_CHECK(model_.init_parameter_range(sp.model_index, begin, count, out),
             "[zero] parameter '{}' holds no data and the model ({}) cannot initialise a range of "
             "it (nn::Module::init_parameter_range); build the model whole",
             flat_.entries[i].name, model_.type_name());
  }

  void initial_master(int64_t begin, int64_t numel, float* out) override {
    if (!deferred_init_) return Strategy::initial_master(begin, numel, out);
    // Shard elements [begin, end): the pieces of the parameters overlapping them, zero padding.
    const int64_t end = begin + numel;
    std::fill(out, out + numel, 0.0f);
    const int r = group_->rank();
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& sp = params_[i];
      const int64_t len = std::min(sp.numel, (r + 1) * sp.part) - std::min(sp.numel, r * sp.part);
      const int64_t lo = std::max(begin, sp.shard_offset),
                    hi = std::min(end, sp.shard_offset + len);
      if (lo < hi) init_piece(i, lo - sp.shard_offset, hi - lo, out + (lo - begin));
    }
    // The working pieces of this range, rounded from it as after an optimizer step.
    const DType train = options_.train_dtype;
    auto src = Storage::external(out, static_cast<size_t>(numel) * sizeof(float), kCPU);
    const Tensor master = Tensor::from_storage(src, {numel}, DType::f32);
    if (param_file_) {
      auto dst = Storage::external(param_file_->scratch(begin, numel),
                                   static_cast<size_t>(numel) * dtype_size(train), kCPU);
      Tensor::from_storage(dst, {numel}, train).copy_from(master);
      param_file_->write(begin, numel);
    } else {
      shard_params_.flat_range(begin, numel).copy_from(master);
    }
  }

  // Offloaded: the optimizer steps on a worker while the next forward runs, or from the backward
  // on when no clipping needs the norm first (strategy.h). Not with tensor parallelism (the norm
  // counts the replicated parameters apart) nor in a pipeline stage (the stages must agree on
  // skipping a non-finite step).
  StepScheduler* scheduler() const override { return scheduler_.get(); }
  bool can_step_in_backward() const override {
    // MiCS sums the replicas' gradients at the boundary, after backward.
    return scheduler_->background() && options_.step_in_backward && !norm_.beside_other_axes() &&
           !replicas_;
  }
  void chunks_starting() override {
    if (param_file_) param_file_->take_durable();  // the writes before this step
  }
  std::vector<std::pair<int64_t, int64_t>> chunk_stepped(const StateChunk& c) override {
    if (scheduler_->background()) grads_part_.flat_range(c.begin, c.numel).zero_();
    if (param_file_) return param_file_->take_durable();
    return {{c.begin, c.begin + c.numel}};
  }

  void on_attached() override {
    if (!deferred_init_) return;
    if (param_file_) param_file_->flush();
    deferred_init_ = false;
    refresh();  // persistent parameters are gathered once and kept
  }

  // A new host copy of t (checkpoints and exports read host memory).
  static Tensor host_copy(const Tensor& t) { return t.device().is_cpu() ? t.clone() : t.to(kCPU); }
  // Where the model's trainable parameters live (one device for all of them).
  static Device model_device(nn::Module& model) {
    std::optional<Device> d;
    for (const auto& [name, p] : model.named_parameters()) {
      if (!p.requires_grad()) continue;
      if (!d) d = p.device();
      DS_CHECK(p.device() == *d, "[zero] parameter '{}' is on {}, the model's others on {}: "
               "move the whole model to one device before ZeRO stage 3", name, p.device().str(),
               d->str());
    }
    return d.value_or(kCPU);
  }

  struct Param {
    Tensor param;                   // the model's parameter (its storage: `full`)
    std::shared_ptr<Storage> full;  // (N * part,) training dtype; released when not in use
    int64_t numel = 0, part = 0;    // part = ceil(numel / N)
    int64_t shard_offset = 0;       // of this rank's piece in the shard buffers
    bool persistent = false;
    // hpZ: this rank's 1/h of the gathered parameter (n * part / h elements, training dtype, on
    // the model's device), valid from its first release after the weights last changed.
    std::shared_ptr<Storage> secondary;
    bool secondary_valid = false;
    size_t model_index = 0;  // in the model's named_parameters() (init_parameter_range)
  };
  struct PendingReduction {
    int param;
    int64_t offset;  // of the chunk within the rank's piece of the parameter
    Tensor staging, out;
    comm::Work work;
  };

  // Parameters on NVMe (param_file.h): the optimizer's sub-groups go to the swap file.
  bool params_on_nvme() const override { return param_file_ != nullptr; }
  void* params_out(const StateChunk& c) override { return param_file_->scratch(c.begin, c.numel); }
  void params_written(const StateChunk& c) override { param_file_->write(c.begin, c.numel); }
  void params_flushed() override { param_file_->flush(); }

  // Staged pieces hold old values after a step or a load: drop them (no read is in flight then).
  void refresh_staged() {
    if (param_file_) param_file_->drop_all();
  }

  // Parameters on NVMe: read the pieces of the parameters after `params` (in registration order
  // forward, in reverse in backward: the modules' order, known from step 1) ahead, within
  // buffer_count x buffer_size staged elements.
  void read_ahead(const std::vector<int>& params, bool backward) {
    if (!param_file_ || params.empty()) return;
    const int count = static_cast<int>(params_.size());
    int j = backward ? *std::min_element(params.begin(), params.end()) - 1
                     : *std::max_element(params.begin(), params.end()) + 1;
    for (; j >= 0 && j < count; j += backward ? -1 : 1) {
      const auto& sp = params_[static_cast<size_t>(j)];
      if (sp.persistent || sp.full->is_materialized() || param_file_->staged(j)) continue;
      // A background step may still be writing its new values.
      if (!scheduler_->stepped(sp.shard_offset, sp.shard_offset + sp.part)) break;
      if (param_file_->staged_elements() + sp.part > param_file_->budget()) break;
      param_file_->prefetch(j, sp.shard_offset, sp.part);
    }
  }

  // exact: gather the training-dtype values even under qwZ (checkpoints, exports, kept weights).
  comm::Work launch_gather(int i, const std::string& label, bool exact = false) {
    auto& sp = params_[static_cast<size_t>(i)];
    const std::string& name = flat_.entries[static_cast<size_t>(i)].name;
    DS_CHECK(!deferred_init_,
             "[zero] parameter '{}' is used before attach_optimizer(): with the optimizer state on "
             "NVMe its initial values are written there",
             name);
    // A background step writes the new values of this piece first.
    scheduler_->wait_stepped(sp.shard_offset, sp.shard_offset + sp.part);
    sp.full->materialize();
    if (hpz_ && sp.secondary_valid && !exact) return launch_secondary_gather(i, label);
    const size_t esz = dtype_size(options_.train_dtype);
    const char* src = nullptr;
    if (!param_file_) {
      src = static_cast<const char*>(shard_params_.raw_data()) +
            sp.shard_offset * static_cast<int64_t>(esz);
    } else {
      try {
        src = static_cast<const char*>(param_file_->get(i, sp.shard_offset, sp.part));
      } catch (const Error& e) {
        // This rank still takes part in the gather (zeros), so no rank waits for it; the error
        // reaches every rank at the next synchronize() (this backward, or after evaluation).
        scheduler_->record_failure(
            fmt::format("[zero] rank {}: reading parameter '{}' from NVMe: {}", group_->rank(),
                        name, e.what()));
        // Its own buffer: an earlier failed piece's gather may still be reading its zeros.
        failed_reads_.emplace_back(static_cast<size_t>(sp.part) * esz, 0);
        src = failed_reads_.back().data();
      }
    }
    // The Tensor overload: on a device the gather lands in host memory and is copied up by the
    // Work's wait() (comm/group.h), so the parameter holds its values once gather() waited.
    const Tensor piece = Tensor::from_storage(
        Storage::external(const_cast<char*>(src), static_cast<size_t>(sp.part) * esz, kCPU),
        {sp.part}, options_.train_dtype);
    const Tensor full =
        Tensor::from_storage(sp.full, {group_->size() * sp.part}, options_.train_dtype);
    const std::string what =
        fmt::format("gather {} for {}", flat_.entries[static_cast<size_t>(i)].name, label);
    if (options_.quantized_weights && !exact && group_->size() > 1)
      return launch_quantized_gather(piece, full, what);
    return group_->all_gather_async(piece, full, what);
  }

  // qwZ: this rank's piece as int8 blocks (zero/quantize.h) to every rank; each dequantizes the
  // N pieces into the parameter on the waiting thread (Work::after_wait).
  comm::Work launch_quantized_gather(const Tensor& piece, const Tensor& full,
                                     const std::string& what) {
    const int64_t part = piece.numel(), n = group_->size();
    const int64_t words = quantized_words(part, 8);
    auto send = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(words));
    auto recv = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(words * n));
    const Tensor values = piece.dtype() == DType::f32 ? piece : piece.to(DType::f32);
    quantize_blocks(values.data<float>(), part, 8, send->data());
    comm::Work w = group_->all_gather_async(send->data(), recv->data(), static_cast<size_t>(words),
                                            DType::i32, what + " (int8, qwZ)");
    return w.after_wait([send, recv, full, part, n, words] {
      Tensor host = Tensor::empty({n * part}, DType::f32, kCPU);
      for (int64_t r = 0; r < n; ++r)
        dequantize_blocks(recv->data() + r * words, part, 8, host.data<float>() + r * part);
      full.copy_from(host);
    });
  }

  // hpZ: split the group into groups of h consecutive ranks (h == 1 or the whole group: off).
  void start_hpz(int64_t h) {
    const int n = group_->size();
    DS_CHECK(h >= 1 && n % h == 0,
             "[zero] zero_optimization.zero_hpz_partition_size = {} must divide the data-parallel "
             "size {} (ranks per node, typically)",
             h, n);
    if (h == 1 || h == n) return;  // one secondary piece per rank would be its whole primary
    hpz_ = group_->split(group_->rank() / static_cast<int>(h));
  }

  // hpZ: the parameter from the secondary pieces of this rank's hpZ group (each holds 1/h).
  comm::Work launch_secondary_gather(int i, const std::string& label) {
    auto& sp = params_[static_cast<size_t>(i)];
    const int64_t full_numel = group_->size() * sp.part, piece = full_numel / hpz_->size();
    ++secondary_gathers_;
    return hpz_->all_gather_async(
        Tensor::from_storage(sp.secondary, {piece}, options_.train_dtype),
        Tensor::from_storage(sp.full, {full_numel}, options_.train_dtype),
        fmt::format("gather {} for {} (hpZ secondary)", flat_.entries[static_cast<size_t>(i)].name,
                    label));
  }

  // hpZ: before a gathered parameter is released, this rank keeps its secondary piece of it.
  void keep_secondary(Param& sp) {
    if (!hpz_ || sp.secondary_valid) return;
    const int64_t full_numel = group_->size() * sp.part, piece = full_numel / hpz_->size();
    if (!sp.secondary)
      sp.secondary = Storage::allocate(static_cast<size_t>(piece) * dtype_size(options_.train_dtype),
                                       device_);
    sp.secondary->materialize();
    Tensor::from_storage(sp.secondary, {piece}, options_.train_dtype)
        .copy_from(Tensor::from_storage(sp.full, {full_numel}, options_.train_dtype)
                       .flat_range(hpz_->rank() * piece, piece));
    sp.secondary_valid = true;
  }

  void gather(const std::vector<int>& params, const std::string& why, bool exact = false) {
    trace_.on_gather(params);
    std::vector<comm::Work> works;
    for (int i : params) {
      auto& sp = params_[static_cast<size_t>(i)];
      if (prefetching_[static_cast<size_t>(i)]) {
        works.push_back(prefetch_[static_cast<size_t>(i)]);
        prefetching_[static_cast<size_t>(i)] = false;
        continue;
      }
      if (sp.full->is_materialized()) continue;
      works.push_back(launch_gather(i, why, exact));
    }
    // Gather the next modules' parameters ahead, on the communication thread, while this one runs.
    if (trace_.following()) {
      std::vector<bool> available(params_.size());
      int64_t live = 0;
      for (size_t i = 0; i < params_.size(); ++i) {
        const bool gathered = params_[i].full->is_materialized();
        available[i] = gathered || prefetching_[i];
        if (!params_[i].persistent && gathered) live += params_[i].numel;
      }
      for (int i :
           plan_prefetch(trace_.upcoming(), numel_, available, options_.prefetch_bucket_size,
                         options_.max_live_parameters, live)) {
        prefetch_[static_cast<size_t>(i)] = launch_gather(i, "prefetch");
        prefetching_[static_cast<size_t>(i)] = true;
        ++prefetch_count_;
      }
    }
    read_ahead(params, why.find("(backward)") != std::string::npos);
    for (auto& w : works) w.wait();
    if (param_file_)
      for (int i : params) param_file_->drop(i);  // gathered: the staged piece is free again
  }

  void release(const std::vector<int>& params) {
    // Parameters the trace uses again soon stay (max_reuse_distance, in elements).
    const std::vector<bool> keep =
        trace_.following()
            ? reused_soon(trace_.upcoming(), params, numel_, options_.max_reuse_distance)
            : std::vector<bool>(params.size(), false);
    auto releasable = [&](const Param& sp, int i) {
      return !sp.persistent && sp.full->is_materialized() && !prefetching_[static_cast<size_t>(i)];
    };
    for (size_t a = 0; a < params.size(); ++a) {
      const int i = params[a];
      auto& sp = params_[static_cast<size_t>(i)];
      if (!keep[a] && releasable(sp, i)) {
        keep_secondary(sp);
        sp.full->release();
      }
    }
    // Kept ones stay only within max_live_parameters gathered elements (DeepSpeed's bound on
    // what stays resident): the reuse distance alone would keep most of a large model gathered
    // between its forward and backward.
    int64_t live = 0;
    for (const auto& sp : params_)
      if (!sp.persistent && sp.full->is_materialized()) live += sp.numel;
    for (size_t a = 0; a < params.size() && live > options_.max_live_parameters; ++a) {
      const int i = params[a];
      auto& sp = params_[static_cast<size_t>(i)];
      if (keep[a] && releasable(sp, i)) {
        keep_secondary(sp);
        sp.full->release();
        live -= sp.numel;
      }
    }
  }

  void on_grad_ready(int i, const Tensor& p) {
    auto& sp = params_[static_cast<size_t>(i)];
    const int n = group_->size();
    Tensor g = p.grad().contiguous();
    const DType cd = options_.comm_dtype;
    // Rank r's piece of the parameter is [r * part, (r + 1) * part): the reduce-scatter of a chunk
    // [c, c + len) of every piece takes those N slices back to back, in the communication dtype
    // (the copy converts; past numel it is zero padding). Chunks of at most reduce_bucket_size
    // elements in all keep the staging of a large parameter (the embedding) bounded.
    const auto bucket = std::max<int64_t>(n, options_.reduce_bucket_size);
    const int64_t chunk = std::max<int64_t>(1, std::min(sp.part, bucket / n));
    for (int64_t c = 0; c < sp.part; c += chunk) {
      const int64_t len = std::min(chunk, sp.part - c);
      Tensor staging = Tensor::empty({n * len}, cd, g.device());
      for (int r = 0; r < n; ++r) {
        const int64_t from = r * sp.part + c;
        const int64_t have = std::clamp<int64_t>(sp.numel - from, 0, len);
        if (have > 0) staging.flat_range(r * len, have).copy_from(g.flat_range(from, have));
        if (have < len) staging.flat_range(r * len + have, len - have).zero_();
      }
      if (comm_prescale_ != 1.0f && n > 1) ops::mul_(staging, comm_prescale_);
      // The reduced chunk lands in host memory beside the shard (on a device: copied down).
      Tensor out = n > 1 ? Tensor::empty({len}, cd, kCPU) : staging.to(kCPU);
      const std::string what =
          fmt::format("{} gradient of {}", ctx_, flat_.entries[static_cast<size_t>(i)].name);
      comm::Work w = n == 1                        ? comm::Work()
                     : options_.quantized_gradients ? launch_quantized_reduce(staging, out, what)
                                                    : group_->reduce_scatter_async(
                                                          staging, out, comm::ReduceOp::sum, what);
      in_flight_.push_back({i, c, staging, out, w});
      // Fold finished reductions into the shard as backward goes, so that only the last few
      // chunks' staging is alive at any time.
      finish_reductions(static_cast<size_t>(reductions_in_flight()));
    }
    p.set_grad({});
  }

  // qgZ: the reduce-scatter of `staging` (N slices of len) into `out` with int4 blocks: each
  // slice is quantized (zero/quantize.h) and sent to its owner by one all-to-all; the owner
  // dequantizes the N slices it receives and sums them in fp32, in rank order (Work::after_wait).
  comm::Work launch_quantized_reduce(const Tensor& staging, const Tensor& out,
                                     const std::string& what) {
    const int64_t n = group_->size(), len = out.numel();
    const int64_t words = quantized_words(len, 4);
    auto send = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(words * n));
    auto recv = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(words * n));
    const Tensor values = staging.dtype() == DType::f32 && staging.device().is_cpu()
                              ? staging.contiguous()
                              : staging.to(kCPU).to(DType::f32);
    for (int64_t r = 0; r < n; ++r)
      quantize_blocks(values.data<float>() + r * len, len, 4, send->data() + r * words);
    comm::Work w = group_->all_to_all_async(send->data(), recv->data(), static_cast<size_t>(words),
                                            DType::i32, what + " (int4, qgZ)");
    return w.after_wait([send, recv, out, n, len, words] {
      Tensor sum = Tensor::zeros({len}, DType::f32, kCPU);
      for (int64_t r = 0; r < n; ++r)
        dequantize_blocks(recv->data() + r * words, len, 4, sum.data<float>(), /*accumulate=*/true);
      out.copy_from(sum);
    });
  }

  void finish_reductions(size_t keep) {
    size_t done = 0;
    for (; in_flight_.size() - done > keep; ++done) {
      auto& pending = in_flight_[done];
      pending.work.wait();
      const auto& sp = params_[static_cast<size_t>(pending.param)];
      ops::add_(grads_part_.flat_range(sp.shard_offset + pending.offset, pending.out.numel()),
                pending.out);
      // The piece's last chunk: its gradient is final (a step during backward may take it).
      if (pending.offset + pending.out.numel() == sp.part)
        scheduler_->grads_final(sp.shard_offset, sp.shard_offset + sp.part);
    }
    in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<std::ptrdiff_t>(done));
  }

  // New weights: finish and drop every gathered copy (prefetched ones hold old values), then
  // gather the persistent ones again.
  void refresh() {
    drop_gathered();
    const Trace::Paused paused = trace_.pause();
    std::vector<int> persistent;
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].persistent) persistent.push_back(static_cast<int>(i));
    // Exact under qwZ too: they stay gathered, and checkpoints and exports read them as they are.
    gather(persistent, "persistent parameters", /*exact=*/true);
    trace_.resume(paused);
  }

  void drop_gathered() {
    for (size_t i = 0; i < prefetching_.size(); ++i)
      if (prefetching_[i]) {
        prefetch_[i].wait();
        prefetching_[i] = false;
      }
    refresh_staged();
    for (auto& sp : params_) {
      if (sp.full->is_materialized()) sp.full->release();
      sp.secondary_valid = false;  // the weights change: the next forward gathers whole again
    }
    failed_reads_.clear();  // every gather has completed (the prefetches were waited above)
  }

  Device device_ = kCPU;  // the model's: gathered parameters and their gradients live there
  std::vector<Param> params_;
  // Zeros gathered in place of pieces whose read failed; kept until no gather can read them
  // (drop_gathered). Moving the outer vector keeps each buffer where it is.
  std::vector<std::vector<char>> failed_reads_;
  std::vector<int64_t> numel_;  // params_[i].numel, for the prefetch planner
  Tensor shard_params_;         // (opt_numel,) training dtype: this rank's piece of every parameter
  Tensor grads_part_;           // (opt_numel,) accumulated gradients of this rank's pieces
  std::vector<PendingReduction> in_flight_;
  std::string ctx_;  // "step N", for the gradient reductions' messages
  Trace trace_;
  bool eval_recording_ = false;
  std::vector<comm::Work> prefetch_;  // per parameter: its pending gather (or a complete Work)
  std::vector<bool> prefetching_;
  int64_t prefetch_count_ = 0;
  std::shared_ptr<comm::Group> hpz_;  // hpZ: the h consecutive ranks of this one (null: off)
  int64_t secondary_gathers_ = 0;
  std::unique_ptr<ParamFile> param_file_;  // offload_param.device = "nvme"
  // The pieces are written by attach_optimizer() (initial_master()); nothing may be gathered before.
  bool deferred_init_ = false;
  // The background optimizer step (offload/step_scheduler.h); also carries the parameter reads'
  // failures to synchronize(). Declared last: destroyed first, while the members its worker uses
  // are still alive (the destructor joins it before anything else anyway).
  std::unique_ptr<StepScheduler> scheduler_;
};

}  // namespace

std::unique_ptr<Strategy> make_stage3_strategy(nn::Module& model,
                                               std::shared_ptr<comm::Group> group,
                                               const Options& options) {
  const int n = group->size(), r = group->rank();
  const int64_t s = options.mics_shard_size;
  if (s <= 0 || s >= n) {
    DS_CHECK(s <= n, "[zero] zero_optimization.mics_shard_size = {} is larger than the "
             "data-parallel size {}", s, n);
    return std::make_unique<Stage3Strategy>(model, std::move(group), options, nullptr);
  }
  DS_CHECK(n % s == 0,
           "[zero] zero_optimization.mics_shard_size = {} must divide the data-parallel size {}",
           s, n);
  // Shard groups: s consecutive ranks; replica groups: the ranks of equal position in them.
  auto shard = group->split(r / static_cast<int>(s));
  auto replicas = group->split(r % static_cast<int>(s));
  return std::make_unique<Stage3Strategy>(model, std::move(shard), options, std::move(replicas));
}

}  // namespace ds::zero::detail
