#pragma once
// Memory of the sim device (src/backend/sim): addresses the host cannot dereference.
//
// A sim block lives in host memory (its "shadow", from a caching CPU allocator of the device's
// own, so the device's stats() count sim memory only), but the address handed out is the shadow's
// plus kSimAddressOffset. That sum is non-canonical on x86-64 (bit 62 set while bit 56 and
// above are not all equal: 48- and 57-bit address spaces alike) and lies in the kernel half on
// AArch64 (bit 55 set; bit 62 alone would sit in the top byte, which AArch64 Linux ignores for
// user loads): any host load or store through a sim pointer faults at once (SIGSEGV), with no
// mmap, no page protection and no lookup table. Code above the backend that reads a device
// tensor's memory on the host crashes on sim exactly where it would read garbage on a GPU. Only
// the sim backend translates back (host_address: a subtraction) to run the CPU's kernels.
//
// Pointer arithmetic on a sim address (a view's offset) stays far from wrapping, so UBSan's
// pointer-overflow check is quiet; only the dereference faults.
#include <atomic>
#include <cstdint>
#include <memory>

#include "ds/core/allocator.h"

namespace ds::backend {

inline constexpr uintptr_t kSimAddressOffset = (uintptr_t{1} << 62) | (uintptr_t{1} << 55);

// Whether p is a sim address (nullptr is not).
inline bool is_sim_address(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & kSimAddressOffset) == kSimAddressOffset;
}
// The host shadow of a sim address (nullptr stays nullptr).
inline void* host_address(const void* device_ptr) {
  if (device_ptr == nullptr) return nullptr;
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_ptr) - kSimAddressOffset);
}
// The sim address of a host shadow (nullptr stays nullptr).
inline void* device_address(const void* host_ptr) {
  if (host_ptr == nullptr) return nullptr;
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host_ptr) + kSimAddressOffset);
}

// The sim device's allocator: a caching CPU allocator whose blocks are handed out at their sim
// address. `limit` (bytes in use, 0 = none; read at each allocation) caps it: an allocation beyond
// the cap throws "[sim:0] out of memory allocating ...", as the CUDA allocator does under
// --device_memory_limit. Thread-safe as the CPU allocator is.
std::unique_ptr<Allocator> new_sim_allocator(const std::atomic<uint64_t>& limit);

}  // namespace ds::backend
