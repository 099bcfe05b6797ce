#pragma once
// Model-parallel checkpoints: every parameter is keyed by its full name, and each file that holds
// a part of it says which part (docs/checkpoints.md, "Tensor- and pipeline-parallel runs").
// Internal to src/runtime: checkpoint.cpp (save / load at any layout) and consolidate.cpp
// (ds_to_fp32) share it.
//
// A part of a parameter is a Slice: the whole tensor's shape and, along at most one dimension,
// the ranges it holds (nn::TPSplit: `blocks` equal blocks each cut alike, this part holding
// [begin, end) of each). A pipeline stage holds whole parameters (a Slice with dim -1) of a subset
// of the names; a tensor-parallel rank holds cut ones. Loading at another layout is then the same
// operation everywhere: for each element a rank needs (a Slice of its own), find the file that
// holds it and where (overlap_runs), whatever (dp, pp, tp) wrote the checkpoint.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"
#include "ds/nn/tensor_parallel.h"

namespace ds::runtime::detail {

// Which part of a whole tensor a file's tensor holds; the file's tensor is its local_shape(),
// row-major, with block j of the cut dimension holding whole coordinates
// [j * full[dim] / blocks + begin, j * full[dim] / blocks + end).
struct Slice {
  Shape full;
  int dim = -1;  // -1: the whole tensor
  int64_t blocks = 1, begin = 0, end = 0;

  static Slice whole(const Shape& shape) { return Slice{shape, -1, 1, 0, 0}; }
  // The part a rank holds of a parameter whose local tensor is `local` and split `split`
  // (replicated: the whole tensor).
  static Slice of(const Shape& local, const nn::TPSplit& split);
  bool is_whole() const { return dim < 0; }
  Shape local_shape() const;
  int64_t local_numel() const;
  bool operator==(const Slice&) const = default;
  // {"shape": [...]} for a whole tensor, plus "dim", "blocks", "begin", "end" for a cut one.
  nlohmann::json to_json() const;
  // Validated: errors start with "[tag] file: where" and say what is wrong.
  static Slice from_json(const nlohmann::json& j, const std::string& file, const std::string& where,
                         const char* tag);
  std::string str() const;  // "whole (96, 32)" / "rows [0, 16) of 3 blocks of (96, 32)"
};

// Elements that `src` and `dst` (parts of the same whole tensor) both hold, as contiguous runs:
// local element offsets in src's tensor and in dst's, and a length. Ascending in dst; adjacent
// runs merged.
struct Run {
  int64_t src = 0, dst = 0, len = 0;
};
std::vector<Run> overlap_runs(const Slice& src, const Slice& dst);
// Elements both hold (no runs built).
int64_t overlap_numel(const Slice& a, const Slice& b);

// A checkpoint's parts, one per model-parallel rank (mp_rank = stage * tp + tp rank): the file
// named for messages and the slice of each parameter it holds.
struct PartIndex {
  std::string file;
  std::map<std::string, Slice> slices;
};

// Where to read each parameter from: per name, the parts (indexes into `parts`) that hold its
// distinct slices (of several identical slices, a tensor-parallel rank's copy of a whole norm or
// the two pipeline stages' copies of a tied embedding, the first) and those slices. Checks that
// every part agrees on the whole shape and that the distinct slices tile the whole tensor exactly
// (no gap, no overlap); errors start with "[tag] folder:", name the parameter and the files.
struct Source {
  size_t part = 0;
  Slice slice;
};
std::map<std::string, std::vector<Source>> plan_sources(const std::vector<PartIndex>& parts,
                                                        const std::string& folder, const char* tag);

// File names (DeepSpeed's): mp_rank_XX_model_states and [bf16_]zero_pp_rank_D_mp_rank_XX_optim
// _states, with .safetensors; XX two digits (more when mp >= 100). With expert parallelism each
// expert-parallel rank E > 0 writes its own part (dense parameters and its slice of the experts)
// under the prefix expp_rank_E_ (DeepSpeed's prefix for expert files). A checkpoint's parts are
// numbered part = mp * ep + E (ep the expert-parallel size, 1 without).
std::string model_file_name(int mp_rank, int ep_rank = 0);
std::string optim_file_name(bool bf16, int dp_rank, int mp_rank, int ep_rank = 0);
struct FileRanks {
  int dp = 0, mp = 0, ep = 0;  // dp: optimizer files only
  int part(int ep_size) const { return mp * ep_size + ep; }
};
// The ranks in a model-states file name; nullopt for any other name.
std::optional<FileRanks> parse_model_file_name(const std::string& name);
// The ranks in an optimizer file name with (bf16) or without the bf16_ prefix.
std::optional<FileRanks> parse_optim_file_name(const std::string& name, bool bf16);

// What part of each whole parameter this rank's tensor is: the tensor-parallel cuts when
// model_parallel (nn::tp_splits), and the expert-parallel slices of the stacked experts
// (nn::expert_splits, a cut of dimension 0). Parameters not listed are whole.
std::map<std::string, nn::TPSplit> part_splits(const nn::Module& model, bool model_parallel);

// Copies the runs of `runs` from src to dst (element size `es` bytes).
void copy_runs(const std::vector<Run>& runs, const void* src, void* dst, size_t es);

}  // namespace ds::runtime::detail
