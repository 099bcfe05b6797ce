#pragma once
// Training metrics on disk: the Monitor interface (DeepSpeed's deepspeed/monitor/monitor.py), its
// csv_monitor layout, and a loss-curve picture (SVG). The TensorBoard monitor is
// ds/runtime/tensorboard_monitor.h; the set of a run's monitors, DeepSpeed's MonitorMaster, is
// ds/runtime/monitor_master.h.
//
// CSV layout (DeepSpeed's deepspeed/monitor/csv_monitor.py): one file per metric under
// <output_path>/<job_name>/, named after the event with '/' and ' ' replaced by '_', whose first
// row is "step,<last component of the name>":
//
//   Train/Samples/train_loss  ->  <output_path>/<job_name>/Train_Samples_train_loss.csv
//                                 step,train_loss
//                                 64,10.8254
//
// DeepSpeed's engine writes its Train/Samples/* events at step = global samples (optimizer steps
// x train_batch_size), and ds_train does the same for every event so that all files share one
// x axis.
//
// Unlike DeepSpeed (which appends and repeats the header in every new process), a monitor either
// starts the files afresh or, when resuming, keeps the rows up to the resume point and appends
// after them: a resumed run's files read as if the run had never stopped.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds::runtime {

struct MonitorEvent {
  std::string name;  // e.g. "Train/Samples/train_loss"
  double value = 0.0;
  int64_t step = 0;
};

// What DeepSpeed's monitors have in common: write_events(a batch of (name, value, step)).
// Implementations write on the calling thread and are not thread-safe.
class Monitor {
 public:
  virtual ~Monitor() = default;
  virtual void write_events(const std::vector<MonitorEvent>& events) = 0;
};

// A monitor's folder, <output_path>/<job_name>, created (DeepSpeed's log_dir). Throws
// "[monitor] ..." when job_name is not a plain folder name or the folder cannot be created.
std::filesystem::path make_log_dir(const std::filesystem::path& output_path,
                                   const std::string& job_name);

class CsvMonitor : public Monitor {
 public:
  // keep_up_to: nullopt = a fresh run (files are rewritten on first use); a value = resume: rows
  // with step > keep_up_to are dropped from existing files on first use, then rows are appended.
  // Only rank 0 should construct one. Throws "[monitor] ..." when the folder cannot be created.
  CsvMonitor(const std::filesystem::path& output_path, const std::string& job_name,
             std::optional<int64_t> keep_up_to = std::nullopt);

  void write_events(const std::vector<MonitorEvent>& events) override;
  void write(const std::string& name, double value, int64_t step) {
    write_events({{name, value, step}});
  }

  const std::filesystem::path& log_dir() const { return log_dir_; }
  std::filesystem::path file_of(std::string_view event_name) const;

  // "Train/Samples/train_loss" -> "Train_Samples_train_loss" (DeepSpeed's file naming).
  static std::string file_stem(std::string_view event_name);
  // The (step, value) rows of a file written by a monitor; header skipped, bad lines ignored.
  static std::vector<std::pair<int64_t, double>> read(const std::filesystem::path& file);

 private:
  void open_first_time(const std::filesystem::path& file, std::string_view header);

  std::filesystem::path log_dir_;
  std::optional<int64_t> keep_up_to_;
  std::set<std::string> opened_;
};

// ---------------------------------------------------------------------------------------------
// A line chart as a standalone SVG file (no fonts or scripts beyond the SVG basics, so any
// browser or image viewer opens it).

struct ChartSeries {
  std::string label;
  std::string color;                              // any SVG colour, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in the given order
  bool markers = false;  // dots at the points (for sparse series such as eval loss)
};

struct ChartLine {  // a horizontal reference line (e.g. the unigram entropy of the data)
  std::string label;
  double y = 0.0;
  std::string color = "#888888";
};

struct ChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  std::vector<ChartLine> lines;
  int width = 900, height = 540;
};

// Renders the chart: axes with round-number ticks, a grid, one polyline per series, dashed
// reference lines and a legend. Non-finite points are skipped.
std::string render_svg_chart(const ChartSpec& spec);
// render_svg_chart, written atomically to path.
void write_svg_chart(const std::filesystem::path& path, const ChartSpec& spec);

}  // namespace ds::runtime
