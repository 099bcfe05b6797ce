#pragma once
// DeepSpeed JSON configuration: parsing, validation, "auto" resolution and the effective-config
// report. A DeepSpeed config file works unchanged; the differences from DeepSpeed's own parser are
// deliberate and listed in docs/config.md:
//   - an unknown key anywhere is an error naming its JSON path and the nearest valid key;
//   - a key DeepSpeed knows but deepspeed.cpp does not implement yet is accepted with one warning;
//   - a wrong type or an out-of-range value is an error naming key, value and what is allowed;
//   - an "auto" that nothing resolved is an error naming the key.
//
// Typical use (rank 0 prints the report, every rank parses):
//
//   ds::config::ConfigContext ctx;
//   ctx.world_size = group.size();
//   ctx.args.learning_rate = 3e-4;          // only the arguments the user actually gave
//   ctx.hidden_size = model.hidden_size();  // fills the hidden-size based "auto" keys
//   auto cfg = ds::config::parse_config("ds_config.json", ctx);
//   if (rank == 0) { print_config_warnings(cfg); fmt::print("{}", format_effective_config(cfg)); }
//
// Nothing here touches tensors: the config is plain data that the engine reads.
#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/dtype.h"
#include "ds/io/aio.h"
#include "ds/zero/defaults.h"

namespace ds::config {

// ---------------------------------------------------------------------------------------------
// Inputs besides the file

// The training program's own arguments, in the Hugging Face Trainer convention. Only arguments the
// user actually set should be filled: each one both resolves the matching "auto" keys and is
// checked against explicit (non-auto) values, a contradiction being an error.
struct TrainerArgs {
  std::optional<int64_t> per_device_train_batch_size;  // -> train_micro_batch_size_per_gpu
  std::optional<int64_t> gradient_accumulation_steps;  // -> gradient_accumulation_steps
  std::optional<double> learning_rate;  // -> optimizer.params.lr, scheduler.params.warmup_max_lr
  std::optional<double> adam_beta1;     // -> optimizer.params.betas[0]
  std::optional<double> adam_beta2;     // -> optimizer.params.betas[1]
  std::optional<double> adam_epsilon;   // -> optimizer.params.eps
  std::optional<double> weight_decay;   // -> optimizer.params.weight_decay
  std::optional<double> max_grad_norm;  // -> gradient_clipping
  std::optional<int64_t> warmup_steps;  // -> scheduler.params.warmup_num_steps
  std::optional<int64_t> total_steps;   // -> scheduler.params.total_num_steps (optimizer steps)
  std::optional<bool> fp16;             // -> fp16.enabled
  std::optional<bool> bf16;             // -> bf16.enabled
  // The model-parallel sizes of the job (ds_train's --tensor_parallel_size and
  // --pipeline_parallel_size): they set tensor_parallel.autotp_size and pipeline.stages when the
  // file leaves them open (absent, "auto", autotp_size 0 or 1) and must equal them otherwise.
  std::optional<int> tensor_parallel_size;    // -> tensor_parallel.autotp_size
  std::optional<int> pipeline_parallel_size;  // -> pipeline.stages
  // ds_train's --expert_parallel_size: sets expert_parallel (enabled, autoep_size) when the file
  // leaves it off and must equal autoep_size otherwise.
  std::optional<int> expert_parallel_size;  // -> expert_parallel.autoep_size
};

// Everything parse_config needs besides the JSON text.
struct ConfigContext {
  int world_size = 1;  // N: data-parallel ranks, used by the batch-size rules (§2)
  TrainerArgs args;
  // The model's hidden size H; fills reduce_bucket_size = H*H and, under stage 3,
  // stage3_prefetch_bucket_size = 0.9*H*H and stage3_param_persistence_threshold = 10*H.
  std::optional<int64_t> hidden_size;
  // Names the config in messages when it is given as a JSON string (a path names itself).
  std::string source_name;
};

// ---------------------------------------------------------------------------------------------
// The typed config. Field names are DeepSpeed's key names; defaults are DeepSpeed's (§1).

struct BatchConfig {
  int64_t train_batch_size = 0;                // = micro * gas * world_size, always set after parse
  int64_t train_micro_batch_size_per_gpu = 0;  // per rank, per forward/backward
  int64_t gradient_accumulation_steps = 0;
  int world_size = 1;  // the N the three were checked against
};

struct FP16Config {
  bool enabled = false;
  double loss_scale = 0.0;       // 0 = dynamic scaling, > 0 = this static scale
  int initial_scale_power = 16;  // dynamic scaling starts at 2^initial_scale_power
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool auto_cast = false;
  bool fp16_master_weights_and_grads = false;  // accepted, not implemented (warns)
  bool dynamic() const { return loss_scale == 0.0; }
};

struct BF16Config {
  bool enabled = false;
  bool immediate_grad_update = true;
};

enum class OptimizerType {
  None,  // no "optimizer" section: the program supplies its own
  Adam,
  AdamW,
  Lamb,
  SGD,
  Adagrad,
  Lion,
  Muon,         // DeepSpeed's MuonWithAuxAdam: Muon for hidden 2-D matrices, AdamW for the rest
  OneBitAdam,   // optim/onebit.h (ZeRO stage 0 only)
  ZeroOneAdam,  // optim/onebit.h (ZeRO stage 0 only)
  OneBitLamb,   // optim/onebit.h (ZeRO stage 0 only)
  // muP (optim/mup.h): width multipliers from the program's base shapes.
  MuAdam,
  MuAdamW,
  MuSGD,
};
std::string_view optimizer_type_name(OptimizerType t);

// One struct for every optimizer type; only the keys valid for `type` may appear in the file
// (anything else is an unknown-key error), the rest keep their defaults.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::None;
  double lr = 1e-3;  // Adagrad's default is 1e-2
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;  // Adagrad's default is 1e-10
  double weight_decay = 0.0;
  bool bias_correction = true;
  // Decoupled weight decay. True by default, so "type": "Adam" means AdamW unless the file says
  // "adam_w_mode": false; always true for AdamW.
  bool adam_w_mode = true;
  bool torch_adam = false;  // accepted and ignored (selects a reference implementation)
  bool fp32_optimizer_states = true;
  double max_coeff = 10.0;  // Lamb, OneBitLamb trust-ratio bounds
  double min_coeff = 0.01;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  double lr_decay = 0.0;  // Adagrad
  double initial_accumulator_value = 0.0;
  // Muon (its defaults: momentum 0.95, betas (0.9, 0.95), eps 1e-10). < 0: not in the file.
  double muon_lr = -1.0;
  double adam_lr = -1.0;
  bool lr_given = false;  // "lr" was in the file (Muon's groups then default to it)
  std::string ns_method = "gram";
  // One-bit family: freeze_step (OneBitAdam, OneBitLamb); cuda_aware and comm_backend_name are
  // accepted and mean nothing here (the compressed all-reduce runs over comm::Group).
  int64_t freeze_step = 100000;
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";
  nlohmann::json extra_params = nlohmann::json::object();  // other one-bit keys, verbatim
  bool legacy_fusion = false;
};

enum class SchedulerType { None, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest };
std::string_view scheduler_type_name(SchedulerType t);

enum class WarmupType { Log, Linear };

struct WarmupLRParams {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
};
struct WarmupDecayLRParams {
  int64_t total_num_steps = 0;  // required
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
};
struct WarmupCosineLRParams {
  int64_t total_num_steps = 0;  // required
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::Log;
};
struct OneCycleParams {
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 2000;  // defaults to cycle_first_step_size; may be 0
  // Stairs per half cycle: lr and momentum hold flat over each of that many equal pieces of the
  // half (DeepSpeed 0.19 semantics); 0 moves them every step. The second defaults to the first.
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = 0;
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};
struct LRRangeTestParams {
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::None;  // None: constant lr (the optimizer's)
  // Holds the alternative matching `type` (std::monostate for None).
  std::variant<std::monostate, WarmupLRParams, WarmupDecayLRParams, WarmupCosineLRParams,
               OneCycleParams, LRRangeTestParams>
      params;
  int64_t last_batch_iteration = -1;  // DeepSpeed's resume argument; -1 = start
};

enum class OffloadDevice { None, CPU, NVMe };
std::string_view offload_device_name(OffloadDevice d);

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  bool pin_memory = false;
  int64_t buffer_count = zero::defaults::kOptimizerBufferCount;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;  // fraction of optimizer state offloaded (< 1 only under stage 3)
  // deepspeed.cpp's own keys (DeepSpeed has none of them and refuses them here): how the step is
  // scheduled when anything is on NVMe (zero::Options, docs/offload.md).
  bool overlap_step = true;          // stage 3: step on a worker while the next forward runs
  bool step_in_backward = true;      // ... from the boundary backward on (no clipping, no fp16)
  bool prefetch_in_backward = true;  // read the next step's first sub-groups during backward
  // The model on a GPU, stages 0-2: gradients go to host memory during backward as they become
  // final (zero::Options::download_in_backward).
  bool download_in_backward = true;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  bool pin_memory = false;
  int64_t buffer_count = zero::defaults::kParamBufferCount;
  int64_t buffer_size = zero::defaults::kParamBufferSize;
  int64_t max_in_cpu = zero::defaults::kParamMaxInCpu;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = zero::defaults::kReduceBucketSize;  // elements
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = zero::defaults::kAllgatherBucketSize;
  bool overlap_comm = false;  // default: true for stage 3, false otherwise
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  OffloadOptimizerConfig offload_optimizer;  // device None = not offloaded
  OffloadParamConfig offload_param;          // stage 3 only
  int64_t sub_group_size = zero::defaults::kSubGroupSize;
  // Stage 3 (each also accepted without the stage3_ prefix).
  int64_t stage3_prefetch_bucket_size = zero::defaults::kPrefetchBucketSize;
  int64_t stage3_param_persistence_threshold = zero::defaults::kParamPersistenceThreshold;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = zero::defaults::kMaxLiveParameters;
  int64_t stage3_max_reuse_distance = zero::defaults::kMaxReuseDistance;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t stage3_module_granularity_threshold = 0;
  bool stage3_use_all_reduce_for_fetch_params = false;
  bool ignore_unused_parameters = true;
  bool legacy_stage1 = false;
  bool round_robin_gradients = false;
  // ZeRO++ (accepted, not implemented).
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  nlohmann::json zeropp_loco_param;  // null unless given
  // MiCS and engine tuning knobs (accepted, not implemented).
  int64_t mics_shard_size = -1;
  bool mics_hierarchical_params_gather = false;
  bool memory_efficient_linear = true;
  bool pipeline_loading_checkpoint = false;
  bool override_module_apply = true;
  bool log_trace_cache_warnings = false;
  bool save_muon_momentum_buffer_in_memory = false;  // Muon with NVMe (refused): no effect here
};

// The aio section; its defaults are io::AioOptions' (DeepSpeed's).
struct AioConfig {
  int64_t block_size = io::AioOptions{}.block_size;
  int64_t queue_depth = io::AioOptions{}.queue_depth;
  int64_t intra_op_parallelism = io::AioOptions{}.threads;  // old name: thread_count
  bool single_submit = io::AioOptions{}.single_submit;
  bool overlap_events = io::AioOptions{}.overlap_events;
  bool use_gds = false;
  bool use_direct_io = io::AioOptions{}.use_direct_io;  // deepspeed.cpp's own key: O_DIRECT swaps
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

enum class TagValidation { Warn, Ignore, Fail };

struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::Warn;
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;  // "parallel_write": {"pipeline_stage": ...}
};

// tensorboard and csv_monitor share this shape (ds/runtime/monitor_master.h writes them).
struct FileMonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};
struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project = "deepspeed";
};
struct CometConfig {
  bool enabled = false;
  int64_t samples_log_interval = 100;
  std::optional<std::string> project, workspace, api_key, experiment_name, experiment_key, mode;
  std::optional<bool> online;
};
// wandb and comet have no C++ client (docs/config.md, "Monitors"): "enabled": true is an error
// whose text is this, for `section` "wandb" or "comet"; it names TensorBoard and csv_monitor as
// the alternatives (and, for W&B, `wandb sync --sync-tensorboard`). ds_train's --report_to wandb
// says the same.
std::string unavailable_monitor_message(std::string_view section);

struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  int64_t profile_step = 1;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  bool detailed = true;
  std::optional<std::string> output_file;
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  std::vector<std::string> prof_ops;
  bool debug = false;
};

struct DataTypesConfig {
  std::optional<ds::DType> grad_accum_dtype;  // null = the training dtype
};

// Where an effective value came from.
enum class Origin {
  Default,  // DeepSpeed's default
  File,     // written in the config
  Auto,     // "auto" filled from the trainer's arguments or the model
  Derived,  // computed from other values (batch triad, dtype defaults, ...)
};
std::string_view origin_name(Origin o);

// One line of the effective-config report.
struct ConfigValue {
  std::string path;      // JSON path, e.g. "zero_optimization.stage"
  nlohmann::json value;  // the effective value
  Origin origin = Origin::Default;
  std::string note;  // why (e.g. "trainer learning_rate", "= 32 // 4 // 2", "old spelling ...")
};

// "tensor_parallel": {"autotp_size": N}. The batch sizes count data-parallel ranks only
// (ConfigContext::world_size = world / (tp * pp)); the engine checks that its topology has this
// tensor-parallel size (docs/parallelism.md).
struct TensorParallelConfig {
  int size = 1;  // autotp_size; 0 and 1 both mean off
};

// "expert_parallel" (DeepSpeed 0.19's AutoEP, deepspeed/module_inject/auto_ep_config.py): the
// experts of every MoE layer split over autoep_size consecutive data-parallel ranks
// (nn/expert_parallel.h). The model's MoE layers come from its family (Mixtral, Qwen3-MoE), so
// the keys by which AutoEP finds them in a PyTorch model are accepted with a warning.
struct ExpertParallelConfig {
  bool enabled = false;
  int size = 1;               // autoep_size; the effective degree (1 when not enabled)
  std::string preset_model;   // "", "mixtral", "qwen2_moe" or "qwen3_moe" (ds_train checks it)
};

// "pipeline" (DeepSpeed's deepspeed/runtime/config.py, get_pipeline_config). DeepSpeed parses
// stages and partition but takes the degree and method from PipelineModule's arguments; here they
// mean what they say: ds_train's --pipeline_parallel_size must agree with stages, and partition
// picks runtime::partition_layers' method. The batch sizes count data-parallel ranks only
// (world / (tp * pp)).
struct PipelineConfig {
  int stages = 0;                         // "auto" (DeepSpeed's default) = 0: from the job
  std::string partition = "parameters";   // "parameters", "uniform", "type:<regex>"
  int activation_checkpoint_interval = 0;  // > 0: checkpoint runs of this many layers
  bool pipe_partitioned = true;  // accepted: activations travel whole here (docs/parallelism.md)
  bool grad_partitioned = true;
};

struct DeepSpeedConfig {
  BatchConfig batch;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  double gradient_clipping = 0.0;  // 0 = off
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // The dtype of gradient reductions; resolved when not given: fp16/bf16 when that is on, else
  // fp32.
  ds::DType communication_data_type = ds::DType::f32;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  bool memory_breakdown = false;
  bool dump_state = false;

  FP16Config fp16;
  BF16Config bf16;
  DataTypesConfig data_types;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  FileMonitorConfig tensorboard;
  FileMonitorConfig csv_monitor;
  WandbConfig wandb;
  CometConfig comet;
  FlopsProfilerConfig flops_profiler;
  CommsLoggerConfig comms_logger;
  TensorParallelConfig tensor_parallel;
  PipelineConfig pipeline;
  ExpertParallelConfig expert_parallel;

  // The training dtype implied by fp16/bf16.
  ds::DType training_dtype() const {
    return fp16.enabled ? ds::DType::f16 : bf16.enabled ? ds::DType::bf16 : ds::DType::f32;
  }
  bool zero_enabled() const { return zero_optimization.stage > 0; }

  std::string source;                  // the path, or ConfigContext::source_name
  std::vector<std::string> warnings;   // one per accepted-but-unimplemented or deprecated key
  std::vector<ConfigValue> effective;  // every value with its origin, in file order of sections
  const ConfigValue* find(std::string_view path) const;  // nullptr when the path is unknown
};

// ---------------------------------------------------------------------------------------------
// Entry points

// Parses a config given as a path to a JSON file or as a JSON text (anything whose first
// non-blank character is '{'). Comments (// and /* */) and trailing commas are allowed.
// Throws ds::Error ("[config] ...") on any violation of the rules above or of §2 (batch sizes).
DeepSpeedConfig parse_config(const std::string& path_or_json, const ConfigContext& ctx = {});

// The same, for an already parsed JSON object; `ctx.source_name` names it in messages.
DeepSpeedConfig parse_config_json(const nlohmann::json& root, const ConfigContext& ctx = {});

// What a trainer must know before it can parse a config once (ds::train::plan_run): the
// model-parallel sizes, because the batch rules count data-parallel ranks, ctx.world_size =
// ranks / (tp x pp); and the batch sizes, because a run length in epochs fills
// scheduler.params.total_num_steps from train_batch_size. Each reads only its sections, with the
// same readers, checks and messages as parse_config_json (which still checks the whole file).
struct ParallelSizes {
  TensorParallelConfig tensor_parallel;  // as the file says (size 1 when absent or off)
  PipelineConfig pipeline;               // stages 0 when absent or "auto"
};
ParallelSizes read_parallel_sizes(const nlohmann::json& root, const std::string& source_name);
// The batch triad resolved against ctx (its "auto" values from ctx.args, then §2's rules).
BatchConfig resolve_batch_sizes(const nlohmann::json& root, const ConfigContext& ctx);

// Lenient JSON loading alone: path or JSON text -> object, comments and trailing commas allowed.
// Syntax errors name the source, line and column. `source` receives the name used in messages.
nlohmann::json load_config_json(const std::string& path_or_json, std::string* source = nullptr);

// Removes commas that are followed (after blanks and comments) by '}' or ']', leaving strings
// and comments untouched. Exposed for tests.
std::string strip_trailing_commas(std::string_view text);

// The effective config as a readable table: one line per value, "path  value  origin (note)".
std::string format_effective_config(const DeepSpeedConfig& cfg);

// Writes each warning on its own line (e.g. to stderr on rank 0).
void print_config_warnings(const DeepSpeedConfig& cfg, std::FILE* out = stderr);

// Damerau-Levenshtein (optimal string alignment) distance; exposed for tests.
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace ds::config
