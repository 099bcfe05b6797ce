// The NVMe home of the optimizer state (zero/state_store.h; docs/offload.md). DeepSpeed's
// counterpart is deepspeed/runtime/swap_tensor/partitioned_optimizer_swapper.py and
// pipelined_optimizer_swapper.py, with one file per sub-group and tensor kind; here one
// preallocated file per rank and read-ahead / write-behind rings deeper than its 3 sub-groups.
//
// Layout: the optimizer range is cut into K sub-groups of S elements (S = sub_group_size rounded
// up to 2048 elements = 8 KiB, the last one shorter). Sub-groups [0, K_ram) live in one RAM region
// (ratio < 1), the rest in one swap file per rank, each in a slot of (1 + states) * S floats:
//
//   slot j:  [ master (S floats) | exp_avg (S) | exp_avg_sq (S) ]      (master omitted when the
//                                                                        master is the parameters)
//
// so a sub-group is one contiguous, aligned read and one write. A ring of B = buffer_count slot
// buffers streams them: the p-th disk sub-group of a pass uses buffer p % B; reads run `ahead`
// sub-groups in front of the one being stepped (pipeline_read), the write of k is waited for only
// when its buffer is needed again (pipeline_write). With B = 4 and both on: write k-1 | step k |
// read k+1, k+2. A pass goes in ascending order, or in the order a ChunkOrder decides as it goes.
// prefetch() fills the whole ring with the first B disk sub-groups while no pass runs (during the
// backward before a step), so the next pass starts without waiting for the disk.
//
// The swap folder is scratch (io/swap_dir.h): created per run, removed on exit; checkpoints hold
// the state, and a resumed run streams it back into a fresh swap file.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <utility>

#include "ds/core/error.h"
#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "ds/zero/state_store.h"

namespace ds::zero {
namespace {

using Clock = std::chrono::steady_clock;
// 8 KiB of fp32, 4 KiB of 16-bit elements: parameter writes per sub-group stay aligned too.
constexpr int64_t kGroupAlign = 2048;

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

std::string gib(int64_t b) {
  const double d = static_cast<double>(b);
  return d >= (1 << 30) ? fmt::format("{:.2f} GiB", d / (1 << 30))
                        : fmt::format("{:.1f} MiB", d / (1 << 20));
}

class NvmeStateStore final : public StateStore {
 public:
  NvmeStateStore(const NvmeOffloadOptions& o, int rank, int64_t numel, Tensor params_master,
                 const MasterInit& init, optim::Optimizer& opt,
                 const std::function<void(const std::string&)>& log)
      : o_(o), n_(numel), names_(opt.state_names()) {
    const bool master_is_params = params_master.defined();
    DS_CHECK(master_is_params ? params_master.numel() == numel : static_cast<bool>(init),
             "[offload] internal: the NVMe store needs the master weights ({} elements) or an "
             "initialiser", numel);
    DS_CHECK(opt.steps_in_slices(),
             "[offload] offload_optimizer.device = \"nvme\" needs the Adam or AdamW optimizer "
             "(the state is stepped one sub-group at a time); {} needs whole tensors. Use "
             "AdamW, or offload_optimizer.device = \"none\"",
             opt.name());
    DS_CHECK(o.buffer_count >= 1,
             "[offload] offload_optimizer.buffer_count = {} must be >= 1 (4 or more overlaps "
             "reading, stepping and writing)",
             o.buffer_count);
    if (master_is_params) external_master_ = params_master;
    const int64_t floats_per = (master_is_params ? 0 : 1) + static_cast<int64_t>(names_.size());
    per_ = floats_per;

    // Sub-group size: the configured one, unless the ring would not fit in a quarter of the RAM
    // that is available now (DeepSpeed's default 1e9 elements x 4 buffers pins 16+ GiB).
    int64_t s =
        std::max<int64_t>(kGroupAlign, std::min(o.sub_group_size, std::max<int64_t>(n_, 1)));
    s = io::align_up(s, kGroupAlign);
    const int64_t avail = mem_available_bytes();
    const int64_t ring = o.buffer_count * per_ * s * 4;
    if (avail > 0 && ring > avail / 4) {
      int64_t fit = avail / 4 / (o.buffer_count * per_ * 4);
      fit = std::max<int64_t>(kGroupAlign, fit / kGroupAlign * kGroupAlign);
      if (log)
        log(fmt::format(
            "[offload] sub_group_size {} with buffer_count {} would need {} of swap buffers "
            "({} available): using sub-groups of {} elements ({}); set "
            "zero_optimization.sub_group_size to choose",
            o.sub_group_size, o.buffer_count, gib(ring), gib(avail), fit,
            gib(o.buffer_count * per_ * fit * 4)));
      s = fit;
    }
    group_ = s;
    groups_ = std::max<int64_t>(1, (n_ + s - 1) / s);
    const int64_t on_disk = std::clamp<int64_t>(
        static_cast<int64_t>(std::llround(o.ratio * static_cast<double>(groups_))), 0, groups_);
    ram_groups_ = groups_ - on_disk;
    slot_floats_ = per_ * group_;

    if (ram_groups_ > 0) ram_ = io::AlignedBuffer(ram_groups_ * slot_floats_ * 4);
    if (on_disk > 0) {
      dir_ = std::make_unique<io::SwapDir>(o.nvme_path, fmt::format("rank{}-optimizer", rank), log);
      std::string why;
      if (!o.aio.use_direct_io) {
        direct_ = false;
        why = "aio.use_direct_io = false";
      } else {
        direct_ = io::direct_io_supported(dir_->path(), &why);
      }
      if (!direct_ && log)
        log(
            fmt::format("[offload] O_DIRECT is not supported in {} ({}); using buffered I/O "
                        "(the page cache then holds swapped state too)",
                        o.nvme_path, why));
      file_ = io::File::open(dir_->path() + "/optimizer_state.swp",
                             io::File::kReadWrite | io::File::kCreate, direct_);
      disk_bytes_ = on_disk * slot_floats_ * 4;
      if (!file_.reserve(disk_bytes_) && log)
        log(fmt::format("[offload] {} cannot preallocate (no fallocate); space is not reserved",
                        o.nvme_path));
      std::string fallback;
      engine_ = io::make_engine(o.aio, &fallback);
      if (!fallback.empty() && log)
        log(fmt::format("[offload] {}; using the pread/pwrite thread pool", fallback));
      const int64_t nbuf = std::min<int64_t>(o.buffer_count, on_disk);
      for (int64_t b = 0; b < nbuf; ++b) ring_.emplace_back(slot_floats_ * 4);
      read_ticket_.assign(ring_.size(), 0);
      write_ticket_.assign(ring_.size(), 0);
    }

    // Initial state: master weights from `init`, one sub-group at a time; moments zero.
    for_each(Access::Overwrite, [&](const StateChunk& c) {
      if (!master_is_params) init(c.begin, c.numel, c.master);
      for (float* st : c.states) std::fill(st, st + c.numel, 0.0f);
    });
    opt.use_external_state(n_);
  }

  ~NvmeStateStore() override {
    if (engine_) {
      try {
        engine_->wait_all();
      } catch (const Error&) {  // already reported by the step that failed
      }
    }
  }

  int64_t numel() const override { return n_; }
  std::vector<std::string> state_names() const override { return names_; }
  bool holds_master() const override { return !external_master_.defined(); }

  int64_t prefetch() override {
    if (!engine_ || prefetched_ > 0 || !o_.pipeline_read) return 0;
    const int64_t slot_bytes = slot_floats_ * 4;
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ring_.size()), groups_ - ram_groups_);
    try {
      for (int64_t k = ram_groups_; k < ram_groups_ + n; ++k) {
        const size_t b = static_cast<size_t>(prefetched_);  // the pass's first disk positions
        wait(write_ticket_[b]);
        read_ticket_[b] = engine_->read(file_, ring_[b].data(), slot_bytes, disk_index(k) * slot_bytes);
        ++prefetched_;
      }
    } catch (const Error&) {
      // Not raised here (this rank would leave the others in the backward's collectives): the
      // step reads these sub-groups again and reports a failure on every rank.
      drain();
    }
    return prefetched_ * slot_bytes;
  }

  int64_t chunk_numel() const override { return group_; }
  using StateStore::for_each;
  void for_each(Access access, const ChunkOrder& order,
                const std::function<void(const StateChunk&)>& fn) override {
    try {
      visit(access, order, fn);
    } catch (...) {
      // Stop every transfer before the buffers are reused or freed; the first error is the one
      // reported (it is already on its way up).
      drain();
      throw;
    }
  }

  std::string describe() const override {
    const int64_t disk_groups = groups_ - ram_groups_;
    std::string s = fmt::format(
        "[offload] optimizer state ({}{}) on NVMe: {} sub-groups of {} elements, {} on disk in "
        "{}{} ({} reserved, {} I/O, {}), {} in RAM; {} swap buffers of {}; "
        "read-ahead {}, write-behind {}",
        external_master_.defined() ? "" : "fp32 master weights, ", fmt::join(names_, ", "), groups_,
        group_, disk_groups, dir_ ? dir_->path() : std::string("-"),
        direct_ ? " (O_DIRECT)" : " (buffered)", gib(disk_bytes_), engine_ ? engine_->kind() : "no",
        engine_ ? fmt::format("queue depth {}", o_.aio.queue_depth) : "", ram_groups_, ring_.size(),
        gib(slot_floats_ * 4), ahead(), o_.pipeline_write ? "on" : "off");
    return s;
  }

  StoreStats stats() const override {
    StoreStats s;
    s.ram_bytes = ram_.bytes() + static_cast<int64_t>(ring_.size()) * slot_floats_ * 4;
    s.disk_bytes = disk_bytes_;
    if (engine_) {
      const io::Counters c = engine_->counters();
      s.bytes_read = c.bytes_read;
      s.bytes_written = c.bytes_written;
      s.io_busy_seconds = c.busy_seconds;
    }
    s.io_wait_seconds = wait_seconds_.load();
    return s;
  }

 private:
  int64_t ahead() const {
    if (!o_.pipeline_read) return 0;
    return std::max<int64_t>(0, static_cast<int64_t>(ring_.size()) - (o_.pipeline_write ? 2 : 1));
  }
  int64_t chunk_numel(int64_t k) const { return std::min(group_, n_ - k * group_); }
  int64_t disk_index(int64_t k) const { return k - ram_groups_; }

  // Stops every transfer (after a failure) so that the buffers can be reused or freed.
  void drain() noexcept {
    if (!engine_) return;
    try {
      engine_->wait_all();
    } catch (const Error&) {
    }
    std::fill(read_ticket_.begin(), read_ticket_.end(), 0);
    std::fill(write_ticket_.begin(), write_ticket_.end(), 0);
    prefetched_ = 0;
  }

  void wait(io::Ticket& t) {
    if (t == 0) return;
    const auto t0 = Clock::now();
    const io::Ticket tt = t;
    t = 0;
    engine_->wait(tt);
    wait_seconds_.fetch_add(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  StateChunk chunk(int64_t k, float* slot) const {
    StateChunk c;
    c.begin = k * group_;
    c.numel = chunk_numel(k);
    float* p = slot;
    if (external_master_.defined()) {
      c.master = external_master_.data<float>() + c.begin;
    } else {
      c.master = p;
      p += group_;
    }
    for (size_t i = 0; i < names_.size(); ++i, p += group_) c.states.push_back(p);
    return c;
  }

  // One pass over the sub-groups `order` returns. The p-th disk sub-group of the pass uses ring
  // buffer p % B: its read is started `ahead()` disk sub-groups before its visit, once the write
  // of the buffer's previous sub-group is done. RAM sub-groups are visited in place.
  void visit(Access access, const ChunkOrder& order,
             const std::function<void(const StateChunk&)>& fn) {
    if (n_ == 0) {
      while (order() >= 0) {
      }
      return;
    }
    const int64_t slot_bytes = slot_floats_ * 4;
    constexpr size_t kInRam = static_cast<size_t>(-1);
    struct Planned {
      int64_t k;
      size_t buffer;  // kInRam for a RAM sub-group
    };
    std::deque<Planned> planned;
    int64_t disk_pos = 0;      // disk sub-groups planned so far in this pass
    int64_t disk_planned = 0;  // of them, not yet visited
    // prefetch() started reads of the first disk sub-groups in ascending order into buffers
    // 0.. : a pass that takes them first in that order finds them in flight.
    const int64_t prefetched = std::exchange(prefetched_, 0);
    bool done = false;
    auto plan_one = [&] {
      const int64_t k = order();
      if (k < 0) {
        done = true;
        return;
      }
      DS_CHECK(k < groups_, "[offload] internal: sub-group {} of {} requested", k, groups_);
      if (k < ram_groups_) {
        planned.push_back({k, kInRam});
        return;
      }
      const size_t b = static_cast<size_t>(disk_pos % static_cast<int64_t>(ring_.size()));
      const bool in_flight = disk_pos < prefetched && k == ram_groups_ + disk_pos;
      if (!in_flight) {
        wait(read_ticket_[b]);   // a prefetched read this pass does not use
        wait(write_ticket_[b]);  // the buffer's previous sub-group must be on disk first
        if (access != Access::Overwrite)  // an overwrite reads nothing
          read_ticket_[b] =
              engine_->read(file_, ring_[b].data(), slot_bytes, disk_index(k) * slot_bytes);
      } else if (access == Access::Overwrite) {
        wait(read_ticket_[b]);  // read for nothing: wait before the buffer is refilled
      }
      ++disk_pos;
      ++disk_planned;
      planned.push_back({k, b});
    };
    const int64_t depth = ahead();
    while (true) {
      // The sub-group to visit and `depth` disk sub-groups after it are planned (reads started).
      while (!done && (planned.empty() || disk_planned <= depth)) plan_one();
      if (planned.empty()) break;
      const Planned p = planned.front();
      planned.pop_front();
      if (p.buffer == kInRam) {
        fn(chunk(p.k, ram_.as<float>() + p.k * slot_floats_));
        continue;
      }
      --disk_planned;
      wait(read_ticket_[p.buffer]);
      fn(chunk(p.k, ring_[p.buffer].as<float>()));
      if (access != Access::Read) {
        write_ticket_[p.buffer] = engine_->write(file_, ring_[p.buffer].data(), slot_bytes,
                                                 disk_index(p.k) * slot_bytes);
        if (!o_.pipeline_write) wait(write_ticket_[p.buffer]);
      }
    }
    for (size_t b = 0; b < read_ticket_.size(); ++b) wait(read_ticket_[b]);
    for (auto& t : write_ticket_) wait(t);
  }

  NvmeOffloadOptions o_;
  int64_t n_ = 0;
  std::vector<std::string> names_;
  Tensor external_master_;  // fp32 training: the parameters are the master weights
  int64_t per_ = 0;         // floats per element in a slot (master? + states)
  int64_t group_ = 0, groups_ = 0, ram_groups_ = 0, slot_floats_ = 0;
  io::AlignedBuffer ram_;
  std::unique_ptr<io::SwapDir> dir_;
  bool direct_ = false;
  io::File file_;
  int64_t disk_bytes_ = 0;
  std::unique_ptr<io::Engine> engine_;
  std::vector<io::AlignedBuffer> ring_;
  std::vector<io::Ticket> read_ticket_, write_ticket_;
  int64_t prefetched_ = 0;  // disk sub-groups from ram_groups_ on whose reads prefetch() started
  // Read by stats() on the training thread while a background step (strategy.h) waits here.
  std::atomic<double> wait_seconds_{0};
};

}  // namespace

std::unique_ptr<StateStore> nvme_state_store(const NvmeOffloadOptions& o, int rank, int64_t numel,
                                             Tensor params_master, const MasterInit& init,
                                             optim::Optimizer& opt,
                                             const std::function<void(const std::string&)>& log) {
  return std::make_unique<NvmeStateStore>(o, rank, numel, std::move(params_master), init, opt, log);
}

}  // namespace ds::zero
