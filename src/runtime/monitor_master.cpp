#include "ds/runtime/monitor_master.h"

#include <fmt/format.h>

#include "ds/config/config.h"
#include "ds/core/error.h"

namespace ds::runtime {

namespace fs = std::filesystem;

ReportTo parse_report_to(const std::vector<std::string>& values) {
  std::vector<std::string> names;
  for (const std::string& v : values) {
    size_t start = 0;
    while (start <= v.size()) {
      const size_t comma = std::min(v.find(',', start), v.size());
      if (comma > start) names.push_back(v.substr(start, comma - start));
      start = comma + 1;
    }
  }
  ReportTo r;
  bool none = false;
  for (const std::string& n : names) {
    if (n == "tensorboard") {
      r.tensorboard = true;
    } else if (n == "csv") {
      r.csv = true;
    } else if (n == "all") {
      r.tensorboard = r.csv = true;
    } else if (n == "none") {
      none = true;
    } else if (n == "wandb") {
      DS_THROW("[ds_train] --report_to wandb: {}", config::unavailable_monitor_message("wandb"));
    } else if (n == "comet_ml" || n == "comet") {
      DS_THROW("[ds_train] --report_to {}: {}", n, config::unavailable_monitor_message("comet"));
    } else {
      DS_THROW(
          "[ds_train] --report_to {}: not a monitor of deepspeed.cpp; allowed are tensorboard, "
          "csv, all (both) and none",
          n);
    }
  }
  DS_CHECK(!none || names.size() == 1,
           "[ds_train] --report_to none cannot be combined with other values (got {})",
           fmt::join(names, ","));
  return r;
}

namespace {

fs::path root_of(const std::string& output_path, const fs::path& default_root) {
  return output_path.empty() ? default_root : fs::path(output_path);
}

}  // namespace

MonitorMaster::MonitorMaster(const config::DeepSpeedConfig& cfg, const MonitorSetup& setup)
    : lead_(setup.lead),
      csv_(cfg.csv_monitor.enabled || setup.report_to.csv
               ? root_of(cfg.csv_monitor.output_path, setup.default_root)
               : setup.default_root,
           cfg.csv_monitor.enabled || setup.report_to.csv ? cfg.csv_monitor.job_name : "metrics",
           setup.resumed_at) {
  if (lead_ && (cfg.tensorboard.enabled || setup.report_to.tensorboard))
    tb_ = std::make_unique<TensorBoardMonitor>(
        root_of(cfg.tensorboard.output_path, setup.default_root), cfg.tensorboard.job_name,
        setup.resumed_at);
}

void MonitorMaster::write_events(const std::vector<MonitorEvent>& events) {
  if (!lead_) return;
  if (tb_) tb_->write_events(events);
  csv_.write_events(events);
}

}  // namespace ds::runtime
