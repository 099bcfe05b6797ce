#pragma once
// Per-op GPU time, for finding where a step goes: with DS_CUDA_PROFILE=1 in the environment, each
// CudaBackend call waits for the GPU before and after itself and adds the wall time between to its
// op's row (calls nested inside another call, such as a copy inside a kernel's argument staging,
// count in the outer one). The table (op, calls, total ms, mean us, share) is printed to stderr at
// exit. Waiting serialises the host and the GPU, so a profiled step is slower than a plain one; the
// shares are what to read. Off (the default), a scope costs one branch.
//
// Threading: the table is shared and locked; nesting is tracked per host thread.
#include <chrono>
#include <string>

namespace ds::backend {

class CudaBackend;

// Whether DS_CUDA_PROFILE is on (read once).
bool cuda_profiling();

class ProfileScope {
 public:
  // detail, when given, splits the op's row (e.g. a GEMM's shape): build it only when
  // cuda_profiling() is true.
  ProfileScope(CudaBackend& backend, const char* op, std::string detail = {});
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  CudaBackend* backend_ = nullptr;  // null when not recording
  std::string op_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ds::backend
