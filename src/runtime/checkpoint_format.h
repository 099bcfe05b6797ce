#pragma once
// What checkpoint.cpp (save/load) and consolidate.cpp (ds_to_fp32) both read from a checkpoint
// folder: the model file's name, text files (`latest`) and the JSON metadata of safetensors files.
// Internal to src/runtime. The layout itself is documented in checkpoint.cpp and
// docs/checkpoints.md.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/core/safetensors.h"

namespace ds::runtime::detail {

// Model weights and engine state of a (data-parallel) checkpoint, as DeepSpeed names them.
inline constexpr const char* kModelFile = "mp_rank_00_model_states.safetensors";

// The whole file as text ("" when it cannot be read; callers check existence first).
std::string read_text(const std::filesystem::path& p);
// s without leading and trailing whitespace.
std::string trim(std::string s);
// The JSON object stored under metadata `key` of r; errors start with `tag` ("[checkpoint]") and
// name the file and key.
nlohmann::json parse_metadata(const safetensors::Reader& r, const std::string& key,
                              const char* tag);

}  // namespace ds::runtime::detail
