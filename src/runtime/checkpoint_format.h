#pragma once
// What checkpoint.cpp (save/load) and checkpoint_reader.cpp (the reader that load and ds_to_fp32
// share) both use: the model file's name, text files (`latest`), the JSON metadata of safetensors
// files and typed reads of it. Internal to src/runtime. The layout itself is documented in
// checkpoint.cpp and docs/checkpoints.md.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"

namespace ds::runtime::detail {

// Model weights and engine state of a (data-parallel) checkpoint, as DeepSpeed names them.
inline constexpr const char* kModelFile = "mp_rank_00_model_states.safetensors";
// The model's buffers (Module::named_buffers: state that is not trained, such as BART's
// final_logits_bias), by name, when it has any; written by world rank 0 of a run without tensor or
// pipeline parallelism; absent in older checkpoints.
inline constexpr const char* kBuffersFile = "model_buffers.safetensors";

// The whole file as text ("" when it cannot be read; callers check existence first).
std::string read_text(const std::filesystem::path& p);
// s without leading and trailing whitespace.
std::string trim(std::string s);
// The JSON object stored under metadata `key` of r; errors start with `tag` ("[checkpoint]") and
// name the file and key.
nlohmann::json parse_metadata(const safetensors::Reader& r, const std::string& key,
                              const char* tag);
// The integer field `key` (>= 0) of the metadata object j ("where" in file), or an error in
// ds_to_fp32's wording naming file and field.
int64_t field_int(const nlohmann::json& j, const std::string& key, const std::string& file,
                  const std::string& where);
// v as 16 lowercase hex digits, as checksums.json records XXH64 values.
std::string hex64(uint64_t v);

// Typed reads of one JSON object of checkpoint metadata. A missing field or one of the wrong type
// is an error naming the file, the field and what was expected, never the JSON library's text
// (Engine::load_checkpoint's wording: "[checkpoint] file: where.key must be ...").
class Meta {
 public:
  Meta(const nlohmann::json& j, std::string file, std::string where)
      : j_(j), file_(std::move(file)), where_(std::move(where)) {}

  const nlohmann::json& field(const std::string& key) const {
    auto it = j_.find(key);
    if (it == j_.end())
      DS_THROW(
          "[checkpoint] {}: {} has no field '{}'; the checkpoint is damaged or not written by "
          "deepspeed.cpp",
          file_, where_, key);
    return *it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  // An integer >= min (step counts and sizes are never negative).
  int64_t integer(const std::string& key, int64_t min = 0) const {
    const auto& v = field(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
      bad(key, v, fmt::format("an integer >= {}", min));
    const int64_t x = v.get<int64_t>();
    if (x < min) bad(key, v, fmt::format("an integer >= {}", min));
    return x;
  }
  uint64_t unsigned64(const std::string& key) const {
    const auto& v = field(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      bad(key, v, "an integer >= 0");
    return v.get<uint64_t>();
  }
  std::string string(const std::string& key) const {
    const auto& v = field(key);
    if (!v.is_string()) bad(key, v, "a string");
    return v.get<std::string>();
  }
  Meta object(const std::string& key) const {
    const auto& v = field(key);
    if (!v.is_object()) bad(key, v, "an object");
    return Meta(v, file_, where_ + "." + key);
  }
  const nlohmann::json& array(const std::string& key) const {
    const auto& v = field(key);
    if (!v.is_array()) bad(key, v, "an array");
    return v;
  }
  const nlohmann::json& json() const { return j_; }
  [[noreturn]] void bad(const std::string& key, const nlohmann::json& v,
                        const std::string& expected) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    DS_THROW(
        "[checkpoint] {}: {}.{} must be {}, got {} ({}); the checkpoint is damaged or not "
        "written by deepspeed.cpp",
        file_, where_, key, expected, shown, v.type_name());
  }

 private:
  const nlohmann::json& j_;
  std::string file_;
  std::string where_;
};

}  // namespace ds::runtime::detail
