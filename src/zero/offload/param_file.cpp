// ZeRO-3 parameter pieces on NVMe (param_file.h).
#include "param_file.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "ds/core/error.h"

namespace ds::zero::detail {
namespace {
constexpr int64_t kElementAlign = 2048;  // 4 KiB of 16-bit elements: every chunk write is aligned
std::string gib(int64_t b) {
  const double d = static_cast<double>(b);
  return d >= (1 << 30) ? fmt::format("{:.2f} GiB", d / (1 << 30))
                        : fmt::format("{:.1f} MiB", d / (1 << 20));
}
}  // namespace

ParamFile::ParamFile(const ParamFileOptions& o, int rank, DType dtype, int64_t numel,
                     const void* initial, int64_t group,
                     const std::function<void(const std::string&)>& log)
    : o_(o), dtype_(dtype), esize_(static_cast<int64_t>(dtype_size(dtype))), numel_(numel) {
  DS_CHECK(o.buffer_count >= 1 && o.buffer_size >= 1,
           "[offload] offload_param.buffer_count ({}) and buffer_size ({}) must be >= 1",
           o.buffer_count, o.buffer_size);
  ram_end_ = std::min(numel_, std::max<int64_t>(0, o.max_in_cpu) / kElementAlign * kElementAlign);
  const char* src = static_cast<const char*>(initial);
  if (ram_end_ > 0) {
    ram_ = io::AlignedBuffer(ram_end_ * esize_);
    if (src) std::memcpy(ram_.data(), src, static_cast<size_t>(ram_end_ * esize_));
  }
  group = std::max<int64_t>(kElementAlign, group);
  for (auto& s : scratch_) s = io::AlignedBuffer(io::align_up(group * esize_));
  if (ram_end_ == numel_) return;

  dir_ = std::make_unique<io::SwapDir>(o.nvme_path, fmt::format("rank{}-params", rank), log);
  std::string why;
  if (!o.aio.use_direct_io) {
    why = "aio.use_direct_io = false";
  } else {
    direct_ = io::direct_io_supported(dir_->path(), &why);
  }
  if (!direct_ && log)
    log(fmt::format("[offload] O_DIRECT is not supported in {} ({}); parameters use buffered I/O",
                    o.nvme_path, why));
  file_ = io::File::open(dir_->path() + "/params.swp", io::File::kReadWrite | io::File::kCreate,
                         direct_);
  disk_bytes_ = io::align_up((numel_ - ram_end_) * esize_);
  file_.reserve(disk_bytes_);
  std::string fallback;
  engine_ = io::make_engine(o.aio, &fallback);
  if (!fallback.empty() && log)
    log(fmt::format("[offload] {}; using the pread/pwrite thread pool", fallback));
  write_engine_ = io::make_engine(o.aio);
  // The initial pieces, one sub-group at a time through the scratch buffers (none: the caller
  // writes them through scratch() and write()).
  if (!initial) return;
  for (int64_t b = ram_end_ / group * group; b < numel_; b += group) {
    const int64_t n = std::min(group, numel_ - b);
    std::memcpy(scratch(b, n), src + b * esize_, static_cast<size_t>(n * esize_));
    write(b, n);
  }
  flush();
}

void ParamFile::wait_read(io::Ticket t) {
  const auto t0 = std::chrono::steady_clock::now();
  auto add = [&] {
    read_wait_.fetch_add(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  try {
    engine_->wait(t);
  } catch (...) {
    add();
    throw;
  }
  add();
}

void ParamFile::wait_write(int slot) {
  const io::Ticket t = scratch_ticket_[slot];
  scratch_ticket_[slot] = 0;
  if (!t) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto add = [&] {
    write_wait_.fetch_add(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  try {
    write_engine_->wait(t);
  } catch (...) {
    add();
    throw;
  }
  add();
  durable_.emplace_back(scratch_begin_[slot], scratch_end_[slot]);
}

std::vector<std::pair<int64_t, int64_t>> ParamFile::take_durable() {
  return std::exchange(durable_, {});
}

io::Counters ParamFile::counters() const {
  io::Counters c;
  for (const auto* e : {engine_.get(), write_engine_.get()}) {
    if (!e) continue;
    const io::Counters x = e->counters();
    c.bytes_read += x.bytes_read;
    c.bytes_written += x.bytes_written;
    c.requests += x.requests;
    c.busy_seconds += x.busy_seconds;
  }
  return c;
}

ParamFile::~ParamFile() {
  for (auto* e : {engine_.get(), write_engine_.get()}) {
    if (!e) continue;
    try {
      e->wait_all();
    } catch (const Error&) {  // reported by the operation that failed
    }
  }
}

void ParamFile::prefetch(int key, int64_t begin, int64_t n) {
  if (begin + n <= ram_end_ || staged_.count(key)) return;
  Staged s;
  const int64_t in_ram = std::max<int64_t>(0, ram_end_ - begin);  // elements before ram_end
  const int64_t fb = (begin + in_ram - ram_end_) * esize_, fe = (begin + n - ram_end_) * esize_;
  const int64_t a = fb / io::kAlignment * io::kAlignment, z = io::align_up(fe);
  const int64_t x = io::align_up(in_ram * esize_);  // where the file part lands in the buffer
  s.buf = io::AlignedBuffer(x + (z - a));
  s.skip = x + (fb - a) - in_ram * esize_;
  s.numel = n;
  if (in_ram > 0)
    std::memcpy(s.buf.as<char>() + s.skip, ram_.as<char>() + begin * esize_,
                static_cast<size_t>(in_ram * esize_));
  // A parameter larger than buffer_size is read in buffer_size pieces.
  const int64_t step = std::max(io::kAlignment, io::align_up(o_.buffer_size * esize_));
  for (int64_t at = a; at < z; at += step)
    s.tickets.push_back(
        engine_->read(file_, s.buf.as<char>() + x + (at - a), std::min(step, z - at), at));
  staged_elements_ += n;
  staged_.emplace(key, std::move(s));
}

const void* ParamFile::get(int key, int64_t begin, int64_t n) {
  if (begin + n <= ram_end_) return ram_.as<char>() + begin * esize_;
  prefetch(key, begin, n);
  Staged& s = staged_.at(key);
  for (io::Ticket& t : s.tickets) {
    const io::Ticket tt = t;
    t = 0;
    if (tt) wait_read(tt);
  }
  s.tickets.clear();
  return s.buf.as<char>() + s.skip;
}

void ParamFile::drop(int key) {
  auto it = staged_.find(key);
  if (it == staged_.end()) return;
  for (io::Ticket t : it->second.tickets) {
    if (!t) continue;
    try {
      wait_read(t);  // never free a buffer under a read
    } catch (const Error&) {
      // The piece is discarded unread: its failed read harms nothing (a later get() reads it
      // again, and reports a failure that persists).
    }
  }
  staged_elements_ -= it->second.numel;
  staged_.erase(it);
}

void ParamFile::drop_all() {
  std::vector<int> keys;
  for (auto& [k, s] : staged_) keys.push_back(k);
  for (int k : keys) drop(k);
}

void* ParamFile::scratch(int64_t begin, int64_t n) {
  (void)begin;
  (void)n;
  wait_write(next_scratch_);  // the buffer's previous write must be done before it is refilled
  return scratch_[next_scratch_].data();
}

void ParamFile::write(int64_t begin, int64_t n) {
  const char* data = scratch_[next_scratch_].as<char>();
  const int64_t in_ram = std::clamp<int64_t>(ram_end_ - begin, 0, n);
  if (in_ram > 0)
    std::memcpy(ram_.as<char>() + begin * esize_, data, static_cast<size_t>(in_ram * esize_));
  if (in_ram < n) {
    const int64_t x = begin + in_ram;  // first element in the file
    DS_CHECK((x - ram_end_) % kElementAlign == 0,
             "[offload] internal: parameter write at element {} is not aligned", x);
    scratch_begin_[next_scratch_] = begin;
    scratch_end_[next_scratch_] = begin + n;
    scratch_ticket_[next_scratch_] =
        write_engine_->write(file_, data + in_ram * esize_, io::align_up((n - in_ram) * esize_),
                             (x - ram_end_) * esize_);
  } else {
    durable_.emplace_back(begin, begin + n);  // all in RAM: readable now
  }
  next_scratch_ ^= 1;
}

void ParamFile::flush() {
  std::string first;
  // The older write first.
  for (int k = 0; k < 2; ++k) {
    const int slot = next_scratch_ ^ k;
    try {
      wait_write(slot);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw Error(first);
}

std::string ParamFile::describe() const {
  return fmt::format(
      "[offload] parameters ({}) on NVMe: {} of {} elements in {}{} ({} reserved, {}), {} in RAM "
      "(max_in_cpu); reads ahead up to buffer_count x buffer_size = {} elements",
      dtype_name(dtype_), numel_ - ram_end_, numel_, dir_ ? dir_->path() : std::string("-"),
      direct_ ? " (O_DIRECT)" : " (buffered)", gib(disk_bytes_), engine_ ? engine_->kind() : "-",
      ram_end_, budget());
}

}  // namespace ds::zero::detail
