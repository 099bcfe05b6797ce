#pragma once
// ds_train's run of a task trainer (train::TaskTrainer: the classifier, the encoder-decoder): the
// console and metric files both runs share. A task run (classify_run.cpp, seq2seq_run.cpp) is its
// console class, TaskConsole<its observer> plus the on_<task>_eval lines, and a call of run_task
// with the lines that name its evaluation and export.
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "console.h"
#include "ds/runtime/monitor_master.h"
#include "ds/train/task_trainer.h"

namespace ds::train {

// What the console of a task run keeps and prints, whatever the task: "[ds_train] " lines, the
// progress bar, monitor rows of the steps (rank 0: csv_monitor, TensorBoard when enabled), a line
// every logging_steps steps.
class TaskLog {
 public:
  Console con;
  std::optional<runtime::MonitorMaster> monitor;  // opened once the run knows where it starts
  bool lead = true;                               // rank 0: prints and writes
  int64_t logging_steps = 10;  // --logging_steps, else the config's steps_per_print
  std::deque<double> recent;   // the last logging_steps losses, for the summary

  void say(const std::string& s) { con.line("[ds_train] " + s); }
  void log_step(const StepReport& r);
  void log_save(const SaveReport& r);

 private:
  double window_loss_ = 0.0, window_time_ = 0.0;
  int64_t window_steps_ = 0;
};

// A task's observer (ClassifierObserver, Seq2SeqObserver) printing through a TaskLog; the task's
// console adds its on_<task>_eval.
template <class Observer>
class TaskConsole : public Observer, public TaskLog {
 public:
  void message(const std::string& s) override { say(s); }
  void detail(const std::string& s) override { con.line(s); }
  void on_step(const StepReport& r) override { log_step(r); }
  void on_save(const SaveReport& r) override { log_save(r); }
  void on_steps_done() override { con.end_bar(); }
};

// Before the trainer is built: rank 0 prints, the plan's notes, `run_line` (what kind of run this
// is), the DeepSpeed config and its effective values.
void start_task_log(TaskLog& log, const TaskPlan& plan, const std::string& run_line);

// The task's parts of a run.
struct TaskRunText {
  // --eval_only: evaluates and prints the result (throws without evaluation examples).
  std::function<void()> eval_only;
  // After fit: writes eval_results.json in the output folder (rank 0) and says so, when the run
  // evaluated.
  std::function<void(const std::filesystem::path& out_dir)> final_eval;
  // The closing line about the export at `dir`.
  std::function<std::string(const std::string& dir)> export_line;
};

// The run after the trainer is built: resume, the monitors, then --eval_only, or fit, the
// export and the closing lines. Returns the exit status.
int run_task(TaskLog& log, TaskTrainer& trainer, const TaskPlan& plan, const TaskRunText& text);

}  // namespace ds::train
