// oneDNN's GEMMs, loaded at run time as the BLAS is (blas.cpp).
//
// Why oneDNN: the BLAS we load (Debian's OpenBLAS 0.3.21, and the PyPI wheels) has no bf16 GEMM
// (cblas_sbgemm), so a bf16 product was two widened fp32 copies and an sgemm. oneDNN is PyTorch's
// CPU path: dnnl_gemm_bf16bf16f32 runs on AVX512-BF16 (vdpbf16ps) and AMX-BF16 tiles with fp32
// accumulation, on row-major operands as cblas takes them. libdnnl exports it (version 2 and 3)
// without declaring it in dnnl.h, so its signature is written here from its definition (oneDNN
// src/common/gemm.cpp): char transa/transb ('N'/'T'), dnnl_dim_t (int64_t) sizes and leading
// dimensions, bf16 operands as raw uint16_t bits, an fp32 C, dnnl_status_t (0 = success).
// dnnl_sgemm (declared in dnnl.h, same convention) is the fp32 GEMM blas.cpp uses instead of the
// BLAS when DS_FP32_GEMM=onednn asks for it (blas.cpp says why it is not the default).
//
// A bf16 product whose result is wanted in bf16 (ops::linear's output and gradients) goes through
// oneDNN's matmul primitive with a bf16 destination instead: the fp32 accumulators are rounded in
// registers, so no fp32 copy of the result is written and read back. Primitives are made per shape
// and kept (a model has a handful of shapes); the C API of oneDNN 2.x is compiled in when its
// header is present (Debian's libdnnl-dev) and used only when the loaded library is a 2.x.
//
// fp16 products (fp32 or fp16 C) go through the same matmul primitive with f16 operands, on CPUs
// with fp16 units (AVX512-FP16: Sapphire Rapids on; AMX-FP16: Granite Rapids) and only when the
// loaded oneDNN has a kernel for them: at load a probe primitive is made and its implementation
// name read; a reference ("ref:") implementation, or none, leaves fp16 on the conversion path
// (both operands widened to fp32 for sgemm), which is what an AVX512-BF16-only CPU such as Zen 4/5
// gets. DS_FP16_GEMM=auto|onednn|convert chooses; the start-up line says which and why.
//
// Why dlopen: the library is optional (an AVX2-only CPU keeps the BLAS path; a machine without
// libdnnl still builds and runs), and DS_ONEDNN_LIBRARY names another build, as DS_BLAS_LIBRARY
// does for the BLAS. oneDNN's OpenMP runtime is libgomp, the one our kernels and OpenBLAS share.
#include <dlfcn.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#if DNNL_VERSION_MAJOR == 2
#define DS_ONEDNN_MATMUL 1
#endif
#endif

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

using GemmBf16Fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                           const uint16_t*, int64_t, float, float*, int64_t);
using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);
struct DnnlVersion {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
using VersionFn = const DnnlVersion* (*)();

#ifdef DS_ONEDNN_MATMUL
// The entry points of oneDNN 2.x's C API that a matmul needs, looked up in the loaded library.
struct MatmulApi {
  decltype(&dnnl_engine_create) engine_create = nullptr;
  decltype(&dnnl_stream_create) stream_create = nullptr;
  decltype(&dnnl_memory_desc_init_by_strides) md_init = nullptr;
  decltype(&dnnl_matmul_desc_init) matmul_init = nullptr;
  decltype(&dnnl_primitive_attr_create) attr_create = nullptr;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy = nullptr;
  decltype(&dnnl_post_ops_create) post_ops_create = nullptr;
  decltype(&dnnl_post_ops_destroy) post_ops_destroy = nullptr;
  decltype(&dnnl_post_ops_append_sum) append_sum = nullptr;
  decltype(&dnnl_primitive_attr_set_post_ops) set_post_ops = nullptr;
  decltype(&dnnl_primitive_desc_create) pd_create = nullptr;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy = nullptr;
  decltype(&dnnl_primitive_desc_query) pd_query = nullptr;
  decltype(&dnnl_primitive_create) primitive_create = nullptr;
  decltype(&dnnl_memory_create) memory_create = nullptr;
  decltype(&dnnl_memory_destroy) memory_destroy = nullptr;
  decltype(&dnnl_primitive_execute) execute = nullptr;
  decltype(&dnnl_stream_wait) stream_wait = nullptr;

  bool load(void* h) {
    auto get = [h](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      return fn != nullptr;
    };
    return get(engine_create, "dnnl_engine_create") && get(stream_create, "dnnl_stream_create") &&
           get(md_init, "dnnl_memory_desc_init_by_strides") &&
           get(matmul_init, "dnnl_matmul_desc_init") &&
           get(attr_create, "dnnl_primitive_attr_create") &&
           get(attr_destroy, "dnnl_primitive_attr_destroy") &&
           get(post_ops_create, "dnnl_post_ops_create") &&
           get(post_ops_destroy, "dnnl_post_ops_destroy") &&
           get(append_sum, "dnnl_post_ops_append_sum") &&
           get(set_post_ops, "dnnl_primitive_attr_set_post_ops") &&
           get(pd_create, "dnnl_primitive_desc_create") &&
           get(pd_destroy, "dnnl_primitive_desc_destroy") &&
           get(pd_query, "dnnl_primitive_desc_query") &&
           get(primitive_create, "dnnl_primitive_create") &&
           get(memory_create, "dnnl_memory_create") &&
           get(memory_destroy, "dnnl_memory_destroy") &&
           get(execute, "dnnl_primitive_execute") && get(stream_wait, "dnnl_stream_wait");
  }
};
#endif

struct OneDnn {
  GemmBf16Fn gemm_bf16 = nullptr;  // set when the CPU has bf16 units (or DS_BF16_GEMM=onednn)
  SgemmFn sgemm = nullptr;         // set whenever the library loaded
  bool matmul = false;             // the bf16-destination matmul is usable
  bool f16 = false;                // fp16 products run on oneDNN's f16 matmul
  std::string library;             // the file loaded ("" when none)
  std::string version;             // "2.6.3"
  std::string why_not;             // why the bf16 path is not used, for onednn_gemm_info
  std::string f16_impl;            // the f16 kernel oneDNN chose ("brg:avx512_core_fp16")
  std::string f16_why_not;         // why fp16 products are converted, for onednn_f16_info
#ifdef DS_ONEDNN_MATMUL
  MatmulApi api;
  dnnl_engine_t engine = nullptr;
#endif
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

bool cpu_has_fp16_units() {
#if defined(__x86_64__)
  // AVX512-FP16 (CPUID.7.0:EDX[23]) or AMX-FP16 (CPUID.7.1:EAX[21]); avx512f's check also says the
  // OS saves the zmm state.
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool fp16 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 23) & 1);
  const bool amx = __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 21) & 1);
  return fp16 || amx;
#else
  return false;
#endif
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

OneDnn load_onednn() {
  OneDnn o;
  const std::string bf16_mode = env_or("DS_BF16_GEMM", "auto");
  const std::string fp32_mode = env_or("DS_FP32_GEMM", "auto");
  const std::string matmul_mode = env_or("DS_ONEDNN_MATMUL", "1");
  DS_CHECK(matmul_mode == "0" || matmul_mode == "1",
           "[cpu:gemm] DS_ONEDNN_MATMUL={} is not 0 or 1", matmul_mode);
  const std::string f16_mode = env_or("DS_FP16_GEMM", "auto");
  DS_CHECK(f16_mode == "auto" || f16_mode == "onednn" || f16_mode == "convert",
           "[cpu:gemm] DS_FP16_GEMM={} is not one of auto, onednn, convert", f16_mode);
  const bool want_bf16 = bf16_mode == "onednn" || (bf16_mode == "auto" && cpu_has_bf16_units());
  const bool want_fp32 = fp32_mode == "onednn";  // opt-in: blas.cpp says why
  const bool want_f16 = f16_mode == "onednn" || (f16_mode == "auto" && cpu_has_fp16_units());
  if (bf16_mode != "onednn" && bf16_mode != "auto")
    o.why_not = fmt::format("DS_BF16_GEMM={}", bf16_mode);
  else if (!want_bf16)
    o.why_not = "this CPU has no AVX512-BF16 or AMX-BF16";
  if (f16_mode == "convert")
    o.f16_why_not = "DS_FP16_GEMM=convert";
  else if (!want_f16)
    o.f16_why_not = "this CPU has no AVX512-FP16 or AMX-FP16";
  if (!want_bf16 && !want_fp32 && !want_f16) return o;
  std::vector<std::string> candidates;
  if (const char* lib = std::getenv("DS_ONEDNN_LIBRARY")) candidates.emplace_back(lib);
  candidates.insert(candidates.end(), {"libdnnl.so.3", "libdnnl.so.2", "libdnnl.so"});
  for (const auto& name : candidates) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto bf16 = reinterpret_cast<GemmBf16Fn>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    auto sg = reinterpret_cast<SgemmFn>(dlsym(h, "dnnl_sgemm"));
    if (!bf16 || !sg) continue;
    if (want_bf16) o.gemm_bf16 = bf16;
    o.sgemm = sg;
    o.library = name;
    int major = 0;
    if (auto v = reinterpret_cast<VersionFn>(dlsym(h, "dnnl_version"))) {
      o.version = fmt::format("{}.{}.{}", v()->major, v()->minor, v()->patch);
      major = v()->major;
    }
#ifdef DS_ONEDNN_MATMUL
    const bool api = major == DNNL_VERSION_MAJOR && o.api.load(h) &&
                     o.api.engine_create(&o.engine, dnnl_cpu, 0) == dnnl_success;
    o.matmul = api && o.gemm_bf16 && matmul_mode == "1";
    if (want_f16 && !api)
      o.f16_why_not = fmt::format("oneDNN {} is not the 2.x whose matmul API this build uses",
                                  o.version);
    else if (want_f16)
      o.f16_why_not = "";  // probe_f16 decides
#else
    (void)major;
    if (want_f16) o.f16_why_not = "this build has no oneDNN matmul (no <oneapi/dnnl/dnnl.h>)";
#endif
    return o;
  }
  if (want_bf16) o.why_not = "no libdnnl found (scripts/setup.sh installs libdnnl-dev)";
  if (want_f16) o.f16_why_not = "no libdnnl found (scripts/setup.sh installs libdnnl-dev)";
  return o;
}

#ifdef DS_ONEDNN_MATMUL
// One matmul primitive per operand type and layout: C (batch, m, n) [+]= op(A) (batch, m, k) @
// op(B) (batch, k, n), A and B in `ab` (bf16 or f16), C in `c` (f32, bf16 or f16), each operand's
// items a constant stride apart.
struct MatmulShape {
  dnnl_data_type_t ab, c;
  bool ta, tb;
  int64_t batch, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  bool accumulate;
  auto key() const {
    return std::tuple{ab, c, ta, tb, batch, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c,
                      accumulate};
  }
};

std::string status_name(dnnl_status_t st) {
  switch (st) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_runtime_error: return "runtime error";
    default: return fmt::format("status {}", static_cast<int>(st));
  }
}

const char* type_name(dnnl_data_type_t t) {
  return t == dnnl_bf16 ? "bf16" : t == dnnl_f16 ? "fp16" : t == dnnl_f32 ? "fp32" : "?";
}
using MatmulKey = decltype(MatmulShape{}.key());

dnnl_memory_desc_t matrix_desc(const MatmulApi& api, dnnl_data_type_t type, int64_t batch,
                               int64_t rows, int64_t cols, int64_t ld, bool trans, int64_t stride) {
  // A row-major matrix (rows, cols) with leading dimension ld, or the transpose of one; batch of
  // them `stride` elements apart (a 3-d descriptor) when batch > 1.
  dnnl_memory_desc_t md;
  const int nd = batch > 1 ? 3 : 2;
  const dnnl_dims_t dims2 = {rows, cols}, strides2 = {trans ? 1 : ld, trans ? ld : 1};
  const dnnl_dims_t dims3 = {batch, rows, cols},
                    strides3 = {stride, trans ? 1 : ld, trans ? ld : 1};
  DS_CHECK(api.md_init(&md, nd, nd == 3 ? dims3 : dims2, type,
                       nd == 3 ? strides3 : strides2) == dnnl_success,
           "[cpu:gemm] oneDNN refused {} ({}, {}) {} matrices with leading dimension {}", batch,
           rows, cols, type_name(type), ld);
  return md;
}

struct MatmulDescs {
  dnnl_memory_desc_t a, b, c;
};
MatmulDescs descs_of(const MatmulApi& api, const MatmulShape& s) {
  return {matrix_desc(api, s.ab, s.batch, s.m, s.k, s.lda, s.ta, s.stride_a),
          matrix_desc(api, s.ab, s.batch, s.k, s.n, s.ldb, s.tb, s.stride_b),
          matrix_desc(api, s.c, s.batch, s.m, s.n, s.ldc, false, s.stride_c)};
}

// The primitive descriptor for a shape (nullptr when oneDNN has no implementation: *status says
// why); the caller destroys it.
dnnl_primitive_desc_t matmul_pd(const OneDnn& o, const MatmulShape& s, dnnl_status_t* status) {
  const MatmulApi& api = o.api;
  const MatmulDescs d = descs_of(api, s);
  dnnl_matmul_desc_t desc;
  DS_CHECK(api.matmul_init(&desc, &d.a, &d.b, nullptr, &d.c) == dnnl_success,
           "[cpu:gemm] oneDNN refused a matmul of {} x M {} N {} K {}", s.batch, s.m, s.n, s.k);
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post = nullptr;
  DS_CHECK(api.attr_create(&attr) == dnnl_success, "[cpu:gemm] oneDNN: no primitive attributes");
  if (s.accumulate) {  // C += product: a sum post-op (C read in fp32, the total rounded once)
    DS_CHECK(api.post_ops_create(&post) == dnnl_success && api.append_sum(post, 1.0f) == dnnl_success &&
                 api.set_post_ops(attr, post) == dnnl_success,
             "[cpu:gemm] oneDNN: no sum post-op");
  }
  dnnl_primitive_desc_t pd = nullptr;
  *status = api.pd_create(&pd, &desc, attr, o.engine, nullptr);
  if (post) api.post_ops_destroy(post);
  api.attr_destroy(attr);
  return *status == dnnl_success ? pd : nullptr;
}

// The env switch that takes a product of this type off oneDNN, for messages.
const char* convert_switch(const MatmulShape& s) {
  return s.ab == dnnl_f16 ? "DS_FP16_GEMM=convert" : "DS_BF16_GEMM=convert";
}

dnnl_primitive_t make_matmul(const OneDnn& o, const MatmulShape& s) {
  const MatmulApi& api = o.api;
  dnnl_status_t st = dnnl_success;
  const dnnl_primitive_desc_t pd = matmul_pd(o, s, &st);
  DS_CHECK(pd, "[cpu:gemm] oneDNN has no {} matmul for {} x M {} N {} K {} ({}); set {} to use "
           "the fp32 path", type_name(s.ab), s.batch, s.m, s.n, s.k, status_name(st),
           convert_switch(s));
  dnnl_primitive_t p = nullptr;
  const dnnl_status_t st2 = api.primitive_create(&p, pd);
  api.pd_destroy(pd);
  DS_CHECK(st2 == dnnl_success, "[cpu:gemm] oneDNN could not create a {} matmul for {} x M {} "
           "N {} K {} (status {})", type_name(s.ab), s.batch, s.m, s.n, s.k,
           static_cast<int>(st2));
  return p;
}

// Whether oneDNN runs fp16 products on this CPU's fp16 units: a probe matmul (fp16 operands, fp32
// result) must exist and not be a reference implementation (ref: kernels are scalar loops, far
// slower than converting to fp32 for the BLAS).
void probe_f16(OneDnn& o) {
  const MatmulShape probe{dnnl_f16, dnnl_f32, false, false, 1, 64, 64, 64, 64, 64, 64, 0, 0, 0,
                          false};
  dnnl_status_t st = dnnl_success;
  const dnnl_primitive_desc_t pd = matmul_pd(o, probe, &st);
  if (!pd) {
    o.f16_why_not = fmt::format("oneDNN {} has no fp16 matmul for this CPU: {}", o.version,
                                status_name(st));
    return;
  }
  const char* impl = nullptr;
  if (o.api.pd_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) impl = "?";
  o.f16_impl = impl;
  o.api.pd_destroy(pd);
  if (o.f16_impl.rfind("ref", 0) == 0 || o.f16_impl == "?")
    o.f16_why_not = fmt::format("oneDNN {} has only a reference fp16 matmul ({}) on this CPU",
                                o.version, o.f16_impl);
  else
    o.f16 = true;
}

#endif

const OneDnn& onednn() {
  static const OneDnn o = [] {
    OneDnn o = load_onednn();
#ifdef DS_ONEDNN_MATMUL
    if (o.engine && o.f16_why_not.empty()) probe_f16(o);
#endif
    return o;
  }();
  return o;
}

#ifdef DS_ONEDNN_MATMUL
// The primitive for a shape, made on first use. Primitives are kept for the process (a model has
// a handful of shapes; a run with a new length per batch makes one per length, each ~1 ms, up to
// kMaxPrimitives, after which new shapes fall back to the fp32-destination GEMM).
dnnl_primitive_t matmul_for(const OneDnn& o, const MatmulShape& s) {
  constexpr size_t kMaxPrimitives = 512;
  static std::mutex mu;
  static std::map<MatmulKey, dnnl_primitive_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(s.key()); it != cache.end()) return it->second;
  if (cache.size() >= kMaxPrimitives) return nullptr;
  return cache[s.key()] = make_matmul(o, s);
}
#endif

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

bool onednn_matmul(DType ab, DType c_type, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                   int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                   int64_t ldb, int64_t stride_b, bool accumulate, void* c, int64_t ldc,
                   int64_t stride_c) {
#ifdef DS_ONEDNN_MATMUL
  const OneDnn& o = onednn();
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return false;
  // bf16 operands: only for a bf16 C (an fp32 C takes dnnl_gemm_bf16bf16f32); fp16: when probed.
  const bool usable = ab == DType::bf16 ? o.matmul && c_type == DType::bf16
                      : ab == DType::f16 ? o.f16 && (c_type == DType::f16 || c_type == DType::f32)
                                         : false;
  if (!usable) return false;
  auto type_of = [](DType t) {
    return t == DType::bf16 ? dnnl_bf16 : t == DType::f16 ? dnnl_f16 : dnnl_f32;
  };
  if (batch == 1) stride_a = stride_b = stride_c = 0;  // one key for every single product
  const MatmulShape shape{type_of(ab), type_of(c_type), ta, tb, batch, m, n, k, lda, ldb, ldc,
                          stride_a, stride_b, stride_c, accumulate};
  const dnnl_primitive_t p = matmul_for(o, shape);
  if (!p) return false;
  const MatmulApi& api = o.api;
  // A stream per thread (streams are not shared between threads); memory objects per call (they
  // only wrap the pointers).
  thread_local dnnl_stream_t stream = nullptr;
  if (!stream)
    DS_CHECK(api.stream_create(&stream, o.engine, dnnl_stream_default_flags) == dnnl_success,
             "[cpu:gemm] oneDNN: no stream");
  const MatmulDescs d = descs_of(api, shape);
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr;
  bool ok = api.memory_create(&ma, &d.a, o.engine, const_cast<void*>(a)) == dnnl_success &&
            api.memory_create(&mb, &d.b, o.engine, const_cast<void*>(b)) == dnnl_success &&
            api.memory_create(&mc, &d.c, o.engine, c) == dnnl_success;
  if (ok) {
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    ok = api.execute(p, stream, 3, args) == dnnl_success && api.stream_wait(stream) == dnnl_success;
  }
  for (dnnl_memory_t mem : {ma, mb, mc})
    if (mem) api.memory_destroy(mem);
  DS_CHECK(ok, "[cpu:gemm] oneDNN's {} matmul failed for {} x M {} N {} K {}; set {} to use the "
           "fp32 path", type_name(shape.ab), batch, m, n, k, convert_switch(shape));
  return true;
#else
  (void)ab, (void)c_type, (void)ta, (void)tb, (void)batch, (void)m, (void)n, (void)k, (void)a,
      (void)lda, (void)stride_a, (void)b, (void)ldb, (void)stride_b, (void)accumulate, (void)c,
      (void)ldc, (void)stride_c;
  return false;
#endif
}

bool onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const OneDnn& o = onednn();
  if (!o.sgemm) return false;
  const int status =
      o.sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  DS_CHECK(status == 0,
           "[cpu:gemm] oneDNN's dnnl_sgemm failed (status {}) for M {} N {} K {} (lda {}, ldb {}, "
           "ldc {}); set DS_FP32_GEMM=blas to use the BLAS",
           status, m, n, k, lda, ldb, ldc);
  return true;
}

std::string onednn_gemm_info() {
  const OneDnn& o = onednn();
  if (!o.gemm_bf16) return o.why_not;
  return fmt::format("oneDNN {} ({}, dnnl_gemm_bf16bf16f32{})", o.version, o.library,
                     o.matmul ? "; bf16 results by its matmul primitive" : "");
}

std::string onednn_sgemm_info() {
  const OneDnn& o = onednn();
  return o.sgemm ? fmt::format("oneDNN {} ({}, dnnl_sgemm)", o.version, o.library) : "";
}

std::string onednn_f16_info() {
  const OneDnn& o = onednn();
  if (!o.f16) return o.f16_why_not;
  return fmt::format("oneDNN {} ({}, matmul {})", o.version, o.library, o.f16_impl);
}

bool onednn_gemm_bf16_available() { return onednn().gemm_bf16 != nullptr; }

bool onednn_f16_available() { return onednn().f16; }

bool onednn_sgemm_available() { return onednn().sgemm != nullptr; }

}  // namespace ds::backend
