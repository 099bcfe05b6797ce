#pragma once
// One Hugging Face import and export path for every kind of model (decoder LMs in hf_io.cpp,
// encoder classifiers in encoder_io.cpp, encoder-decoders in seq2seq_io.cpp), driven by where the
// family places each of our tensors (HFPlace, ds/models/family.h). Internal to src/models: not a
// public header.
//
//   std::vector<Target> targets;                          // our tensors and their places
//   for (const auto& [ours, t] : model.named_parameters()) targets.push_back({ours, t, place(ours)});
//   ImportRules rules{.prefix = f.prefix, .describe = "a llama model (2 layers, ...)"};
//   rules.unused = [&](const std::string& key, const FileTensor& t, const FileIndex&) { ... };
//   ImportReport r = import_weights("folder", targets, rules);   // all or nothing
//
//   write_hf_folder(dir, export_tensors(named, place, DType::bf16), config_json, DType::bf16);
//
// Import reads the safetensors files of a folder (model.safetensors or the shards of its index) or
// one file, finds each target's tensor by its name without the family's prefix (optional in a
// file), stacks parts (HFPlace::parts) and transposes (HFPlace::transposed) back, converts F32 /
// BF16 / F16 to the target's dtype and checks for NaN / Inf. Nothing is written unless every
// required target has exactly one tensor of the right shape and every other file tensor is
// accounted for (ImportRules::unused); otherwise one error lists every problem.
//
// Threading: plain functions; the tensors written belong to the caller.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/safetensors.h"
#include "ds/core/tensor.h"
#include "ds/models/family.h"

namespace ds::models::detail {

// Index of the first NaN or Inf of a contiguous floating-point tensor (f32, bf16, f16), or -1.
int64_t first_non_finite(const Tensor& t);
// The safetensors files of `path`: the file itself, a folder's model.safetensors, or the shards
// its model.safetensors.index.json names (names with a path in them are refused). Throws
// "[hf_io] ..." saying what the folder holds instead.
std::vector<std::filesystem::path> weight_files(const std::filesystem::path& path);
// Writes `text` to path through a temporary in the same folder and a rename.
void write_text_atomic(const std::filesystem::path& path, const std::string& text);
// config.json's "dtype" value for a tensor dtype ("float32", "bfloat16", "float16").
const char* hf_dtype_name(DType dtype);

// One of our tensors (a parameter, or a buffer the file may hold) and its place in the file.
struct Target {
  std::string ours;
  Tensor tensor;
  HFPlace place;
  bool optional = false;  // may be absent from the file (then it keeps its value)
};

// A file tensor: which file holds it, and its entry.
struct FileTensor {
  const safetensors::Reader* reader = nullptr;
  const safetensors::Entry* entry = nullptr;
  Tensor read() const { return reader->get(entry->name); }
};
// Every file tensor by its key (its name without the family's prefix).
using FileIndex = std::map<std::string, FileTensor>;

// What a file tensor no target took is.
struct Unused {
  enum Kind { extra, ignored, problem } kind = extra;
  std::string text;  // extra: a note after the message; problem: the whole message
};

struct ImportRules {
  std::string prefix;    // the family's module prefix: optional on a file tensor's name
  std::string describe;  // the model, for the error ("a llama model (2 layers, n_embd 64, ...)")
  std::string advice = "Check that config.json describes the model these weights belong to";
  std::set<std::string> elsewhere;  // keys other pipeline stages hold: neither used nor extra
  // A file tensor no target took (key without prefix): ignored (a buffer, a tied copy), a problem,
  // or extra (the default when unset).
  std::function<Unused(const std::string& key, const FileTensor& t, const FileIndex& files)>
      unused;
  // Words added to a mis-shaped target's problem (the file's head has N labels, ...).
  std::function<std::string(const Target& t, const Shape& file_shape)> shape_note;
};

struct ImportReport {
  std::vector<std::string> files;    // safetensors files read
  int64_t tensors = 0;               // targets filled
  int64_t transposed = 0;            // of them, stored (in, out) (Conv1D)
  std::vector<std::string> ignored;  // file tensors skipped on purpose
  std::vector<std::string> missing;  // optional targets the file lacks (ours), left as they were
};

// Fills `targets` from `path` (a folder or a .safetensors file); see the file comment.
ImportReport import_weights(const std::filesystem::path& path, const std::vector<Target>& targets,
                            const ImportRules& rules);

// Our tensors by name -> the file's tensors (parts stacked, Conv1D weights transposed), in `dtype`,
// in the order of their first part. Throws naming a stacked tensor that lacks a part.
std::vector<std::pair<std::string, Tensor>> export_tensors(
    const std::vector<std::pair<std::string, Tensor>>& named,
    const std::function<HFPlace(const std::string& ours)>& place, DType dtype);

// Writes dir/model.safetensors (metadata format "pt", which transformers requires) and
// dir/config.json (`config` with "dtype" set), creating dir.
void write_hf_folder(const std::filesystem::path& dir,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     nlohmann::json config, DType dtype);

}  // namespace ds::models::detail
