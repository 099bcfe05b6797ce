#pragma once
// The one reader of a checkpoint folder on disk (layout: docs/checkpoints.md and checkpoint.cpp).
// Engine::load_checkpoint (resume) and CheckpointShards (ds_to_fp32) both open a checkpoint
// through it and then only do their own part: resume copies this rank's elements into the engine,
// ds_to_fp32 reassembles whole parameters.
//
//   runtime::CheckpointReader ck("out/ckpt", "", runtime::CheckpointReader::Use::Consolidate);
//   ck.folder();                       // out/ckpt/global_step200 (from out/ckpt/latest)
//   ck.verify("mp_rank_00_model_states.safetensors");  // size + XXH64 against checksums.json
//   ck.global_steps(); ck.world_size(); ck.model_config();   // the model-states file's ds_engine
//   ck.optimizer_files(bf16, ep);      // part (mp rank x ep + ep rank) -> dp rank -> file name
//
// What it owns:
//   - folder/tag resolution: `path/latest` when no tag is given (read_latest_tag), a tag that must
//     be a plain folder name, and for ds_to_fp32 also the global_step<N> folder itself;
//   - checksums.json: parsed once; verify(file) hashes a file (streaming, nothing kept) at most
//     once and compares size and XXH64;
//   - the model-states file (mp_rank_00_model_states.safetensors): verified and mapped on first
//     use; its "ds_engine" metadata read field by field, typed (a missing or mistyped field is an
//     error naming the file and the field);
//   - the names of the optimizer shard files, by model-parallel and data-parallel rank.
// Each shard's own metadata (its part's flat layout, the flat ranges it stores) and its fp32
// tensors (master weights, moments) are read and checked by src/runtime/optimizer_shard.h, for
// the same two uses; the users then take the elements they need from the read-only mappings.
//
// Errors: the two users word their errors differently (and tests and users rely on the wording),
// so the reader is opened for a Use: Resume's errors start with "[checkpoint]", Consolidate's with
// "[ds_to_fp32]" and say what to do for an offline tool (copy the file again, use another tag).
// Every error names the file.
//
// Not thread-safe; the model-states file stays mapped for the object's lifetime.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"

namespace ds::safetensors {
class Reader;
}

namespace ds::runtime {

// The checkpoint folder a path names: `path` itself when it holds mp_rank_00_model_states
// .safetensors (a global_step<N> folder); otherwise path/<tag>, with tag "" meaning the tag in
// path/latest (as Engine::load_checkpoint resolves it). Throws "[ds_to_fp32] ..." naming what is
// missing.
std::filesystem::path resolve_checkpoint_folder(const std::filesystem::path& path,
                                                const std::string& tag = "");

class CheckpointReader {
 public:
  enum class Use {
    Resume,       // Engine::load_checkpoint: dir/<tag or latest> only; "[checkpoint]" errors
    Consolidate,  // ds_to_fp32: also the tag folder itself; "[ds_to_fp32]" errors
  };
  // Resolves the folder and reads checksums.json; no other file is opened yet. `rank` >= 0 is
  // named when `path` is not a folder (with several nodes, a node-local path is the usual cause).
  CheckpointReader(const std::filesystem::path& path, const std::string& tag_name, Use use,
                   int rank = -1);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::filesystem::path& folder() const { return folder_; }  // the global_step<N> folder
  const char* tag() const;  // "[checkpoint]" or "[ds_to_fp32]", the front of every error
  Use use() const { return use_; }
  const std::filesystem::path& checksums_path() const { return sums_path_; }
  // checksums.json: a JSON object, file name -> {"bytes", "xxh64"}.
  const nlohmann::json& checksums() const { return sums_; }
  bool lists(const std::string& file) const { return sums_.contains(file); }

  // Checks the size and XXH64 of folder()/file against checksums.json (hashed once per file).
  void verify(const std::string& file);

  // The model-states file of model-parallel part 0, verified and mapped on first use.
  const safetensors::Reader& model_file();
  // Its "ds_engine" metadata (a JSON object).
  const nlohmann::json& engine_state();
  // Typed fields of ds_engine, checked on each call.
  int64_t global_steps();
  int world_size();
  int zero_stage();
  DType training_dtype();  // ds_engine.dtype: fp32, bf16 or fp16
  // ds_engine.model_parallel (tp, pp); (1, 1) when absent (a data-parallel run).
  std::pair<int, int> model_parallel();
  // ds_engine.expert_parallel.size; 1 when absent (no expert parallelism).
  int expert_parallel();
  // ds_engine.client_state (an empty object when absent).
  nlohmann::json client_state();
  // client_state.ds_train.model (ds_train stores its GPTConfig there); nullopt when absent.
  std::optional<nlohmann::json> model_config();

  // Optimizer shard files ([expp_rank_E_][bf16_]zero_pp_rank_D_mp_rank_XX_optim_states
  // .safetensors) by part (XX * ep_size + E), then dp rank: those checksums.json lists, and for
  // Consolidate also those in the folder.
  std::map<int, std::map<int, std::string>> optimizer_files(bool bf16, int ep_size = 1) const;

 private:
  // ds_engine.<key>, an integer >= 0, in the wording of use_.
  int64_t engine_int(const std::string& key);

  std::filesystem::path folder_, sums_path_;
  Use use_;
  nlohmann::json sums_;
  std::set<std::string> verified_;
  std::unique_ptr<safetensors::Reader> model_;
  nlohmann::json engine_;
};

}  // namespace ds::runtime
