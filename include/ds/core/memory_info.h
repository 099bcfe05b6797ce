#pragma once
// How much memory this process may still take: MemAvailable from /proc/meminfo, lowered to the
// room left under a cgroup v2 limit (memory.max - memory.current; containers), and to
// DS_MEMORY_LIMIT=<bytes>[K|M|G] when set (plan for a smaller machine, or leave room for other
// jobs). 0 when nothing can be read. Every tool that is about to build a model asks this first.
// Thread-safe (reads files).
#include <cstdint>

namespace ds {

int64_t available_memory_bytes();

}  // namespace ds
