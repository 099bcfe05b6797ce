#pragma once
// The caching policy behind every allocator of the library: the host's (cpu_allocator), the sim
// device's and the CUDA device's. Memory comes from a system allocator (aligned_alloc, cudaMalloc)
// that is slow (cudaMalloc synchronises the device; fresh host pages fault in at ~2.4 GB/s), so
// freed blocks are kept and handed out again: after the first training step no allocation reaches
// the system (AllocatorStats::misses stops growing).
//
// Two pools, as PyTorch's CUDA caching allocator. Every request is rounded up to 512 B and served
// by a block of a segment obtained from the system; a request takes the smallest free block of
// its pool that fits (best fit), the rest of which stays a free block when it is worth keeping
// (512 B in the small pool, more than 1 MiB in the large one), and a freed block merges with the
// free neighbours of its segment. Memory freed as one size (forward's activations) so serves
// another (backward's gradients); without splitting a process holds the sum of both patterns
// (on GPT-2 124M under ZeRO-2, ~800 MiB per rank more than it ever had in use).
//   small  requests up to 1 MiB, from 2 MiB segments (many small tensors share one);
//   large  requests above 1 MiB, from segments of 20 MiB for requests under 10 MiB (room for the
//          next ones) and of the request rounded up to 2 MiB otherwise.
// Segments are 2 MiB-aligned multiples of 2 MiB (huge pages on the host).
//
// Fragmentation is reported, not hidden: AllocatorStats::bytes_inactive_split counts the free
// bytes inside segments that also hold a block in use (they serve only requests that fit them and
// cannot go back to the system); peak_bytes_reserved against peak_bytes_in_use is the waste at the
// high-water mark (bench/bench_allocator.cpp measures both on a training step's allocations).
//
// The pool never reads or writes the memory it manages (device memory is fine): its block records
// live in host memory of their own.
//
// Ownership: the pool owns its block records; memory goes back to the SystemMemory in
// release_cached() only (the destructor returns nothing: a device context may be gone by then;
// owners that want their host memory back call release_cached() first).
// Threading: none inside; an allocator wraps the pool in its mutex (PooledAllocator below).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "ds/core/allocator.h"

namespace ds {

// Where a pool's memory comes from.
class SystemMemory {
 public:
  virtual ~SystemMemory() = default;
  // nbytes aligned to `align` (a power of two), or nullptr when the system has none left (the pool
  // then returns what it caches and asks once more).
  virtual void* allocate(size_t nbytes, size_t align) = 0;
  virtual void release(void* p, size_t nbytes) = 0;
  // The second attempt failed too: throws the out-of-memory error naming the request and what to
  // change (stats: the pool's, after returning its cache).
  [[noreturn]] virtual void out_of_memory(size_t nbytes, const AllocatorStats& stats) = 0;
};

class BlockPool {
 public:
  static constexpr size_t kQuantum = 512;              // every request rounds up to this
  static constexpr size_t kSmallSize = 1u << 20;       // the small pool's requests: up to 1 MiB
  static constexpr size_t kSmallSegment = 2u << 20;    // the small pool's segments
  static constexpr size_t kMidSize = 10u << 20;        // large requests below this get ...
  static constexpr size_t kMidSegment = 20u << 20;     // ... a segment of this size
  static constexpr size_t kSegmentQuantum = 2u << 20;  // segments: multiples of 2 MiB, so aligned

  explicit BlockPool(SystemMemory& system) : system_(system) {}
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // The size a request of n bytes takes at least (n = 0 takes the smallest block).
  static size_t round_size(size_t n);

  void* allocate(size_t nbytes);
  // nbytes: the size the block was allocated with (checked against the block's record).
  void deallocate(void* p, size_t nbytes);
  AllocatorStats stats() const;
  void reset_peak();
  // Returns every entirely free segment to the system.
  void release_cached();

 private:
  // A piece of a segment; prev/next are its neighbours in address order within the segment.
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    bool free = false;
    bool small = false;  // which pool's segment it belongs to
    Block* prev = nullptr;
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& pool_of(const Block* b) { return b->small ? small_free_ : large_free_; }
  Block* new_segment(size_t size, bool small);
  void split(Block* b, size_t size);
  void merge_free(Block* b);
  static void absorb_next(Block* a);

  SystemMemory& system_;
  FreeSet small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;
  AllocatorStats stats_;
};

// An Allocator over a BlockPool and its SystemMemory, behind one mutex (allocate and deallocate
// from any host thread).
class PooledAllocator final : public Allocator {
 public:
  // release_at_exit: return the cache to the system in the destructor (host memory; a GPU's
  // driver frees device memory at exit itself).
  PooledAllocator(std::unique_ptr<SystemMemory> system, bool release_at_exit);
  ~PooledAllocator() override;

  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;

 private:
  std::unique_ptr<SystemMemory> system_;
  bool release_at_exit_;
  mutable std::mutex mu_;
  BlockPool pool_;
};

}  // namespace ds
