// ZeRO stages 0-2 over one flat buffer (DeepSpeed's deepspeed/runtime/zero/stage_1_and_2.py;
// docs/zero.md):
//   stage 0  every rank holds everything; at the accumulation boundary gradients are all-reduced
//            in buckets as backward produces them (overlapped);
//   stage 1  the flat buffer is padded and cut into N contiguous partitions; fp32 master weights
//            and moments exist only for the rank's partition; gradients are reduce-scattered at
//            the boundary; updated partitions are all-gathered;
//   stage 2  as 1, and each rank keeps gradients only for its partition: every micro-step's
//            gradients are reduced bucket by bucket during backward (buckets.h).
// With the model on a GPU, the boundary micro-step's backward also sends the optimizer range's
// gradients to host memory range by range as they become final (grad_downloads.h).
#include <algorithm>
#include <optional>

#include "buckets.h"
#include "grad_downloads.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/device_registry.h"
#include "ds/ops/ops.h"
#include "strategies.h"

namespace ds::zero::detail {
namespace {

class FlatStrategy final : public Strategy {
 public:
  FlatStrategy(nn::Module& model, std::shared_ptr<comm::Group> group, const Options& o)
      : Strategy(model, std::move(group), o) {
    const int n = group_->size();
    const int stage = o.stage;
    const bool sharded = stage >= 1 && n > 1;
    set_partitioned(sharded);
    // Flatten in fp32 first: that buffer becomes the master copy (or the parameters themselves in
    // fp32 training). For 16-bit training flatten again in the training dtype: same order and
    // offsets, values rounded to nearest even, parameters rebound to the 16-bit buffer.
    // Only parameters that require a gradient enter the flat buffers (and so the gradient
    // buckets, the reduce-scatter and the optimizer's range); frozen ones (LoRA's base) sit in a
    // buffer of their own, replicated on every rank, without gradients.
    place_frozen();
    const auto trainable = nn::trainable_parameters(model_);
    // A model on a GPU trains ZeRO-Offload's way: its flat parameters and gradients stay on the
    // GPU, this rank's fp32 master weights and the optimizer state in host memory (docs/cuda.md);
    // collectives between ranks go through host memory (comm/group.h).
    device_ = trainable.front().second.device();
    if (!device_.is_cpu()) {
      DS_CHECK(!offloaded(),
               "[zero] the model is on {}: NVMe offload (offload_optimizer/offload_param device "
               "\"nvme\") works with models in host memory only for now; use device \"cpu\" or "
               "none",
               device_.str());
    }
    build_flat_buffers(trainable, sharded);

    // Every rank starts from rank 0's weights (initialisation is rank-independent already; this
    // also covers models initialised by the caller).
    if (n > 1) group_->broadcast(flat_.params, 0, "initial weights");

    install_gradient_hooks(trainable);
  }

  Tensor device_parameters() override {
    return device_.is_cpu() ? Tensor() : flat_.params.flat_range(begin_, opt_numel_);
  }

  void* params16() override {
    if (options_.train_dtype == DType::f32 || !device_.is_cpu()) return nullptr;
    return static_cast<char*>(flat_.params.raw_data()) +
           begin_ * static_cast<int64_t>(dtype_size(options_.train_dtype));
  }

  std::vector<optim::Segment> segments() const override {
    std::vector<optim::Segment> out;
    for (const auto& e : flat_.entries) {
      const int64_t b = std::clamp<int64_t>(e.offset, begin_, begin_ + opt_numel_);
      const int64_t en = std::clamp<int64_t>(e.offset + e.numel, begin_, begin_ + opt_numel_);
      out.push_back({b - begin_, en - b});
    }
    return out;
  }

  std::vector<HeldRange> held_ranges() const override {
    const int64_t lo = begin_, hi = std::min(begin_ + opt_numel_, flat_.numel);
    if (lo >= hi) return {};
    return {HeldRange{lo, hi, 0}};
  }

  MemoryBytes memory() const override {
    MemoryBytes b;
    b.params = static_cast<int64_t>(flat_.params.nbytes()) + frozen_bytes();
    b.grads =
        static_cast<int64_t>(flat_.grads.defined() ? flat_.grads.nbytes() : grads_part_.nbytes());
    b.scratch = host_step_.scratch_bytes();
    b.master_weights = master_bytes();
    return b;
  }

  void begin_backward(bool boundary, const std::string& ctx) override {
    // Stage 2 reduces every micro-step (each rank keeps only its partition); stage 0 reduces on
    // the boundary micro-step, overlapped with its backward; stage 1 reduce-scatters at the step.
    const bool bucketed = buckets_ && (options_.stage == 2 || boundary) && all_reduce_gradients_;
    arm_downloads(boundary, bucketed);
    if (bucketed) buckets_->begin(ctx);
    prefetch_optimizer_state(boundary);
  }
  void end_backward() override {
    if (buckets_ && buckets_->active()) buckets_->end();
    // Ranges not final by now (parameters without a gradient) go down with the step.
    if (downloads_) downloads_->disarm();
  }

  Tensor reduce_gradients(const std::string& ctx) override {
    if (options_.stage == 1 && partitioned_) {
      // Each rank receives the sum of its partition (in place inside the full gradient buffer, or
      // through a converted copy when the communication dtype differs).
      if (comm_prescale_ != 1.0f) ops::mul_(flat_.grads, comm_prescale_);
      Tensor mine = flat_.grads.flat_range(begin_, opt_numel_);
      if (options_.comm_dtype == flat_.grads.dtype()) {
        group_->reduce_scatter(flat_.grads, mine, comm::ReduceOp::sum, ctx + " gradients");
      } else {
        Tensor out = Tensor::empty({opt_numel_}, options_.comm_dtype);
        group_->reduce_scatter(flat_.grads.to(options_.comm_dtype), out, comm::ReduceOp::sum,
                               ctx + " gradients");
        mine.copy_from(out);
      }
    }
    return optimizer_gradients();
  }

  void after_step(const std::string& ctx) override {
    if (!partitioned_) return;
    Tensor mine = flat_.params.flat_range(begin_, opt_numel_);
    group_->all_gather(mine, flat_.params, ctx + " parameters");
  }

  void zero_grads() override {
    host_step_.discard_downloads();  // after a step there are none; after a skipped one, stale
    if (flat_.grads.defined()) flat_.grads.zero_();
    if (grads_part_.defined()) grads_part_.zero_();
  }

  std::vector<std::pair<std::string, Tensor>> full_weights() override {
    auto weights = model_.named_parameters();
    if (!device_.is_cpu())  // host copies: checkpoints and exports read them from host memory
      for (auto& [name, t] : weights) t = t.to(kCPU);
    return weights;
  }

  std::vector<std::pair<int64_t, int64_t>> optimizer_ranges_of(const std::set<std::string>& names,
                                                               bool complement) const override {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const nn::FlatEntry& e : flat_.entries) {
      if (names.count(e.name) == (complement ? 1u : 0u)) continue;
      const int64_t a = std::max<int64_t>(e.offset - begin_, 0),
                    z = std::min<int64_t>(e.offset + e.numel - begin_, opt_numel_);
      if (a < z) out.emplace_back(a, z);
    }
    return out;
  }

  void load_parameters(
      const std::function<void(const std::string&, const Tensor&)>& read_param) override {
    host_step_.discard_downloads();  // gradients of the weights before the load
    for (auto& [name, p] : model_.named_parameters()) {
      if (p.device().is_cpu()) {
        read_param(name, p);
        continue;
      }
      Tensor h = Tensor::empty(p.shape(), p.dtype(), kCPU);  // read on the host, then copied up
      read_param(name, h);
      p.copy_from(h);
    }
  }

 private:
  // The gradient buckets (stage 0 with several ranks, stage 2), the downloads during backward
  // (a model on a device) and the grad-ready hooks that drive them.
  // flat_ (the training-dtype parameters and, below stage 2, the gradients), master_ (this
  // rank's fp32 range, in host memory), plan_, begin_, opt_numel_ and, at stage 2, grads_part_.
  void build_flat_buffers(const std::vector<std::pair<std::string, Tensor>>& trainable,
                          bool sharded) {
    // The master weights go up to the GPU after every step (fp32 training): page-locked there.
    auto host_clone = [this](const Tensor& t) {
      Tensor h = Tensor::from_storage(
          backend::get(device_).host_staging(t.nbytes()), t.shape(), t.dtype());
      h.copy_from(t);
      return h;
    };
    // A model on a device: the fp32 flat copy is made in host memory (it becomes the master
    // weights there), the device's cache returns the parameters' own blocks, and only the
    // training-dtype buffer and the gradients are then allocated on the device: its start-up peak
    // is theirs, not the parameters' + an fp32 flat copy + a 16-bit copy (docs/cuda.md, "Memory").
    const Options& o = options_;
    const int n = group_->size();
    const bool full_grads = o.stage < 2;
    const int64_t multiple = padding_multiple(n);
    const bool on_device = !device_.is_cpu();
    nn::FlatParameters f32 = nn::flatten_parameters(
        trainable, DType::f32, o.grad_dtype, multiple, full_grads && !on_device,
        on_device ? std::optional<Device>(kCPU) : std::nullopt);
    if (on_device) device_ops(device_).allocator->empty_cache();  // where device storage comes from
    plan_ = plan_partitions(f32.numel, n);
    DS_CHECK(plan_.padded_numel == f32.padded_numel, "[zero] internal: padding plan disagrees");
    begin_ = sharded ? plan_.begin(group_->rank()) : 0;
    opt_numel_ = sharded ? plan_.partition_numel : plan_.padded_numel;
    auto range = [&](const Tensor& t) { return t.flat_range(begin_, opt_numel_); };
    if (!on_device && o.train_dtype == DType::f32) {
      flat_ = std::move(f32);
      master_ = range(flat_.params);
    } else {
      // Only this rank's range of the fp32 copy is kept as master weights.
      master_ = on_device ? host_clone(range(f32.params)) : range(f32.params).clone();
      f32 = {};
      flat_ = nn::flatten_parameters(trainable, o.train_dtype, o.grad_dtype, multiple, full_grads,
                                     device_);
    }
    if (!full_grads) grads_part_ = Tensor::zeros({opt_numel_}, o.grad_dtype, device_);
    // 16-bit gradients go to the optimizer as they are: widened a chunk at a time in RAM
    // (step_16bit_gradients), on the host after the copy down from a GPU (device_optimizer_step).
  }

  void install_gradient_hooks(const std::vector<std::pair<std::string, Tensor>>& trainable) {
    const Options& o = options_;
    const int n = group_->size(), stage = o.stage;
    if ((stage == 0 && n > 1) || stage == 2) {
      GradientBuckets::Setup s;
      s.stage = stage;
      s.flat = &flat_;
      s.plan = plan_;
      s.bucket_numel = o.reduce_bucket_size;
      s.comm_dtype = o.comm_dtype;
      s.prescale = comm_prescale_;
      s.reduce_to_owners = o.reduce_scatter;
      s.partition_grads = grads_part_;
      s.partition_begin = begin_;
      s.keep_in_flight = static_cast<size_t>(reductions_in_flight());
      s.on_final = [this](int64_t lo, int64_t hi) { gradients_final(lo, hi); };
      buckets_.emplace(std::move(s), group_);
    }
    if (!device_.is_cpu())
      downloads_.emplace(opt_numel_, HostStep::step_chunk(o.sub_group_size),
                         [this](int64_t b, int64_t numel) {
                           host_step_.download(optimizer_gradients(), b, numel);
                         });
    grad_seen_.assign(trainable.size(), 0);
    if (buckets_ || downloads_)
      for (size_t i = 0; i < trainable.size(); ++i)
        trainable[i].second.add_grad_ready_hook(
            [this, i](const Tensor& p) { on_grad_ready(static_cast<int>(i), p); });
  }

  // The gradients the optimizer steps with: (opt_numel,) on the model's device.
  Tensor optimizer_gradients() const {
    return options_.stage >= 2 ? grads_part_ : flat_.grads.flat_range(begin_, opt_numel_);
  }

  // Whether this backward sends its gradients down as they become final. Only where nothing
  // changes the optimizer range's gradients on the device after backward: the step reads them
  // unchanged, clipping and the loss scale's unscaling being grad_scale factors of the host
  // optimizer (Engine::take_step). So not at stage 1 with several ranks (the reduce-scatter at
  // the step writes them), nor at stage 0 with several ranks and the all-reduce off (no buckets
  // report them final), nor with expert parallelism (the dense ranges' all-reduce at
  // reduced_gradients()); not for whole-tensor optimizers (Lamb: HostStep copies all at once).
  bool downloads_in_backward(bool boundary, bool bucketed) const {
    if (!downloads_ || !boundary || !options_.download_in_backward) return false;
    if (!optimizer_steps_in_slices_ || ep_) return false;
    return group_->size() == 1 || (options_.stage != 1 && bucketed);
  }

  void arm_downloads(bool boundary, bool bucketed) {
    if (!downloads_) return;
    // Sent by a backward no step followed (the engine always steps after the boundary one).
    host_step_.discard_downloads();
    downloads_->disarm();
    if (!downloads_in_backward(boundary, bucketed)) return;
    downloads_->arm();
    std::fill(grad_seen_.begin(), grad_seen_.end(), 0);
    report_by_hooks_ = !bucketed;
    // Without buckets the grad-ready hooks report; the padding has no hook and no gradient.
    if (report_by_hooks_) gradients_final(flat_.numel, plan_.padded_numel);
  }

  // The grad-ready hook of trainable parameter i.
  void on_grad_ready(int i, const Tensor& p) {
    const bool tracking = downloads_ && downloads_->armed();
    if (tracking && grad_seen_[static_cast<size_t>(i)]) {
      // Completed twice in one backward (used in two checkpointed segments): ranges sent may
      // change again. Everything goes down with the step instead.
      downloads_->disarm();
      host_step_.discard_downloads();
    }
    if (tracking) grad_seen_[static_cast<size_t>(i)] = 1;
    if (buckets_) buckets_->on_grad_ready(i, p);  // a no-op unless armed
    if (tracking && report_by_hooks_ && downloads_->armed()) {
      const nn::FlatEntry& e = flat_.entries[static_cast<size_t>(i)];
      gradients_final(e.offset, e.offset + e.numel);
    }
  }

  // Flat elements [lo, hi) hold their final gradients for this backward.
  void gradients_final(int64_t lo, int64_t hi) {
    if (downloads_ && downloads_->armed()) downloads_->mark_final(lo - begin_, hi - begin_);
  }

  Device device_ = kCPU;  // where the model's trainable parameters live
  int64_t begin_ = 0;  // the range of the flat buffer this rank optimises starts here
  Tensor grads_part_;  // stage 2: (opt_numel,) accumulated gradients of this rank's partition
  std::optional<GradientBuckets> buckets_;
  // The model on a GPU: the gradient downloads during backward, and which parameters have
  // completed their gradient in this backward (a second completion stops them).
  std::optional<BackwardDownloads> downloads_;
  std::vector<char> grad_seen_;
  bool report_by_hooks_ = false;  // no buckets this backward: the hooks say what is final
};

}  // namespace

std::unique_ptr<Strategy> make_flat_strategy(nn::Module& model, std::shared_ptr<comm::Group> group,
                                             const Options& options) {
  return std::make_unique<FlatStrategy>(model, std::move(group), options);
}

}  // namespace ds::zero::detail
