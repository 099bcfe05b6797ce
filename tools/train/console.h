#pragma once
// ds_train's console: the progress bar and the permanent lines (the trainer reports, this prints).
#include <string>

namespace ds::train {

// A status line redrawn in place on a terminal (stderr), plus permanent lines (stdout). On a
// terminal a permanent line first erases the bar and the bar is redrawn after it, so the two
// never mix; off a terminal the bar is not drawn at all.
class Console {
 public:
  Console();
  bool tty() const { return tty_; }
  void bar(const std::string& text);   // replaces the status line (no-op off a terminal)
  void line(const std::string& text);  // a permanent line
  void end_bar();                      // leaves the status line as it is and moves below it
  // Ranks other than 0 print nothing (every rank runs the same loop).
  void set_quiet(bool quiet) { quiet_ = quiet; }

 private:
  bool tty_;
  bool quiet_ = false;
  std::string bar_;  // what the status line shows now ("" = nothing drawn)
};

// A bar of `width` cells for fraction f in [0, 1].
std::string bar_cells(double f, int width);

}  // namespace ds::train
