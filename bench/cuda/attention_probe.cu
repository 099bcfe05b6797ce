// Times each tiled-attention kernel on its own with CUDA events (a development probe: it includes
// the kernels' translation unit to reach the individual kernels). Build and run on a GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -Isrc -o probe bench/cuda/attention_probe.cu
//   ./probe [B NH T]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/attention_tiled.cu"

using namespace ds::backend::cuda_kernels;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

template <class F>
float time_ms(F f, int reps = 10) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return ms / reps;
}

int main(int argc, char** argv) {
  const int64_t B = argc > 3 ? std::atoll(argv[1]) : 8, NH = argc > 3 ? std::atoll(argv[2]) : 12,
                T = argc > 3 ? std::atoll(argv[3]) : 1024;
  constexpr int HD = 64;
  const size_t n = static_cast<size_t>(B * NH * T * HD), r = static_cast<size_t>(B * NH * T);
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  float *q, *k, *v, *o, *g, *dq, *dk, *dv, *lse, *delta;
  for (float** p : {&q, &k, &v, &o, &g, &dq, &dk, &dv}) {
    CK(cudaMalloc(p, n * 4));
    CK(cudaMemcpy(*p, h.data(), n * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&lse, r * 4));
  CK(cudaMalloc(&delta, r * 4));
  CK(cudaMemset(delta, 0, r * 4));
  const float scale = 0.125f;
  const dim3 gq(tiles(T), static_cast<unsigned>(B * NH));
  CK(allow_smem(forward_kernel<HD>, forward_smem<HD>()));
  CK(allow_smem(dkdv_kernel<HD>, dkdv_smem<HD>()));
  CK(allow_smem(dq_kernel<HD>, dq_smem<HD>()));
  const double causal_flop = 2.0 * B * NH * T * (T + 1) / 2.0 * HD;  // one causal (T, T) x hd product
  for (bool causal : {true, false}) {
    const double f1 = causal ? causal_flop : 2.0 * B * NH * T * T * HD;
    float fw = time_ms([&] { forward_kernel<HD><<<gq, kThreads, forward_smem<HD>()>>>(q, k, v, NH, T, T, scale, causal, nullptr, o, lse); });
    float kv = time_ms([&] { dkdv_kernel<HD><<<gq, kThreads, dkdv_smem<HD>()>>>(g, q, k, v, lse, delta, NH, T, T, scale, causal, nullptr, dk, dv); });
    float qq = time_ms([&] { dq_kernel<HD><<<gq, kThreads, dq_smem<HD>()>>>(g, q, k, v, lse, delta, NH, T, T, scale, causal, nullptr, dq); });
    std::printf("PROBE causal=%d B=%lld NH=%lld T=%lld hd=%d forward %.3f ms (%.1f TFLOP/s)  dkdv %.3f ms (%.1f)  dq %.3f ms (%.1f)\n",
                causal, (long long)B, (long long)NH, (long long)T, HD, fw, 2 * f1 / fw / 1e9, kv,
                4 * f1 / kv / 1e9, qq, 3 * f1 / qq / 1e9);
  }
  cudaFuncAttributes at;
  for (auto [name, fn] : {std::pair<const char*, const void*>{"forward", (const void*)forward_kernel<HD>},
                          {"dkdv", (const void*)dkdv_kernel<HD>}, {"dq", (const void*)dq_kernel<HD>}}) {
    CK(cudaFuncGetAttributes(&at, fn));
    int blocks = 0;
    size_t smem = std::string(name) == "forward" ? forward_smem<HD>() : std::string(name) == "dkdv" ? dkdv_smem<HD>() : dq_smem<HD>();
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kThreads, smem));
    std::printf("PROBE %s: %d registers, %zu B shared, %d blocks/SM\n", name, at.numRegs, smem, blocks);
  }
  return 0;
}
