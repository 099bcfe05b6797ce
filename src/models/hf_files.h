#pragma once
// File handling shared by the Hugging Face importers and exporters (hf_io.cpp for models::GPT,
// encoder_io.cpp for models::EncoderClassifier). Internal to src/models: not a public header.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::models::detail {

// Index of the first NaN or Inf of a contiguous floating-point tensor (f32, bf16, f16), or -1.
int64_t first_non_finite(const Tensor& t);
// The safetensors files of `path`: the file itself, a folder's model.safetensors, or the shards
// its model.safetensors.index.json names (names with a path in them are refused). Throws
// "[hf_io] ..." saying what the folder holds instead.
std::vector<std::filesystem::path> weight_files(const std::filesystem::path& path);
// Writes `text` to path through a temporary in the same folder and a rename.
void write_text_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace ds::models::detail
