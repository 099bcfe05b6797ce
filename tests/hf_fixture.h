#pragma once
// Helpers the Hugging Face parity tests share (test_hf_families, test_hf_encoders, test_hf_deberta,
// test_hf_seq2seq): where a fixture case lives, the relative error they report, and catching the
// message of a ds::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ds/core/error.h"

namespace ds::testing {

// tests/fixtures/hf_families/<name> (written by the tests/fixtures/generators/gen_*_fixture.py generators).
inline std::filesystem::path case_dir(const std::string& name) {
  return std::filesystem::path(DS_FIXTURE_DIR) / "hf_families" / name;
}

// max |a - b| / max |b| (b the reference); sizes must match.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The message of the ds::Error f throws; a test failure (and "") when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ds::Error";
  return "";
}

}  // namespace ds::testing

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)
