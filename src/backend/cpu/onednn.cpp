// oneDNN's GEMMs, loaded at run time as the BLAS is (blas.cpp), for 16-bit products.
//
// Why oneDNN: the BLAS we load (Debian's OpenBLAS 0.3.21, and the PyPI wheels) has no bf16 GEMM
// (cblas_sbgemm), so a bf16 product was two widened fp32 copies and an sgemm. oneDNN is PyTorch's
// CPU path: dnnl_gemm_bf16bf16f32 runs on AVX512-BF16 (vdpbf16ps) and AMX-BF16 tiles with fp32
// accumulation, on row-major operands as cblas takes them. libdnnl exports it (version 2 and 3)
// without declaring it in dnnl.h, so its signature is written here from its definition (oneDNN
// src/common/gemm.cpp): char transa/transb ('N'/'T'), dnnl_dim_t (int64_t) sizes and leading
// dimensions, bf16 operands as raw uint16_t bits, an fp32 C, dnnl_status_t (0 = success).
//
// Why dlopen: the library is optional (an AVX2-only CPU keeps the fp32 path; a machine without
// libdnnl still builds and runs), and DS_ONEDNN_LIBRARY names another build, as DS_BLAS_LIBRARY
// does for the BLAS. oneDNN's OpenMP runtime is libgomp, the one our kernels and OpenBLAS share.
#include <dlfcn.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

using GemmBf16Fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                           const uint16_t*, int64_t, float, float*, int64_t);
struct DnnlVersion {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
using VersionFn = const DnnlVersion* (*)();

struct OneDnn {
  GemmBf16Fn gemm_bf16 = nullptr;
  std::string library;  // the file loaded ("" when none)
  std::string version;  // "2.6.3"
  std::string why_not;  // why the bf16 path is not used, for gemm_info
};

bool cpu_has_bf16_units() {
#if defined(__x86_64__)
  // AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4/5) or AMX-BF16 (Sapphire Rapids on): without
  // either oneDNN would emulate bf16 with fp32 arithmetic, no faster than converting once.
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1);  // EDX[22] AMX-BF16
  return __builtin_cpu_supports("avx512bf16") || amx;
#else
  return false;
#endif
}

OneDnn load_onednn() {
  OneDnn o;
  const char* mode = std::getenv("DS_BF16_GEMM");
  if (mode && std::string(mode) != "onednn" && std::string(mode) != "auto") {
    o.why_not = fmt::format("DS_BF16_GEMM={}", mode);
    return o;
  }
  const bool forced = mode && std::string(mode) == "onednn";
  if (!forced && !cpu_has_bf16_units()) {
    o.why_not = "this CPU has no AVX512-BF16 or AMX-BF16";
    return o;
  }
  std::vector<std::string> candidates;
  if (const char* lib = std::getenv("DS_ONEDNN_LIBRARY")) candidates.emplace_back(lib);
  candidates.insert(candidates.end(), {"libdnnl.so.3", "libdnnl.so.2", "libdnnl.so"});
  for (const auto& name : candidates) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto fn = reinterpret_cast<GemmBf16Fn>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    if (!fn) continue;
    o.gemm_bf16 = fn;
    o.library = name;
    if (auto v = reinterpret_cast<VersionFn>(dlsym(h, "dnnl_version")))
      o.version = fmt::format("{}.{}.{}", v()->major, v()->minor, v()->patch);
    return o;
  }
  o.why_not = "no libdnnl found (scripts/setup.sh installs libdnnl-dev)";
  return o;
}

const OneDnn& onednn() {
  static const OneDnn o = load_onednn();
  return o;
}

}  // namespace

bool onednn_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  const OneDnn& o = onednn();
  if (!o.gemm_bf16) return false;
  const int status = o.gemm_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                 beta, c, ldc);
  DS_CHECK(status == 0,
           "[cpu:gemm] oneDNN's dnnl_gemm_bf16bf16f32 failed (status {}) for M {} N {} K {} (lda "
           "{}, ldb {}, ldc {}); set DS_BF16_GEMM=convert to use the fp32 path",
           status, m, n, k, lda, ldb, ldc);
  return true;
}

std::string onednn_gemm_info() {
  const OneDnn& o = onednn();
  if (!o.gemm_bf16) return o.why_not;
  return fmt::format("oneDNN {} ({}, dnnl_gemm_bf16bf16f32)", o.version, o.library);
}

bool onednn_gemm_bf16_available() {
  return onednn().gemm_bf16 != nullptr;
}

}  // namespace ds::backend
