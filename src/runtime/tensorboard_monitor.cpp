#include "ds/runtime/tensorboard_monitor.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include <fmt/format.h>

#include "ds/core/crc32c.h"
#include "ds/core/error.h"
#include "tensorboard_event.pb-c.h"

namespace ds::runtime {

namespace fs = std::filesystem;

namespace {

using Event = Ds__Tensorboard__Event;

// An Event packed to its wire bytes (protobuf-c's generated pack).
std::string pack(const Event& ev) {
  std::string bytes(ds__tensorboard__event__get_packed_size(&ev), '\0');
  ds__tensorboard__event__pack(&ev, reinterpret_cast<uint8_t*>(bytes.data()));
  return bytes;
}

struct EventFree {
  void operator()(Event* e) const { ds__tensorboard__event__free_unpacked(e, nullptr); }
};

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

void put_le64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
void put_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
uint64_t get_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t get_le32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

TensorBoardMonitor::TensorBoardMonitor(const fs::path& output_path, const std::string& job_name,
                                       std::optional<int64_t> resumed_at)
    : log_dir_(make_log_dir(output_path, job_name)) {
  const double now = unix_seconds();
  // PyTorch's SummaryWriter name; the pid keeps two processes started in the same second apart.
  file_ = log_dir_ / fmt::format("events.out.tfevents.{:010d}.{}.{}.0", static_cast<int64_t>(now),
                                 host_name(), ::getpid());
  out_ = std::fopen(file_.c_str(), "wb");
  DS_CHECK(out_ != nullptr, "[monitor] cannot create '{}': {}", file_.string(),
           std::strerror(errno));
  Event ev;
  ds__tensorboard__event__init(&ev);
  ev.wall_time = now;
  ev.what_case = DS__TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  std::string version = "brain.Event:2";
  ev.file_version = version.data();
  write_record(pack(ev));
  if (resumed_at) {
    Ds__Tensorboard__SessionLog log;
    ds__tensorboard__session_log__init(&log);
    log.status = DS__TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    Event start;
    ds__tensorboard__event__init(&start);
    start.wall_time = now;
    start.step = *resumed_at + 1;
    start.what_case = DS__TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    start.session_log = &log;
    write_record(pack(start));
  }
  flush();
}

TensorBoardMonitor::~TensorBoardMonitor() {
  if (out_) std::fclose(out_);
}

void TensorBoardMonitor::write_record(const std::string& data) {
  char head[12], tail[4];
  put_le64(head, data.size());
  put_le32(head + 8, crc32c_mask(crc32c(head, 8)));
  put_le32(tail, crc32c_mask(crc32c(data.data(), data.size())));
  const bool ok = std::fwrite(head, 1, sizeof(head), out_) == sizeof(head) &&
                  std::fwrite(data.data(), 1, data.size(), out_) == data.size() &&
                  std::fwrite(tail, 1, sizeof(tail), out_) == sizeof(tail);
  DS_CHECK(ok, "[monitor] cannot write '{}': {}", file_.string(), std::strerror(errno));
}

void TensorBoardMonitor::flush() {
  DS_CHECK(std::fflush(out_) == 0, "[monitor] cannot write '{}': {}", file_.string(),
           std::strerror(errno));
}

void TensorBoardMonitor::write_events(const std::vector<MonitorEvent>& events) {
  const double now = unix_seconds();
  for (const MonitorEvent& e : events) {
    std::string tag = e.name;
    Ds__Tensorboard__SummaryValue value;
    ds__tensorboard__summary_value__init(&value);
    value.tag = tag.data();
    value.value_case = DS__TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
    value.simple_value = static_cast<float>(e.value);
    Ds__Tensorboard__SummaryValue* values[] = {&value};
    Ds__Tensorboard__Summary summary;
    ds__tensorboard__summary__init(&summary);
    summary.n_value = 1;
    summary.value = values;
    Event ev;
    ds__tensorboard__event__init(&ev);
    ev.wall_time = now;
    ev.step = e.step;
    ev.what_case = DS__TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;
    write_record(pack(ev));
  }
  flush();
}

std::vector<TensorBoardEvent> read_tensorboard_events(const fs::path& file,
                                                      bool allow_truncated_tail) {
  std::ifstream in(file, std::ios::binary);
  DS_CHECK(in.good(), "[tensorboard] cannot open '{}'", file.string());
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<TensorBoardEvent> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t left = bytes.size() - pos;
    uint64_t len = 0;
    bool cut = left < 12;
    if (!cut) {
      len = get_le64(p + pos);
      DS_CHECK(crc32c_mask(crc32c(p + pos, 8)) == get_le32(p + pos + 8),
               "[tensorboard] {}: record {} at byte {}: the length's CRC does not match",
               file.string(), out.size(), pos);
      cut = left < 16 || len > left - 16;
    }
    if (cut) {
      DS_CHECK(allow_truncated_tail,
               "[tensorboard] {}: record {} at byte {} is cut short ({} bytes left)", file.string(),
               out.size(), pos, left);
      break;
    }
    const unsigned char* data = p + pos + 12;
    DS_CHECK(crc32c_mask(crc32c(data, len)) == get_le32(data + len),
             "[tensorboard] {}: record {} at byte {}: the data's CRC does not match", file.string(),
             out.size(), pos);
    const std::unique_ptr<Event, EventFree> ev(ds__tensorboard__event__unpack(nullptr, len, data));
    DS_CHECK(ev != nullptr, "[tensorboard] {}: record {} at byte {} is not an Event", file.string(),
             out.size(), pos);
    TensorBoardEvent e;
    e.wall_time = ev->wall_time;
    e.step = ev->step;
    switch (ev->what_case) {
      case DS__TENSORBOARD__EVENT__WHAT_FILE_VERSION:
        e.file_version = ev->file_version;
        break;
      case DS__TENSORBOARD__EVENT__WHAT_SESSION_LOG:
        e.session_start =
            ev->session_log->status == DS__TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
        break;
      case DS__TENSORBOARD__EVENT__WHAT_SUMMARY:
        for (size_t i = 0; i < ev->summary->n_value; ++i) {
          const Ds__Tensorboard__SummaryValue* v = ev->summary->value[i];
          if (v->value_case == DS__TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE)
            e.scalars.emplace_back(v->tag, v->simple_value);
        }
        break;
      default:
        break;  // graphs, run metadata, ...: not scalars
    }
    out.push_back(std::move(e));
    pos += 16 + len;
  }
  return out;
}

}  // namespace ds::runtime
