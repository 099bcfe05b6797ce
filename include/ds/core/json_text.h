#pragma once
// Words for JSON values in error messages, shared by the parsers of user JSON: the DeepSpeed config
// (src/config) and ds_serve's HTTP requests (src/serve/api.cpp), so that both say the same thing
// the same way: "expected an integer, got a string", "unknown field 'temprature' (did you mean
// 'temperature'?)".
//
//   json_kind(v)                 "null", "a boolean", "an integer", "a number", "a string",
//                                "an array", "an object"
//   json_show(v)                 v.dump(), cut to 60 characters ("..." at the end)
//   edit_distance(a, b)          Damerau-Levenshtein (optimal string alignment) distance
//   nearest_name(key, names)     the name a typo of `key` most likely meant, if any
//
// Pure functions; thread-safe.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds {

std::string json_kind(const nlohmann::json& v);
std::string json_show(const nlohmann::json& v);
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to key by edit distance (case-insensitive) when it is close enough to be a
// plausible typo: at most max(2, |key| / 4) edits. nullopt otherwise.
std::optional<std::string> nearest_name(std::string_view key,
                                        const std::vector<std::string>& candidates);

}  // namespace ds
