#pragma once
// DeepSpeed's flops profiler (config "flops_profiler"; deepspeed/profiling/flops_profiler): the
// parameters, MACs, FLOPs and forward latency of every module of one training forward, printed as
// DeepSpeed prints them (a summary, the top modules per depth, the module tree). The counts are
// the ops' own (ops/flop_count.h: DeepSpeed's rule per op where it has one); the backward is
// derived as DeepSpeed derives it, (2 + recompute_fwd_factor) x the forward.
//
//   FlopsProfiler p(model);
//   p.start();  Tensor loss = model.loss(batch);  p.stop();
//   std::string table = p.report(run, config.flops_profiler);
//
// The engine drives it through FlopsProfileStep (below): the first forward at global step
// `profile_step`, on global rank 0, printed at that micro-step's step() (or written to
// `output_file`).
//
// Threading: the thread that runs the forward; ops on other threads are not counted.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/config/config.h"
#include "ds/nn/module.h"
#include "ds/ops/flop_count.h"

namespace ds::runtime {

// One module of the profiled forward.
struct ModuleProfile {
  std::string name;  // "" for the root, else the path ("blocks.0.attn")
  std::string type;  // nn::Module::type_name()
  int depth = 0;     // the root is 0
  int64_t params = 0;  // parameters of the subtree (tied ones once), as module.parameters()
  ops::OpCost own;     // ops called by this module itself, outside its children
  double seconds = 0;  // wall time inside the module (children included), summed over calls
  std::vector<size_t> children;  // indices into FlopsProfiler::modules()
};

// What the summary needs from the run (DeepSpeed reads it from its engine).
struct ProfileRun {
  int64_t profile_step = 1;
  int world_size = 1;
  int dp_size = 1;
  int mp_size = 1;  // tensor-parallel size: "params of model = params per GPU * mp_size"
  int64_t micro_batch = 1;
  double fwd_seconds = 0;  // the profiled forward's wall time
  // With wall_clock_breakdown, the profiled micro-step's backward and step times: the summary
  // then adds the bwd / fwd+bwd / iteration lines, as DeepSpeed does.
  std::optional<double> bwd_seconds, step_seconds;
  double recompute_fwd_factor = 0;
};

class FlopsProfiler final : public ops::FlopSink {
 public:
  explicit FlopsProfiler(nn::Module& model);
  ~FlopsProfiler() override;
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  // Clears the counts, hooks every module and starts counting this thread's ops.
  void start();
  // Removes the hooks and stops counting (idempotent). The counts stay until the next start().
  void stop();
  bool running() const { return counting_ != nullptr; }

  // Pre-order, [0] the root. Ops called outside any module call count for the root.
  const std::vector<ModuleProfile>& modules() const { return modules_; }
  // Totals of the subtree of module i (flops, macs, gemm flops), as get_module_flops.
  ops::OpCost subtree_cost(size_t i) const;
  // DeepSpeed's module latency: its own time, or its children's sum when it has none (a list).
  double module_seconds(size_t i) const;
  ops::OpCost total() const { return subtree_cost(0); }
  // Per op name ("linear", "attention", ...), for tests and the report's footnote.
  const std::map<std::string, ops::OpCost>& by_op() const { return by_op_; }
  // Wall time from start() to stop().
  double seconds() const { return seconds_; }

  // DeepSpeed's printout: summary, aggregated profile (module_depth, top_modules) and, when
  // `detailed`, the module tree.
  std::string report(const ProfileRun& run, const config::FlopsProfilerConfig& cfg) const;

  void add(const char* op, const ops::OpCost& cost) override;  // ops::FlopSink

 private:
  void build_tree();
  std::string summary(const ProfileRun& run) const;
  std::string aggregated(int64_t module_depth, int64_t top_modules) const;
  void print_tree(size_t i, const std::string& label, int indent, std::string& out) const;

  nn::Module& model_;
  std::vector<ModuleProfile> modules_;
  std::map<const nn::Module*, size_t> index_;
  std::vector<std::pair<nn::Module*, std::vector<int>>> hooks_;
  std::vector<std::pair<size_t, double>> stack_;  // (module, start time) of the calls under way
  std::map<std::string, ops::OpCost> by_op_;
  std::unique_ptr<ops::FlopCounting> counting_;
  double started_ = 0, seconds_ = 0;
};

// The engine's side (DeepSpeed's engine.forward/step logic): profiles the first forward at global
// step profile_step on global rank 0 and prints the report once, at the step() that follows.
class FlopsProfileStep {
 public:
  FlopsProfileStep(nn::Module& model, config::FlopsProfilerConfig cfg, ProfileRun run,
                   bool wall_clock_breakdown, std::function<void(const std::string&)> log);

  // True when this forward is the one to profile (global_steps = steps completed so far).
  bool wants(int64_t global_steps) const;
  // Around the forward: starts and stops the profiler (stop also on an exception).
  class Forward {
   public:
    Forward(FlopsProfileStep* owner, int64_t global_steps);
    ~Forward();
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

   private:
    FlopsProfileStep* owner_ = nullptr;
  };
  // The profiled micro-step's backward and step times (only used with wall_clock_breakdown).
  void add_backward_seconds(double s);
  // Called at the end of step() with its wall time: prints (or writes output_file) once the
  // forward was profiled.
  void after_step(double step_seconds);
  bool done() const { return done_; }
  const FlopsProfiler& profiler() const { return profiler_; }

 private:
  FlopsProfiler profiler_;
  config::FlopsProfilerConfig cfg_;
  ProfileRun run_;
  bool wall_clock_;
  std::function<void(const std::string&)> log_;
  bool profiled_ = false, done_ = false;
  double bwd_seconds_ = 0;
};

// DeepSpeed's number formatting: 2 decimals, k/M/G/T units ("124.44 M", "2.47 GMACs", "36.5 ms").
std::string profile_number(double num, const std::string& suffix = "");

}  // namespace ds::runtime
