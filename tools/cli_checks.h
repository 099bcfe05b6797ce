#pragma once
// Checks shared by the command lines of ds_generate and ds_serve (CLI11 validators).
#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace ds::tools {

// Every float option: nan and inf are refused, the option named by CLI11 ("--length_penalty:
// must be a finite number, got nan"). CLI::Range alone lets nan through (every comparison with
// it is false), and a nan length penalty or timeout runs on silently with nonsense. Text that is
// no number at all is left to the option's own conversion error.
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        const double v = std::strtod(s, &end);
        if (end == s || std::isfinite(v)) return {};
        return "must be a finite number, got " + text;
      },
      "FINITE", "finite");
}

}  // namespace ds::tools
