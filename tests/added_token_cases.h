#pragma once
// The cases of tests/fixtures/tokenizers/added_token_cases.json
// (tests/fixtures/generators/gen_added_token_fixtures.py): a fixture's tokenizer.json with a JSON patch that adds
// tokens with lstrip, rstrip, single_word, normalized, and for each text the ids, ids with special
// tokens and offsets `tokenizers` gives.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/data/text_tokenizer.h"

namespace ds::test {

inline const nlohmann::json& added_token_cases() {
  static const nlohmann::json j = [] {
    const auto file =
        std::filesystem::path(DS_FIXTURE_DIR) / "tokenizers" / "added_token_cases.json";
    std::ifstream in(file);
    EXPECT_TRUE(in.good()) << "missing " << file;
    return nlohmann::json::parse(in);
  }();
  return j;
}

// The patched tokenizer.json of case c (alone in folder dir, which is created).
inline nlohmann::json write_added_token_case(const nlohmann::json& c,
                                             const std::filesystem::path& dir) {
  std::ifstream in(std::filesystem::path(DS_FIXTURE_DIR) / "tokenizers" /
                   c["base"].get<std::string>() / "tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(in).patch(c["patch"]);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return j;
}

// Calls check(case, tokenizer) for every case whose name starts with prefix ("bpe_", ...); returns
// how many there were.
inline int for_each_added_token_case(
    const std::string& prefix,
    const std::function<void(const nlohmann::json&, const ds::data::TextTokenizer&)>& check) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("ds_test_added_tokens_{}_{}", getpid(), prefix);
  int n = 0;
  for (const nlohmann::json& c : added_token_cases()["cases"]) {
    const std::string name = c["name"];
    if (!name.starts_with(prefix)) continue;
    write_added_token_case(c, dir / name);
    auto tok = ds::data::load_tokenizer(dir / name);
    check(c, *tok);
    ++n;
  }
  std::filesystem::remove_all(dir);
  return n;
}

}  // namespace ds::test
