#pragma once
// ZeRO as a strategy: where parameters, gradients, master weights and optimizer state live, and
// the communication that keeps them consistent (DeepSpeed's deepspeed/runtime/zero/; docs/zero.md).
// The engine (runtime/engine.h) keeps precision, loss scaling, skipping, clipping, the LR schedule
// and the counters, and calls the strategy at each point of a step:
//
//   auto z = zero::make_strategy(model, group, options);    // flattens / shards the model
//   z->attach_optimizer(optimizer, log);                     // master + moments: RAM or NVMe
//   per micro-step:
//     z->begin_forward(/*training=*/true);  loss = loss_fn(model, batch);
//     z->begin_backward(boundary, "step 17");  loss.backward();  z->end_backward();
//   at an accumulation boundary:
//     Tensor g = z->reduced_gradients(ctx);                  // (optimizer_numel,) fp32
//     double sq = z->global_sum_of_squares(g, ctx);          // every rank's share summed
//     z->optimizer_step(optimizer, g, scale, ctx);           // through z->state()
//     z->after_step(ctx);  z->zero_grads();
//
// A strategy is the interface below with its shared implementation, composed of parts each in a
// file of its own: the global gradient norm across the parallel axes (GradNorm, grad_norm.h), the
// optimizer step over host memory (HostStep, host_step.h), the optimizer state's home (StateStore,
// state_store.h), the NVMe step's background scheduler (src/zero/offload/step_scheduler.h) and the
// partition arithmetic (PartitionPlan, partition.h). The sharding policy is the subclass:
// one implementation per stage family: FlatStrategy (stages 0-2: one flat buffer, cut into
// contiguous partitions from stage 1 on; src/zero/flat_strategy.cpp, gradient buckets in
// src/zero/buckets.cpp) and Stage3Strategy (every parameter cut into N pieces, gathered around use;
// src/zero/stage3.cpp, prefetch along the recorded trace in src/zero/prefetch.cpp, and with
// offload its background optimizer step in src/zero/offload/step_scheduler.cpp).
//
// Threading: called from the training thread only. The strategy issues collectives on its group;
// every rank must call the same methods in the same order (they are collectives where noted).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ds/comm/group.h"
#include "ds/core/dtype.h"
#include "ds/core/tensor.h"
#include "ds/nn/flat.h"
#include "ds/nn/module.h"
#include "ds/optim/kernels.h"
#include "ds/optim/optimizer.h"
#include "ds/zero/defaults.h"
#include "ds/zero/grad_norm.h"
#include "ds/zero/host_step.h"
#include "ds/zero/partition.h"
#include "ds/zero/state_store.h"

namespace ds::zero {

namespace detail {
class StepScheduler;  // src/zero/offload/step_scheduler.h: stage 3's background step
}

// zero_optimization.offload_param with device "nvme" (stage 3) plus the aio section.
struct NvmeParamOffloadOptions {
  std::string nvme_path;
  int64_t buffer_count = defaults::kParamBufferCount;
  int64_t buffer_size = defaults::kParamBufferSize;  // read-ahead stages at most count x size
  int64_t max_in_cpu = defaults::kParamMaxInCpu;  // elements of this rank's pieces kept in RAM
  io::AioOptions aio;
};

// What the strategy needs from DeepSpeed's config (runtime maps `zero_optimization` and the
// gradient-averaging keys onto it; zero/ does not read configs).
struct Options {
  int stage = 0;
  DType train_dtype = DType::f32;  // parameters
  DType grad_dtype = DType::f32;   // gradient accumulation
  DType comm_dtype = DType::f32;   // gradients travel in this dtype (communication_data_type)
  int64_t reduce_bucket_size = defaults::kReduceBucketSize;  // elements per reduction message (>= 1)
  bool overlap_comm = false;               // keep two reductions in flight during backward
  bool reduce_scatter = true;  // stage 2: reduce each bucket piece to its owner (else all-reduce)
  // Gradient averaging: prescale divides by N before the reduction; otherwise by
  // gradient_predivide_factor before and predivide / N after (folded into the optimizer's scale).
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // Stage 3.
  // numel <= this: gathered once and kept
  int64_t param_persistence_threshold = defaults::kParamPersistenceThreshold;
  int64_t prefetch_bucket_size = defaults::kPrefetchBucketSize;  // gathered ahead along the trace
  int64_t max_live_parameters = defaults::kMaxLiveParameters;    // gathered at once at most
  int64_t max_reuse_distance = defaults::kMaxReuseDistance;  // keep one used again within this
  // ZeRO++ (stage 3; docs/zero.md, "ZeRO++"). quantized_weights (qwZ): the forward's and
  // backward's gathers move each rank's piece as int8 blocks with one fp32 scale per
  // kQuantBlock (zero/quantize.h) and dequantize it into the gathered parameter; the master
  // weights, and the gathers of checkpoints and exports, stay exact.
  bool quantized_weights = false;
  // quantized_gradients (qgZ): each gradient reduce-scatter becomes an all-to-all of int4 blocks
  // (zero/quantize.h), dequantized and summed in fp32 by each piece's owner.
  bool quantized_gradients = false;
  // hpz_partition_size (hpZ) h > 1: the forward's gathers span the data-parallel group and each
  // rank keeps 1/h of every gathered parameter (its secondary piece) when the parameter is
  // released, so the backward's gathers (and recomputes) run within groups of h consecutive ranks
  // (a node); the secondary pieces are dropped when the weights change. h must divide the group.
  int64_t hpz_partition_size = 1;
  // MiCS (stage 3; docs/zero.md, "MiCS"), mics_shard_size S with 1 <= S < N: parameters,
  // gradients and optimizer state are partitioned over groups of S consecutive ranks (the
  // strategy's group() is this rank's shard group) and replicated across the N / S groups; each
  // step sums a shard's gradients over its replicas (one all-reduce among the ranks of equal
  // position in their shard groups). S must divide N; S <= 0 or S = N is plain stage 3.
  int64_t mics_shard_size = -1;
  // The optimizer's sub-group (elements): the unit the optimizer state is streamed in.
  int64_t sub_group_size = defaults::kSubGroupSize;
  // How an offloaded step is scheduled (deepspeed.cpp's own keys in offload_optimizer,
  // docs/offload.md); they matter only when something is on NVMe.
  // overlap_step: stage 3 steps on a worker thread while the next forward gathers (optimizer_step).
  bool overlap_step = true;
  // step_in_backward: with overlap_step, each sub-group is stepped as soon as its gradients are
  // final when the engine allows it (no gradient clipping, no fp16 loss scaling).
  bool step_in_backward = true;
  // prefetch_in_backward: the boundary micro-step's backward starts reading the first sub-groups
  // of the coming step's optimizer state (StateStore::prefetch; needs pipeline_read).
  bool prefetch_in_backward = true;
  // download_in_backward: with the model on a GPU (stages 0-2, an elementwise optimizer), the
  // boundary micro-step's backward sends each range of the optimizer range's gradients to host
  // memory as soon as it is final (HostStep::download), so the step waits only for what backward
  // left. DeepSpeed does the same for ZeRO-Offload (stage_1_and_2.py, copy_grads_in_partition:
  // each reduced bucket's gradients of this rank's partition are copied non_blocking into the fp32
  // host gradient buffer as the bucket is reduced during backward, i.e. always at stage 2, with
  // overlap_comm at stage 1); deepspeed.cpp ties it to no other key. Off: all after backward.
  bool download_in_backward = true;
  // offload_optimizer.device = "nvme": master weights and moments in swap files (state_store.h).
  std::optional<NvmeOffloadOptions> nvme_optimizer;
  // offload_param.device = "nvme" (stage 3): this rank's parameter pieces in a swap file.
  std::optional<NvmeParamOffloadOptions> nvme_params;
  // Start-up notices of the offload layers (O_DIRECT fallback, sizes); may be empty.
  std::function<void(const std::string&)> log;
};

// A piece of the flat parameter space (the unpadded concatenation of all parameters in
// named_parameters() order) that this rank's optimizer buffers hold: flat elements
// [flat_begin, flat_end) sit at [offset, offset + flat_end - flat_begin) of master() and of every
// optimizer state buffer. Checkpoints write and read exactly these.
struct HeldRange {
  int64_t flat_begin = 0, flat_end = 0, offset = 0;
};

// Model-state bytes this rank holds (the ZeRO paper's accounting; optimizer moments are the
// optimizer's and not counted here).
struct MemoryBytes {
  int64_t params = 0;          // working parameters (training dtype)
  int64_t grads = 0;           // gradient buffers (accumulation dtype)
  int64_t master_weights = 0;  // fp32 copy under bf16/fp16 (0 in fp32: params are the master)
  int64_t scratch = 0;         // fp32 copy of 16-bit gradients for the optimizer
};

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  int stage() const { return options_.stage; }
  const Options& options() const { return options_; }
  comm::Group& group() const { return *group_; }
  // MiCS: the ranks holding the same shard as this one (null without MiCS). A checkpoint's
  // optimizer shards are written by the first replica group alone (writes_optimizer_shard()).
  const std::shared_ptr<comm::Group>& replicas() const { return replicas_; }
  bool writes_optimizer_shard() const { return !replicas_ || replicas_->rank() == 0; }

  // ---- what this rank optimises ----
  // Names, shapes and flat offsets of every parameter (entries, numel); for stages 0-2 also the
  // flat parameter and gradient buffers themselves.
  const nn::FlatParameters& flat() const { return flat_; }
  // Frozen parameters (requires_grad false, e.g. LoRA's base weights): not in flat(), no gradient,
  // no optimizer state. Every stage keeps them whole on every rank in one buffer of the training
  // dtype (their entries and that buffer); stage 3 does not partition them (docs/finetuning.md:
  // the cost is 2 or 4 bytes per frozen parameter on each rank).
  const nn::FlatParameters& frozen() const { return frozen_; }
  const PartitionPlan& plan() const { return plan_; }
  int64_t optimizer_numel() const { return opt_numel_; }
  // (optimizer_numel,) fp32 master weights of this rank's range (in fp32 training, a view of the
  // parameters themselves). Undefined when the NVMe store holds them (16-bit training with
  // offload_optimizer.device = "nvme"): read them through state().
  const Tensor& master() const { return master_; }
  // Where the optimizer writes the updated parameters rounded to the training dtype (nullptr in
  // fp32 training, where master() is the parameters).
  virtual void* params16() = 0;
  // The working parameters of this rank's optimizer range when they live on a GPU (ZeRO-Offload's
  // layout: master weights and moments in host memory, the CPU optimizer, the new parameters copied
  // up); undefined when they are in host memory, where params16() / master() are them.
  virtual Tensor device_parameters() { return {}; }
  // One segment per parameter over this rank's range (numel 0 where it holds none of it): Lamb's
  // per-tensor trust ratios. The same list on every rank.
  virtual std::vector<optim::Segment> segments() const = 0;
  // Places this rank's master weights and the optimizer's moments (once, before the first step):
  // in RAM (master() and the optimizer's own buffers), or on NVMe when options().nvme_optimizer
  // is set. `log` receives the store's notices.
  void attach_optimizer(optim::Optimizer& opt, const std::function<void(const std::string&)>& log);
  // The optimizer state's home (after attach_optimizer): steps, checkpoints and statistics.
  StateStore& state() const;
  // True when the optimizer's range is a partition of the whole (per-tensor norms then need a sum
  // across ranks).
  bool partitioned() const { return partitioned_; }
  // The ranges of the flat parameter space this rank's buffers hold, for checkpoints.
  virtual std::vector<HeldRange> held_ranges() const = 0;
  virtual MemoryBytes memory() const = 0;
  // Stage 3: gathers issued ahead of use along the recorded trace (0 otherwise).
  virtual int64_t prefetched_gathers() const { return 0; }
  // Stage 3 with hpZ: gathers served from the secondary pieces within an hpZ group.
  virtual int64_t secondary_gathers() const { return 0; }
  // NVMe traffic since construction, optimizer state and parameters together: bytes moved, the
  // bytes reserved on disk, and the time the training thread waited for I/O.
  struct OffloadStats {
    int64_t bytes_read = 0, bytes_written = 0, disk_bytes = 0;
    double wait_seconds = 0;
    // Steps started during backward (strategy.h): sub-groups whose gradients were final before
    // their backward ended (the worker could take them), and those it stepped before that end.
    int64_t final_in_backward = 0, stepped_in_backward = 0;
    // Gradient bytes sent to host memory during backward (Options::download_in_backward), not
    // NVMe traffic: the model on a GPU, stages 0-2.
    int64_t grad_bytes_in_backward = 0;
  };
  virtual OffloadStats offload_stats() const;

  // ---- the step ----
  // Before the loss function runs. training = false for evaluation (no gradients; stage 3 neither
  // records nor follows its prefetch trace then); end_eval() after it.
  virtual void begin_forward(bool training) { (void)training; }
  virtual void end_eval() {}
  // Around loss.backward(): boundary says whether this micro-step ends an accumulation window;
  // ctx ("step 17") names the collectives issued during backward in timeout reports.
  virtual void begin_backward(bool boundary, const std::string& ctx) = 0;
  virtual void end_backward() = 0;
  // At the boundary: this rank's gradients, summed over ranks (times the pre-division factor), as
  // (optimizer_numel,) fp32 (in the accumulation dtype when offloaded(): no full fp32 copy). A
  // collective for stage 1 (reduce-scatter), and with expert parallelism (the dense gradients'
  // all-reduce over the expert-parallel group).
  Tensor reduced_gradients(const std::string& ctx);
  // Sum of squares of g over every rank's range (a collective when partitioned). inf/NaN on any
  // rank reaches every rank. Deterministic: fixed tiles summed in order.
  double global_sum_of_squares(const Tensor& g, const std::string& ctx);
  // Tensor parallelism beside this data-parallel group: the norm above then also sums over `tp`,
  // counting every distinct part once: Megatron's global norm. `copies` lists the parameters cut
  // over the group with the number of tp ranks that hold each one's part (1, or tp / n_kv_head
  // for K/V heads shared by several ranks: their gradients are identical there); parameters not
  // listed are whole on every tp rank (identical gradients) and count once overall. Call once,
  // before the first step.
  void set_tensor_parallel(std::shared_ptr<comm::Group> tp,
                           const std::map<std::string, int>& copies);
  // Expert parallelism (nn/expert_parallel.h; comm/topology.h, ExpertGroups): this strategy's
  // group is then the expert-data-parallel group, and `ep` the expert-parallel group beside it,
  // whose ranks hold other slices of the parameters named in `experts` and the same dense
  // parameters. The dense gradients, summed over the group, are then summed over `ep` too (one
  // all-reduce of their ranges at reduced_gradients()), every gradient is averaged over the
  // group x ep data-parallel ranks (each expert's gradient already holds every ep rank's tokens,
  // sent to it by the all-to-all), and the norm counts the dense parts once and every expert
  // slice. Call once, before the first step.
  void set_expert_parallel(std::shared_ptr<comm::Group> ep, const std::set<std::string>& experts);
  const std::shared_ptr<comm::Group>& expert_parallel() const { return ep_; }
  // Pipeline parallelism beside this data-parallel group: each stage holds different parameters,
  // so the norm above also sums over `pipe` (the stages; a tied weight is a parameter of one stage
  // only, so it counts once). Call once, before the first step.
  void set_pipeline_parallel(std::shared_ptr<comm::Group> pipe);
  // The factor that turns the reduced gradients into the average over ranks (1 / N unless the
  // reduction already divided by it); 1 while the gradient all-reduce is off.
  double grad_post_scale() const { return all_reduce_gradients_ ? grad_post_scale_ : 1.0; }
  // DeepSpeed's enable_backward_allreduce: off, the next backward leaves each rank's gradients
  // its own (the 1-bit optimizers average their momentum themselves, optim/onebit.h). Stage 0
  // only; set before begin_backward() of a step's first micro-step, and kept until changed.
  void set_gradient_all_reduce(bool on);
  bool gradient_all_reduce() const { return all_reduce_gradients_; }
  // The optimizer step on this rank's range: grads (optimizer_numel,) fp32 times grad_scale;
  // updates the master weights and params16() through state(). With NVMe offload a collective:
  // an I/O failure on any rank becomes an error on every rank.
  //
  // Stage 3 with offload steps in the background: optimizer_step() returns once the step is under
  // way; a worker thread streams the sub-groups (read, Adam, write the new parameters, zero their
  // gradients) while the next forward gathers each parameter as soon as its sub-group is written,
  // so the optimizer's I/O overlaps the forward's compute. The results are bitwise those of a
  // synchronous step. `grads` must stay untouched until synchronize(); zero_grads() then leaves
  // them to the worker. Options::overlap_step = false steps synchronously.
  void optimizer_step(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                      const std::string& ctx);

  // ---- the optimizer step during backward (stage 3 with offload) ----
  // When nothing global has to be known before the update (no gradient clipping, no fp16 loss
  // scaling: the engine decides), each sub-group can be stepped as soon as its gradients are
  // final. The boundary micro-step's backward then starts the worker: it reads sub-groups from
  // the top of the range down (the backward finalises the last layers first), steps each one once
  // its gradients are complete, and after the backward takes the rest from the bottom up (the
  // next forward needs the first layers first). The optimizer's I/O so spreads over the backward
  // and the next forward. Per-element results are bitwise those of a step after backward.
  virtual bool can_step_in_backward() const { return false; }
  // Called before begin_backward() of the boundary micro-step, with opt's learning rate set:
  // that backward starts the step (opt.begin_step() is called then). grad_scale as for
  // optimizer_step().
  void plan_step_in_backward(optim::Optimizer& opt, float grad_scale);
  // A step was started in a backward and step_in_backward_sum_of_squares() was not called since.
  bool stepping_in_backward() const;
  // After that backward: the global sum of squares of its gradients, as global_sum_of_squares()
  // (a collective), from the sub-groups' partial sums taken as each became final. The engine
  // calls it in step() in place of optimizer_step(); after_step() follows as usual.
  double step_in_backward_sum_of_squares(const std::string& ctx);
  // Waits for a background step, then raises any I/O failure of it (or of the parameter reads
  // since) on every rank. A collective when anything is offloaded (every rank calls it at the same
  // point); a no-op otherwise. Stage 3 calls it at each backward, after evaluation and before
  // gathering weights for a checkpoint; the engine before checkpoints and when training ends.
  void synchronize(const std::string& ctx);
  // Waits for a background step to end without raising its failure (destructors: the engine's,
  // before the optimizer the worker uses goes, and the strategies' own).
  void join_step() noexcept;
  // After the optimizer updated master() (and params16()): make the working parameters of every
  // rank current (stage 1-2: all-gather; stage 3: drop stale gathers). A collective when sharded.
  virtual void after_step(const std::string& ctx) = 0;
  virtual void zero_grads() = 0;

  // Keeps `param` (one of the model's trainable parameters) gathered whole on every rank from now
  // on, like a persistent one: a pipeline's tied embedding, whose weight the first stage reads
  // after every step to send it to the last. Stage 3 gathers it (a collective); the other stages
  // hold every parameter whole already.
  virtual void keep_gathered(const Tensor& param) { (void)param; }

  // ---- checkpoints and export ----
  // Every parameter whole, by name, in the training dtype. Stage 3 gathers each in turn (a
  // collective) and only rank 0 receives the list (empty elsewhere).
  virtual std::vector<std::pair<std::string, Tensor>> full_weights() = 0;
  // After master() was restored from a checkpoint: make the working parameters match. Stages 0-2
  // read them from the model file with `read_param(name, param)` (the file holds them exactly);
  // stage 3 rounds them from master() as after a step.
  virtual void load_parameters(
      const std::function<void(const std::string& name, const Tensor& param)>& read_param) = 0;

 protected:
  // replicas: MiCS's replica group (gradient averaging then counts group x replicas ranks).
  Strategy(nn::Module& model, std::shared_ptr<comm::Group> group, Options options,
           std::shared_ptr<comm::Group> replicas = nullptr);

  nn::Module& model_;
  std::shared_ptr<comm::Group> group_;
  std::shared_ptr<comm::Group> replicas_;  // MiCS; null otherwise
  std::shared_ptr<comm::Group> ep_;        // set_expert_parallel(); null otherwise
  std::vector<std::pair<int64_t, int64_t>> ep_dense_;  // dense ranges of the optimizer range
  Options options_;
  // The stage's reduction (reduced_gradients() adds the expert-parallel sum).
  virtual Tensor reduce_gradients(const std::string& ctx) = 0;
  nn::FlatParameters flat_;
  nn::FlatParameters frozen_;  // place_frozen()
  PartitionPlan plan_;
  // Moves the model's frozen parameters into frozen_ (training dtype, no gradients) and gives every
  // rank rank 0's values; called first by the stages' constructors. Throws when nothing is left to
  // train.
  void place_frozen();
  int64_t frozen_bytes() const {
    return frozen_.params.defined() ? static_cast<int64_t>(frozen_.params.nbytes()) : 0;
  }
  int64_t opt_numel_ = 0;
  Tensor master_;
  bool partitioned_ = false;  // set_partitioned()
  // Whether the optimizer range is a partition of the whole (the stages' constructors say).
  void set_partitioned(bool partitioned) {
    partitioned_ = partitioned;
    norm_.set_partitioned(partitioned);
  }
  std::unique_ptr<StateStore> store_;  // attach_optimizer()
  // The attached optimizer steps any slice of its range (Adam); whole-tensor ones (Lamb) do not.
  bool optimizer_steps_in_slices_ = false;
  // True when anything is on NVMe: the optimizer then steps sub-group by sub-group, and
  // reduced_gradients() may return the accumulation dtype (widened per sub-group).
  bool offloaded() const {
    return options_.nvme_optimizer.has_value() || options_.nvme_params.has_value();
  }
  // On the boundary micro-step's backward, with the optimizer state on NVMe: start reading the
  // first sub-groups of the coming step into the idle swap buffers (StateStore::prefetch).
  void prefetch_optimizer_state(bool boundary);
  // [begin, end) ranges of the optimizer range (this rank's) that hold the parameters named in
  // `names` (complement: every other trainable parameter).
  virtual std::vector<std::pair<int64_t, int64_t>> optimizer_ranges_of(
      const std::set<std::string>& names, bool complement) const = 0;
  // The global norm's sums over the parallel axes (set_partitioned by the stages' constructors;
  // set_tensor_parallel / set_pipeline_parallel above).
  GradNorm norm_;
  // The step with the optimizer state in host memory (RAM, or the parameters on a GPU); declared
  // after master_, whose copies to the GPU its queues carry, so that it is destroyed first.
  HostStep host_step_;
  // Parameters on NVMe (stage 3): the optimizer writes each sub-group's new parameters into
  // params_out(c) and params_written(c) sends them to disk; params_flushed() waits for all.
  virtual bool params_on_nvme() const { return false; }
  virtual void* params_out(const StateChunk& c) { return nullptr; }
  virtual void params_written(const StateChunk& c) {}
  virtual void params_flushed() {}
  // The working parameters from the master weights, sub-group by sub-group through the hooks
  // above (after a checkpoint load with parameters on NVMe).
  void write_params_from_master();
  // attach_optimizer() asks for the initial master weights of [begin, begin + numel) (ascending,
  // each element once) as the NVMe store is first written: by default a copy from master();
  // stage 3 built piecewise computes them here and writes the working parameters in the same pass,
  // so the fp32 copy never exists whole in RAM. on_attached() runs once the store is complete.
  virtual void initial_master(int64_t begin, int64_t numel, float* out);
  virtual void on_attached() {}

  // ---- the offloaded step's sub-group loop, and the background step (stage 3) ----
  // The hook: the scheduler that runs offloaded steps in the background and carries I/O failures
  // to synchronize() (src/zero/offload/step_scheduler.h). Stage 3 owns one; stages 0-2 have none
  // and step synchronously.
  virtual detail::StepScheduler* scheduler() const { return nullptr; }
  // One pass of an offloaded step over the sub-groups `order` returns (ascending when empty), on
  // the training thread, or on the worker of `background`: the Adam step of each sub-group (16-bit
  // gradients widened a tile at a time), its new parameters to params16() or, on NVMe, through
  // params_out()/params_written().
  void step_chunks(optim::Optimizer& opt, const Tensor& grads, float grad_scale,
                   const ChunkOrder& order, detail::StepScheduler* background);
  // The pass is about to step the first sub-group (stage 3: reset the parameter file's
  // written-up-to mark).
  virtual void chunks_starting() {}
  // Sub-group c was stepped and its new parameters handed to params_written(): returns the
  // [begin, end) ranges whose new parameters are readable now (those on NVMe: written to disk). On
  // the worker thread of a background step.
  virtual std::vector<std::pair<int64_t, int64_t>> chunk_stepped(const StateChunk& c) {
    return {{c.begin, c.begin + c.numel}};
  }
  // Starts the step planned by plan_step_in_backward(), if any (stage 3's begin_backward() on
  // the boundary micro-step, after synchronize()). Returns whether it started.
  bool start_planned_step(const std::string& ctx);
  // A background step was started and synchronize() has not been called since.
  bool step_pending() const;
  // Bytes of master weights held in RAM (0 in fp32 training, where they are the parameters, and
  // when the NVMe store holds them).
  int64_t master_bytes() const;
  // dst (optimizer_numel,) of the training dtype = the master weights, rounded (through state()).
  void round_master_into(const Tensor& dst);
  bool all_reduce_gradients_ = true;  // set_gradient_all_reduce()
  float comm_prescale_ = 1.0f;    // applied to gradients before a reduction
  double grad_post_scale_ = 1.0;  // folded into the optimizer's gradient scale after it
  int64_t reductions_in_flight() const { return options_.overlap_comm ? 2 : 0; }
};

// The strategy for options.stage over `group`. Moves the model's parameters into the strategy's
// buffers (flat buffers, or stage 3's released per-parameter storage) and registers the gradient
// and module hooks it needs; every rank ends with rank 0's weights. The model must outlive it.
std::unique_ptr<Strategy> make_strategy(nn::Module& model, std::shared_ptr<comm::Group> group,
                                        const Options& options);

}  // namespace ds::zero
