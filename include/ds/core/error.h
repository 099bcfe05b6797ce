#pragma once
// Errors: every failure is an exception whose message starts with a [tag] naming the op, backend or
// subsystem, and says what to do next. Library code never calls exit() or abort().
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ds {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ds

// DS_CHECK(cond, "[tag] format {}", args...): throw ds::Error with a formatted message when cond fails.
#define DS_CHECK(cond, ...)                                    \
  do {                                                         \
    if (!(cond)) throw ::ds::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define DS_THROW(...) throw ::ds::Error(::fmt::format(__VA_ARGS__))
