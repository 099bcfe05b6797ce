#pragma once
// DeepSpeed's zero_to_fp32 for our checkpoints (docs/checkpoints.md): the fp32 master weights of a
// checkpoint written by any world size, ZeRO stage and tensor-parallel size, reassembled offline
// into whole parameters by name. Used by the ds_to_fp32 tool.
//
//   runtime::CheckpointShards ck("out/ckpt");  // a run folder ('latest') or a tag folder
//   ck.write_safetensors("model.safetensors", DType::f32);  // streamed, one parameter at a time
//   auto weights = ck.weights(DType::bf16);  // whole model in memory (HF export)
//
// What is read: every optimizer shard's "fp32_master" tensor (never the moments), through the
// read-only mapping of the safetensors reader, piece by piece at the offsets its "segments" give.
// Every shard holds fp32 master weights whatever the training dtype (in fp32 training they are the
// weights themselves, and the model-states file holds the same values), so the shards are the one
// source. The model-states file gives only metadata (step, world size, stage, the model config).
// A tensor-parallel checkpoint has one set of shards per model-parallel part (mp_rank_XX); each
// whole parameter is then read from the slices its parts record (param_slices), run by run,
// still without holding it whole.
//
// Checks, before anything is written: the size and XXH64 of every file read against
// checksums.json (the whole file is hashed, streaming: one read of each shard, nothing kept;
// through runtime::CheckpointReader, which also resolves the folder and reads the model-states
// metadata, as for Engine::load_checkpoint), that the shards are exactly ranks 0..P-1 of the
// partition count they record (per model-parallel part), that they agree on the parameter names,
// shapes, offsets and slices, that their segments cover every element of every parameter, and that
// the parts' slices tile every whole parameter.
// Every error starts with "[ds_to_fp32]", names the file and says what to do.
//
// Memory: write_safetensors holds one conversion buffer of at most 1 Mi elements; the rest is the
// page cache of the mapped master weights, released by the kernel as needed (never the moments:
// they are not touched except by the checksum). weights() holds the whole model in the output
// dtype, as an HF export needs it (models::export_hf takes whole named weights).
//
// Not thread-safe; the object keeps the shards mapped for its lifetime.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"
#include "ds/runtime/checkpoint_reader.h"  // resolve_checkpoint_folder

namespace ds::runtime {

struct ShardedParameter {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in the unpadded flat parameter space (of the whole model)
  int64_t numel = 0;
};

class CheckpointShards {
 public:
  // Opens and verifies the checkpoint (see above); nothing is written.
  explicit CheckpointShards(const std::filesystem::path& path, const std::string& tag = "");
  ~CheckpointShards();
  CheckpointShards(const CheckpointShards&) = delete;
  CheckpointShards& operator=(const CheckpointShards&) = delete;

  const std::filesystem::path& folder() const { return folder_; }  // the global_step<N> folder
  const std::vector<ShardedParameter>& parameters() const { return params_; }  // flat order
  int64_t numel() const { return numel_; }
  int world_size() const { return world_size_; }  // of the run that wrote it
  int zero_stage() const { return zero_stage_; }
  // The model-parallel layout that wrote it (1 and 1 for a data-parallel run).
  int tensor_parallel() const { return tensor_parallel_; }
  int pipeline_parallel() const { return pipeline_parallel_; }
  int expert_parallel() const { return expert_parallel_; }
  int64_t global_steps() const { return global_steps_; }
  DType training_dtype() const { return training_dtype_; }
  const std::vector<std::string>& shard_files() const { return shard_files_; }
  // client_state.ds_train.model of the model-states file (ds_train stores its GPTConfig there);
  // nullopt when the checkpoint was written by other code.
  const std::optional<nlohmann::json>& model_config() const { return model_config_; }
  // client_state.ds_train.labels: a classifier run's label names in class-id order (the set's:
  // "0", "1" or ds_prepare --labels / the records' names); empty for other runs.
  const std::vector<std::string>& label_names() const { return label_names_; }
  // The model's buffers saved beside the weights (model_buffers.safetensors: BART's
  // final_logits_bias), by name, as stored; empty when the checkpoint has none (older ones).
  const std::vector<std::pair<std::string, Tensor>>& buffers() const { return buffers_; }

  // Parameter `index` (flat order) in fp32, exactly the master weights: (shape).
  Tensor parameter(size_t index) const;
  // Every parameter by name, converted to dtype (round to nearest even for bf16 and fp16).
  std::vector<std::pair<std::string, Tensor>> weights(DType dtype = DType::f32) const;
  // One safetensors file with every parameter by our names in `dtype`, metadata "format": "pt"
  // and "ds_to_fp32" (source folder, step, world size, stage). Atomic (temporary name + rename).
  // Returns the bytes written.
  uint64_t write_safetensors(const std::filesystem::path& file, DType dtype = DType::f32) const;

 private:
  struct Shard;  // one mapped optimizer file
  struct Piece {
    int64_t flat_begin = 0, flat_end = 0;  // elements of the flat parameter space
    size_t shard = 0;
    int64_t offset = 0;  // element offset in the shard's fp32_master
  };
  // Copies flat elements [begin, begin + n) of model-parallel part `part` into dst (fp32).
  void read_flat(size_t part, int64_t begin, int64_t n, float* dst) const;
  // Elements [at, at + n) of whole parameter `index` (row-major) into dst (fp32).
  void read_parameter(size_t index, int64_t at, int64_t n, float* dst) const;
  // A whole parameter's elements [dst, dst + len) are part `part`'s flat [src, src + len).
  struct ParamRun {
    size_t part = 0;
    int64_t src = 0, dst = 0, len = 0;
  };
  // The constructor's steps (consolidate.cpp): the engine record and buffers; one model-parallel
  // part's shards (their pieces, checked to tile the part once, and its parameters); the whole
  // parameters of several parts.
  struct PartLayout;
  void read_record(CheckpointReader& ckpt);
  void read_part(CheckpointReader& ckpt, int mp, const std::map<int, std::string>& by_dp,
                 PartLayout& layout);
  void place_whole_parameters(const std::vector<PartLayout>& layouts);

  std::filesystem::path folder_;
  std::vector<ShardedParameter> params_;
  int64_t numel_ = 0;
  int world_size_ = 1, zero_stage_ = 0, tensor_parallel_ = 1, pipeline_parallel_ = 1,
      expert_parallel_ = 1;
  int64_t global_steps_ = 0;
  DType training_dtype_ = DType::f32;
  std::vector<std::string> shard_files_;
  std::optional<nlohmann::json> model_config_;
  std::vector<std::string> label_names_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::unique_ptr<Shard>> shards_;
  // Per model-parallel part: sorted by flat begin; cover the part's [0, numel) exactly.
  std::vector<std::vector<Piece>> part_pieces_;
  // Per parameter, with several parts: where its elements are, ascending in the whole tensor
  // (empty with one part: parameters are then read at their own flat offsets).
  std::vector<std::vector<ParamRun>> runs_;
};

}  // namespace ds::runtime
