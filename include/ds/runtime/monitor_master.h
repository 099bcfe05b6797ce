#pragma once
// The monitors of a run, from the DeepSpeed config (DeepSpeed's MonitorMaster,
// deepspeed/monitor/monitor.py): write_events goes to each monitor the config enables, on rank 0.
//
//   tensorboard  TensorBoardMonitor (ds/runtime/tensorboard_monitor.h) under
//                <output_path>/<job_name>/, when tensorboard.enabled (or --report_to tensorboard)
//   csv_monitor  CsvMonitor (ds/runtime/monitor.h) under <output_path>/<job_name>/, when
//                csv_monitor.enabled (or --report_to csv); otherwise under <default_root>/metrics:
//                the CSV files are always written, they are ds_train's record of the run (its
//                loss picture and resume read them)
//   wandb, comet refused by the config parse (config::unavailable_monitor_message)
//
// An empty output_path means default_root (ds_train: --output_dir; DeepSpeed: the working
// folder). Extra sections from ds_train's --report_to only add monitors: they never turn off a
// section the config enables (the Hugging Face Trainer's report_to and DeepSpeed's monitors are
// independent in the same way).
//
// Ownership and threading: the master owns its monitors; write_events is not thread-safe. Every
// rank may construct one (the CSV files are read on every rank at resume), but only the lead
// (rank 0) opens a TensorBoard file and writes.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/runtime/monitor.h"
#include "ds/runtime/tensorboard_monitor.h"

namespace ds::config {
struct DeepSpeedConfig;
}

namespace ds::runtime {

// ds_train's --report_to (the Hugging Face Trainer's flag) as the sections it turns on.
struct ReportTo {
  bool tensorboard = false;
  bool csv = false;
};

// Values, each a name or a comma list: "tensorboard", "csv", "all" (both: every monitor
// deepspeed.cpp has, as the Trainer's "all" means every installed integration) and "none"
// (nothing added; alone only). "wandb" and "comet_ml" (or "comet") throw with
// config::unavailable_monitor_message; other names throw listing the allowed values.
ReportTo parse_report_to(const std::vector<std::string>& values);

struct MonitorSetup {
  std::filesystem::path default_root;  // where an empty output_path writes
  std::optional<int64_t> resumed_at;   // a resumed run: the global samples of its checkpoint
  bool lead = true;                    // rank 0: opens the TensorBoard file and writes
  ReportTo report_to;                  // sections enabled on top of the config
};

class MonitorMaster : public Monitor {
 public:
  // Throws "[monitor] ..." when a folder or file cannot be created.
  MonitorMaster(const config::DeepSpeedConfig& cfg, const MonitorSetup& setup);

  // Every monitor, in DeepSpeed's order (TensorBoard, CSV); nothing on ranks other than the lead.
  void write_events(const std::vector<MonitorEvent>& events) override;

  const CsvMonitor& csv() const { return csv_; }
  const TensorBoardMonitor* tensorboard() const { return tb_.get(); }  // null when off

 private:
  bool lead_;
  CsvMonitor csv_;
  std::unique_ptr<TensorBoardMonitor> tb_;
};

}  // namespace ds::runtime
