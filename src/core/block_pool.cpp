// The caching policy shared by every allocator (ds/core/block_pool.h).
#include "ds/core/block_pool.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds {

BlockPool::~BlockPool() {
  for (Block* b : small_free_) delete b;
  for (Block* b : large_free_) delete b;
  for (auto& [p, b] : live_) delete b;
}

size_t BlockPool::round_size(size_t n) {
  if (n == 0) n = 1;
  return (n + kQuantum - 1) / kQuantum * kQuantum;
}

void* BlockPool::allocate(size_t nbytes) {
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  ++stats_.allocations;
  FreeSet& pool = small ? small_free_ : large_free_;
  Block probe{nullptr, size};
  auto it = pool.lower_bound(&probe);
  Block* b = nullptr;
  if (it != pool.end()) {
    b = *it;
    pool.erase(it);
  } else {
    const size_t segment = small            ? kSmallSegment
                           : size < kMidSize ? kMidSegment
                                             : (size + kSegmentQuantum - 1) / kSegmentQuantum *
                                                   kSegmentQuantum;
    b = new_segment(segment, small);
  }
  split(b, size);
  b->free = false;
  live_[b->ptr] = b;
  stats_.bytes_in_use += b->size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return b->ptr;
}

BlockPool::Block* BlockPool::new_segment(size_t size, bool small) {
  void* p = system_.allocate(size, kSegmentQuantum);
  if (!p) {
    release_cached();  // what the cache holds may be enough
    p = system_.allocate(size, kSegmentQuantum);
  }
  if (!p) system_.out_of_memory(size, stats());
  ++stats_.misses;
  ++stats_.segments;
  stats_.bytes_reserved += size;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  return new Block{static_cast<char*>(p), size, true, small};
}

void BlockPool::split(Block* b, size_t size) {
  // The rest stays a free block where it can serve another request of its pool; a sliver of a
  // large block (1 MiB or less) goes with the block instead (PyTorch's rule).
  const size_t rest = b->size - size;
  if (b->small ? rest < kQuantum : rest <= kSmallSize) return;
  auto* r = new Block{b->ptr + size, rest, true, b->small, b, b->next};
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  pool_of(r).insert(r);
}

void BlockPool::deallocate(void* p, size_t nbytes) {
  if (!p) return;
  auto it = live_.find(p);
  DS_CHECK(it != live_.end(), "[allocator] free of {} which this allocator did not hand out", p);
  Block* b = it->second;
  DS_CHECK(round_size(nbytes) <= b->size,
           "[allocator] free of {} as {} bytes: it was handed out as {} bytes", p, nbytes, b->size);
  live_.erase(it);
  stats_.bytes_in_use -= b->size;
  merge_free(b);
}

void BlockPool::merge_free(Block* b) {
  FreeSet& pool = pool_of(b);
  b->free = true;
  if (b->prev && b->prev->free) {  // merge into the free block before
    Block* a = b->prev;
    pool.erase(a);
    absorb_next(a);
    b = a;
  }
  if (b->next && b->next->free) {  // absorb the free block after
    pool.erase(b->next);
    absorb_next(b);
  }
  pool.insert(b);
}

void BlockPool::absorb_next(Block* a) {
  Block* c = a->next;
  a->size += c->size;
  a->next = c->next;
  if (c->next) c->next->prev = a;
  delete c;
}

AllocatorStats BlockPool::stats() const {
  AllocatorStats s = stats_;
  // A free block with a neighbour shares its segment with a block in use (free neighbours merge).
  for (const FreeSet* pool : {&small_free_, &large_free_})
    for (const Block* b : *pool)
      if (b->prev || b->next) s.bytes_inactive_split += b->size;
  return s;
}

void BlockPool::reset_peak() {
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
}

void BlockPool::release_cached() {
  for (FreeSet* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment still in use
        ++it;
        continue;
      }
      system_.release(b->ptr, b->size);
      stats_.bytes_reserved -= b->size;
      --stats_.segments;
      delete b;
      it = pool->erase(it);
    }
  }
}

PooledAllocator::PooledAllocator(std::unique_ptr<SystemMemory> system, bool release_at_exit)
    : system_(std::move(system)), release_at_exit_(release_at_exit), pool_(*system_) {}

PooledAllocator::~PooledAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  if (release_at_exit_) pool_.release_cached();
}

void* PooledAllocator::allocate(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.allocate(nbytes);
}

void PooledAllocator::deallocate(void* p, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_.deallocate(p, nbytes);
}

AllocatorStats PooledAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.stats();
}

void PooledAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_.reset_peak();
}

void PooledAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_.release_cached();
}

}  // namespace ds
