#pragma once
// Where this rank's optimizer state lives: the fp32 master weights and the optimizer's moments
// over the strategy's optimizer range [0, optimizer_numel). Two homes:
//
//   host_state_store   in RAM: master() and the optimizer's own buffers (the default).
//   nvme_state_store   ZeRO-Infinity (offload_optimizer.device = "nvme"): sub-groups of
//                      sub_group_size elements in one preallocated swap file per rank, streamed
//                      through `buffer_count` aligned buffers with read-ahead and write-behind,
//                      so reading sub-group k+1, the Adam step on k and writing k-1 overlap.
//                      `ratio` < 1 keeps the first (1 - ratio) of the sub-groups in RAM. In fp32
//                      training the master weights are the parameters and stay in RAM; only the
//                      moments are swapped. Gradients never leave RAM.
//
//   StateStore& store = z->state();              // built by Strategy::attach_optimizer()
//   store.for_each(Access::Update, [&](const StateChunk& c) {         // an optimizer step
//     opt.step_slice(c.master, grads + c.begin, c.states.data(), c.numel, ...);
//   });
//   store.for_each(Access::Read, [&](const StateChunk& c) { ... });    // checkpoints
//
// Chunks come in order of `begin`; a visitor sees each element once. Access::Read does not write
// back; Update reads and writes back; Overwrite does not read (the visitor fills every element)
// and writes back. The chunk's pointers are valid during the visit only. A pass may also take its
// sub-groups in an order decided as it goes (ChunkOrder: the optimizer step during backward,
// strategy.h): sub-group k is elements [k * chunk_numel(), min((k + 1) * chunk_numel(), numel())).
//
// Threading: one thread at a time (the training thread, or the worker of a background step,
// strategy.h); stats() may be called from another thread meanwhile. The NVMe store's I/O runs on
// io::Engine workers. Errors (a full
// disk, EIO) surface as ds::Error from step()/for_each() after every transfer has stopped.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/core/tensor.h"
#include "ds/io/aio.h"
#include "ds/optim/optimizer.h"
#include "ds/zero/defaults.h"

namespace ds::zero {

struct StateChunk {
  int64_t begin = 0, numel = 0;  // elements [begin, begin + numel) of the optimizer range
  float* master = nullptr;       // numel fp32 master weights
  std::vector<float*> states;    // one per optimizer.state_names() entry, numel each
};

enum class Access { Read, Update, Overwrite };

// The sub-group a pass takes next: called on the visiting thread, ahead of the visits (the NVMe
// store reads that far ahead), each index in [0, chunks()) once; -1 ends the pass. A pass visits
// in the order the indices were returned.
using ChunkOrder = std::function<int64_t()>;

// zero_optimization.offload_optimizer with device "nvme", plus sub_group_size and the aio section.
struct NvmeOffloadOptions {
  std::string nvme_path;
  int64_t buffer_count = defaults::kOptimizerBufferCount;
  bool pipeline_read = true;   // read sub-group k+1.. ahead while k is stepped
  bool pipeline_write = true;  // write sub-group k back while k+1 is stepped
  double ratio = 1.0;          // fraction of sub-groups on NVMe (the rest in RAM)
  int64_t sub_group_size = defaults::kSubGroupSize;
  io::AioOptions aio;
};

struct StoreStats {
  int64_t ram_bytes = 0;                      // state and swap buffers held in RAM
  int64_t disk_bytes = 0;                     // reserved on disk
  int64_t bytes_read = 0, bytes_written = 0;  // since construction
  double io_wait_seconds = 0;                 // training thread blocked on I/O, since construction
  double io_busy_seconds = 0;  // I/O outstanding (summed over workers), since construction
};

class StateStore {
 public:
  virtual ~StateStore();
  virtual int64_t numel() const = 0;
  // The optimizer state buffers' names, in StateChunk::states order.
  virtual std::vector<std::string> state_names() const = 0;
  // Sub-groups: chunks() of chunk_numel() elements (the last one shorter).
  virtual int64_t chunk_numel() const = 0;
  int64_t chunks() const;
  // Every sub-group in ascending order.
  void for_each(Access access, const std::function<void(const StateChunk&)>& fn);
  // The sub-groups `order` returns, in that order.
  virtual void for_each(Access access, const ChunkOrder& order,
                        const std::function<void(const StateChunk&)>& fn) = 0;
  // One line for the start-up report.
  virtual std::string describe() const = 0;
  virtual StoreStats stats() const = 0;
  // True when master weights are held only here (not as a RAM tensor of the strategy).
  virtual bool holds_master() const = 0;
  // Starts reading the sub-groups the next for_each visits first into swap buffers that are idle
  // now, so the next optimizer step finds them in RAM (the strategy calls it as the boundary
  // micro-step's backward begins: the disk is nearly idle then). Same thread rule as for_each; a
  // no-op for stores without swap buffers. Returns the bytes whose reads were started.
  virtual int64_t prefetch() { return 0; }
};

// The RAM home: `master` (optimizer_numel fp32) and the optimizer's own buffers, which this
// allocates (opt.init_state). Lamb and SGD step here as one whole range. `chunk` > 0: for_each
// visits chunks of that many elements (parameters on NVMe are written per chunk).
std::unique_ptr<StateStore> host_state_store(Tensor master, optim::Optimizer& opt,
                                             int64_t chunk = 0);

// Fills the initial fp32 master weights of elements [begin, begin + numel) of the optimizer range.
using MasterInit = std::function<void(int64_t begin, int64_t numel, float* out)>;

// The NVMe home for `rank` over `numel` elements, moments zero. When `params_master` is defined
// (fp32 training: the parameters are the master weights) it stays the master and only the moments
// are swapped; otherwise `init` fills the master weights sub-group by sub-group as the swap file is
// first written, so no full fp32 copy needs to exist in RAM. The optimizer must step in slices
// (Adam/AdamW). `log` receives the notices (O_DIRECT fallback, buffer sizing, stale swap folders).
std::unique_ptr<StateStore> nvme_state_store(const NvmeOffloadOptions& o, int rank, int64_t numel,
                                             Tensor params_master, const MasterInit& init,
                                             optim::Optimizer& opt,
                                             const std::function<void(const std::string&)>& log);

}  // namespace ds::zero
