#pragma once
// Internal to src/data: the field checks every tokenizer.json parser shares (pipeline, normalizers,
// pre-tokenizers, post-processors, the models). Every error names the file and the field, and an
// option we do not implement is an error, never ignored.
#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::data::detail {

// j["type"], or "?" when j is not an object with a string type.
inline std::string json_type(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// Every key of object j must be in allowed. loader names the loader ("BPE", "WordPiece", ...).
inline void check_keys(const nlohmann::json& j, std::initializer_list<std::string_view> allowed,
                       const std::string& field, const std::filesystem::path& file,
                       std::string_view loader) {
  DS_CHECK(j.is_object(), "[tokenizer] '{}': {} must be an object", file.string(), field);
  for (const auto& [key, value] : j.items())
    DS_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(),
             "[tokenizer] '{}': {}.{} is not supported by the {} loader (supported keys: {}); "
             "remove it or convert the tokenizer",
             file.string(), field, key, loader, fmt::join(allowed, ", "));
}

// j[key] as a boolean; fallback when it is missing or null.
inline bool json_bool(const nlohmann::json& j, const char* key, bool fallback,
                      const std::string& field, const std::filesystem::path& file) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  DS_CHECK(j[key].is_boolean(), "[tokenizer] '{}': {}.{} must be true or false", file.string(),
           field, key);
  return j[key].get<bool>();
}

// A {"type": "Sequence", key: [...]}: calls each(item, "field.key[k]") for its items in order.
template <class Each>
void for_each_in_sequence(const nlohmann::json& j, const char* key, const std::string& field,
                          const std::filesystem::path& file, std::string_view loader, Each&& each) {
  check_keys(j, {"type", key}, field, file, loader);
  DS_CHECK(j.contains(key) && j[key].is_array(), "[tokenizer] '{}': {}.{} must be an array",
           file.string(), field, key);
  for (size_t k = 0; k < j[key].size(); ++k)
    each(j[key][k], fmt::format("{}.{}[{}]", field, key, k));
}

}  // namespace ds::data::detail
