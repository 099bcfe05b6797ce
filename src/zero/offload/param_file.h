#pragma once
// ZeRO-3 parameter offload to NVMe (offload_param.device = "nvme", DeepSpeed's
// deepspeed/runtime/zero/offload_config.py and swap_tensor/partitioned_param_swapper.py; buffers
// sized from a RAM budget and prefetch that needs no recorded trace: docs/offload.md): this rank's
// training-dtype pieces of every parameter, i.e. the stage-3 shard buffer, with elements [0,
// ram_end) in RAM (max_in_cpu) and [ram_end, numel) in one preallocated swap file laid out exactly
// like the shard buffer. Internal to zero/.
//
//   ParamFile pf(options, rank, DType::bf16, numel, initial_pieces, log);
//   pf.prefetch(i, begin, n);               // start reading a piece (returns at once)
//   const void* p = pf.get(i, begin, n);    // the piece in RAM (waits for its read)
//   pf.drop(i);                             // its staging buffer is free again
//   void* out = pf.scratch(b, n); ... pf.write(b, n);    // after an optimizer step, per sub-group
//   pf.flush();                             // every write done: reads see the new values
//
// Staging: a piece is read into its own aligned buffer (a parameter larger than buffer_size is
// read in buffer_size pieces, never refused); read-ahead callers keep the staged total within
// buffer_count * buffer_size elements (staged_elements()). Writes go through two alternating
// scratch buffers of one sub-group each, so writing sub-group k overlaps stepping k+1.
//
// Threading: reads (prefetch/get/drop) on the training thread; writes (scratch/write/flush) on
// the training thread or, during a background optimizer step (strategy.h), on its worker, at the
// same time: reads and writes have their own io::Engine. take_durable() tells which writes have
// reached the disk; readers stay away from the others. I/O on the engines' workers.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "ds/zero/strategy.h"

namespace ds::zero::detail {

using ParamFileOptions = NvmeParamOffloadOptions;  // zero/strategy.h

class ParamFile {
 public:
  // `initial`: numel elements of `dtype` (the pieces as built); copied, not kept. nullptr: the
  // caller writes every element through scratch()/write() and flush()es before the first get(). `group`: the
  // optimizer's sub-group size (elements; a multiple of 2048), for the scratch buffers.
  ParamFile(const ParamFileOptions& o, int rank, DType dtype, int64_t numel, const void* initial,
            int64_t group, const std::function<void(const std::string&)>& log);
  ~ParamFile();

  void prefetch(int key, int64_t begin, int64_t n);
  bool staged(int key) const { return staged_.count(key) != 0; }
  const void* get(int key, int64_t begin, int64_t n);
  void drop(int key);
  void drop_all();
  int64_t staged_elements() const { return staged_elements_; }
  int64_t budget() const { return o_.buffer_count * o_.buffer_size; }

  // Elements [begin, begin + n) of new values (begin a multiple of 2048): fill scratch(), then
  // write(); flush() before the next get().
  void* scratch(int64_t begin, int64_t n);
  void write(int64_t begin, int64_t n);
  void flush();
  // The [begin, end) ranges of write()s that have completed (on disk, or in the RAM part: readable
  // by get()) since the last call; on the thread that writes.
  std::vector<std::pair<int64_t, int64_t>> take_durable();

  int64_t ram_elements() const { return ram_end_; }
  int64_t disk_bytes() const { return disk_bytes_; }
  io::Counters counters() const;
  double read_wait_seconds() const { return read_wait_.load(); }    // in get() and drop()
  double write_wait_seconds() const { return write_wait_.load(); }  // in scratch() and flush()
  std::string describe() const;

 private:
  struct Staged {
    io::AlignedBuffer buf;
    int64_t skip = 0;  // bytes from the buffer's start to the piece
    int64_t numel = 0;
    std::vector<io::Ticket> tickets;
  };
  ParamFileOptions o_;
  DType dtype_;
  int64_t esize_, numel_, ram_end_ = 0, disk_bytes_ = 0;
  io::AlignedBuffer ram_;  // [0, ram_end) elements
  std::unique_ptr<io::SwapDir> dir_;
  bool direct_ = false;
  io::File file_;
  std::unique_ptr<io::Engine> engine_;        // reads
  std::unique_ptr<io::Engine> write_engine_;  // writes
  std::unordered_map<int, Staged> staged_;
  int64_t staged_elements_ = 0;
  io::AlignedBuffer scratch_[2];
  io::Ticket scratch_ticket_[2] = {0, 0};
  int64_t scratch_begin_[2] = {0, 0}, scratch_end_[2] = {0, 0};  // the write in flight from each
  int next_scratch_ = 0;
  std::vector<std::pair<int64_t, int64_t>> durable_;  // take_durable()
  std::atomic<double> read_wait_{0}, write_wait_{0};
  void wait_read(io::Ticket t);   // engine_->wait, timed
  void wait_write(int slot);      // the write from scratch_[slot], timed; records it in durable_
};

}  // namespace ds::zero::detail
