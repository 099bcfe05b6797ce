#pragma once
// ds_train's console and metric files for a run: what the trainer reports (train::TrainerObserver)
// printed by rank 0 ("[ds_train] " lines on stdout, the progress bar on a terminal's stderr) and
// written to the run's monitors (rank 0: DeepSpeed's csv_monitor files, TensorBoard when enabled).
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "console.h"
#include "ds/runtime/monitor_master.h"
#include "ds/train/trainer.h"

namespace ds::train {

class ProgressReport : public TrainerObserver {
 public:
  Console con;
  int64_t logging_steps = 10;  // --logging_steps, else the config's steps_per_print
  std::optional<runtime::MonitorMaster> monitor;  // opened once the run knows where it starts
  Trainer* trainer = nullptr;                     // set once built (on_step reads its numbers)
  const std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
  std::deque<double> recent;  // the last logging_steps losses, for the final report

  void message(const std::string& s) override { con.line("[ds_train] " + s); }
  void detail(const std::string& s) override { con.line(s); }
  // The metric rows, the first step's measured memory, the progress bar and, every
  // logging_steps, a line with the window's mean loss and throughput.
  void on_step(const StepReport& r) override;
  void on_eval(const EvalReport& r) override;  // metric rows and a line
  void on_save(const SaveReport& r) override;  // a line naming what rotation deleted
  void on_steps_done() override { con.end_bar(); }

 private:
  int64_t first_step_ = -1;  // the step this run started from
  double window_loss_ = 0.0, window_time_ = 0.0, train_time_ = 0.0;
  int64_t window_steps_ = 0;
};

}  // namespace ds::train
