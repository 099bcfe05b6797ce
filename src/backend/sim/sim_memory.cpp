// The sim device's allocator (sim_memory.h).
#include "backend/sim/sim_memory.h"

#include <fmt/format.h>

#include "ds/core/error.h"

namespace ds::backend {
namespace {

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

class SimAllocator final : public Allocator {
 public:
  explicit SimAllocator(const std::atomic<uint64_t>& limit)
      : shadow_(new_caching_cpu_allocator()), limit_(limit) {}

  void* allocate(size_t nbytes) override {
    if (const uint64_t limit = limit_.load(); limit > 0) {
      const uint64_t in_use = shadow_->stats().bytes_in_use;
      DS_CHECK(in_use + nbytes <= limit,
               "[sim:0] out of memory allocating {}: the process's device memory limit is {} "
               "(--device_memory_limit) and {} is in use by tensors. Lower the micro-batch size, "
               "turn on activation checkpointing, or raise the limit",
               gib(nbytes), gib(limit), gib(in_use));
    }
    return device_address(shadow_->allocate(nbytes));
  }
  void deallocate(void* ptr, size_t nbytes) override {
    DS_CHECK(ptr == nullptr || is_sim_address(ptr),
             "[sim:0] deallocate of {} bytes at host address {}: not sim memory", nbytes, ptr);
    shadow_->deallocate(host_address(ptr), nbytes);
  }
  AllocatorStats stats() const override { return shadow_->stats(); }
  void reset_peak() override { shadow_->reset_peak(); }
  void empty_cache() override { shadow_->empty_cache(); }

 private:
  std::unique_ptr<Allocator> shadow_;
  const std::atomic<uint64_t>& limit_;
};

}  // namespace

std::unique_ptr<Allocator> new_sim_allocator(const std::atomic<uint64_t>& limit) {
  return std::make_unique<SimAllocator>(limit);
}

}  // namespace ds::backend
