#pragma once
// Optimizer state that differs on every data-parallel rank (the 1-bit optimizers' error
// feedback, optim/onebit.h): each rank writes its own file into the checkpoint folder,
//   onebit_dp_rank_<dp>_mp_rank_<mp:02>_error_feedback.safetensors
// holding its rank_state_buffers() by name, with the world size and the optimizer's name in the
// metadata. Internal to src/runtime (save in checkpoint.cpp, load in checkpoint_load.cpp).
#include <filesystem>
#include <string>

#include "ds/optim/optimizer.h"

namespace ds::runtime::detail {

std::string rank_state_file_name(int dp_rank, int mp_rank);

// Writes opt's per-rank state into `folder` when it has any (a CompressedOptimizer); else nothing.
void save_rank_state(optim::Optimizer& opt, const std::filesystem::path& folder, int dp_rank,
                     int mp_rank, int world_size);

// Restores opt's per-rank state from `folder`. When the file is missing or was written by another
// number of ranks, the state is reset to zeros, as DeepSpeed does at every load, and the returned
// line says so ("" otherwise, and for optimizers without such state).
std::string load_rank_state(optim::Optimizer& opt, const std::filesystem::path& folder, int dp_rank,
                            int mp_rank, int world_size);

}  // namespace ds::runtime::detail
