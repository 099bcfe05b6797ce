#include "console.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace ds::train {

std::string bar_cells(double f, int width) {
  f = std::clamp(f, 0.0, 1.0);
  const int filled = static_cast<int>(f * width);
  return std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(width - filled), '.');
}

Console::Console() : tty_(::isatty(STDERR_FILENO) == 1) {}

void Console::bar(const std::string& text) {
  if (!tty_ || quiet_) return;
  // \x1b[K clears what a longer previous bar left on the line.
  fmt::print(stderr, "\r{}\x1b[K", text);
  std::fflush(stderr);
  bar_ = text;
}

void Console::line(const std::string& text) {
  if (quiet_) return;
  if (tty_ && !bar_.empty()) {
    fmt::print(stderr, "\r\x1b[K");
    std::fflush(stderr);
  }
  fmt::print(stdout, "{}\n", text);
  std::fflush(stdout);
  if (tty_ && !bar_.empty()) {
    fmt::print(stderr, "{}", bar_);
    std::fflush(stderr);
  }
}

void Console::end_bar() {
  if (quiet_) return;
  if (tty_ && !bar_.empty()) {
    fmt::print(stderr, "\n");
    std::fflush(stderr);
  }
  bar_.clear();
}

}  // namespace ds::train
