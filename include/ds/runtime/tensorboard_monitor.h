#pragma once
// TensorBoard scalars (DeepSpeed's deepspeed/monitor/tensorboard.py, which calls PyTorch's
// SummaryWriter(log_dir=<output_path>/<job_name>).add_scalar(name, value, step) and flushes after
// each batch of events).
//
// The file: <output_path>/<job_name>/events.out.tfevents.<unix time, 10 digits>.<host>.<pid>.0
// (PyTorch's name), a TFRecord stream of tensorflow.Event protos:
//
//   record = uint64 length (little-endian) | uint32 masked crc32c(length) | data | masked
//   crc32c(data)
//
// the first record a file_version "brain.Event:2" event, then one event per scalar (wall_time,
// step, summary.value{tag, simple_value}). The protos are C code that protoc-c (protobuf-c)
// generates from src/runtime/proto/tensorboard_event.proto (TensorFlow's field numbers); CRC-32C is
// ds/core/crc32c.h. TensorBoard (its EventAccumulator) reads these files: the fixture check
// tests/fixtures/generators/check_tensorboard_events.py.
//
// Resume: every process writes a new file (TensorBoard reads all event files of a folder, in name
// order, that is in time order). A resumed run first writes a SessionLog START event at step
// resumed_at + 1, which makes TensorBoard drop the earlier files' events past the checkpoint
// (the steps this run trains again), as the CSV files drop their rows.
//
// Ownership and threading: one object owns its open file; write_events is not thread-safe (ds_train
// calls it from its training thread). Only rank 0 should construct one (DeepSpeed's rule: a rank
// > 0 would add its own file to the folder).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ds/runtime/monitor.h"

namespace ds::runtime {

class TensorBoardMonitor : public Monitor {
 public:
  // Creates <output_path>/<job_name>/ and the event file with its file_version record. Throws
  // "[monitor] ..." when the folder or the file cannot be created.
  TensorBoardMonitor(const std::filesystem::path& output_path, const std::string& job_name,
                     std::optional<int64_t> resumed_at = std::nullopt);
  ~TensorBoardMonitor() override;
  TensorBoardMonitor(const TensorBoardMonitor&) = delete;
  TensorBoardMonitor& operator=(const TensorBoardMonitor&) = delete;

  // One event per MonitorEvent (values are stored as float32, as add_scalar does), then a flush to
  // the operating system: a crash of the process loses no written batch. Throws "[monitor] ..."
  // when the write fails (a full disk).
  void write_events(const std::vector<MonitorEvent>& events) override;

  const std::filesystem::path& log_dir() const { return log_dir_; }
  const std::filesystem::path& file() const { return file_; }

 private:
  void write_record(const std::string& data);
  void flush();

  std::filesystem::path log_dir_, file_;
  std::FILE* out_ = nullptr;
};

// One event of an event file, as read back: its time and step, and what it holds of
// file_version, a SessionLog START, and scalar summary values (tag, simple_value).
struct TensorBoardEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> scalars;
};

// Reads an event file (ours, or one written by TensorFlow, PyTorch or TensorBoard), checking the
// length and data CRCs of every record. Throws "[tensorboard] <file>: ..." on a bad CRC, a record
// that is not an Event, or a record cut short (a writer killed mid-record) unless
// allow_truncated_tail, which stops there as TensorBoard's reader does.
std::vector<TensorBoardEvent> read_tensorboard_events(const std::filesystem::path& file,
                                                      bool allow_truncated_tail = false);

}  // namespace ds::runtime
