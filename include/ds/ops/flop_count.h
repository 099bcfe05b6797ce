#pragma once
// What each op costs, reported to whoever is listening on this thread (the flops profiler,
// runtime/flops_profiler.h). An op reports its forward cost once per call, counted as DeepSpeed's
// flops profiler counts the torch function it corresponds to (deepspeed/profiling/flops_profiler):
//
//   linear (..., K) x (N, K)        MACs = rows * K * N, FLOPs = 2 MACs (the bias is not counted)
//   matmul (..., M, K) @ (.., K, N) MACs = numel(a) * N, FLOPs = 2 MACs
//   attention q (B,NH,Tq,hd), k/v   MACs = numel(q) * Tk + B*NH*Tq * Tk * hd, FLOPs = 2 MACs
//                                   (masked positions count, as F.scaled_dot_product_attention's)
//   linear_cross_entropy (N,C) (V,C) the linear's: MACs = N * C * V (the loss itself: 0, as
//                                   F.cross_entropy is not counted)
//   add/sub/mul/div, the unary      FLOPs = numel of the result, no MACs (swiglu: silu's numel,
//   math ops, activations, softmax  the product as torch's `*`, which DeepSpeed does not count)
//   layer_norm                      FLOPs = 5 * numel (4 without weight), DeepSpeed's estimate
//   rms_norm, rope                  FLOPs = 4 * numel, 3 * numel: our estimates (DeepSpeed has
//                                   no rule: HF models build them from ops it does not count)
//   embedding, dropout, shape ops,  0
//   sum/max, cross entropy, casts
//
// An op that calls other ops counts once (the outer call): nested reports are dropped. Only the
// call itself is counted, never its backward: the profiler listens during forward only, and the
// backward's FLOPs are derived from the forward's (2x, plus recompute), as DeepSpeed does.
//
// Threading: the sink is per thread (the thread that calls the ops); nothing is shared.
#include <cstdint>

namespace ds::ops {

struct OpCost {
  double flops = 0;
  double macs = 0;
  // The share of flops in GEMM-class ops (linear, matmul, attention, the fused linear of
  // linear_cross_entropy): what torch.utils.flop_counter counts.
  double gemm_flops = 0;
};

// Receives one report per op call while installed.
class FlopSink {
 public:
  virtual ~FlopSink() = default;
  virtual void add(const char* op, const OpCost& cost) = 0;
};

// Installs `sink` on this thread for its lifetime (the previous one is restored after).
class FlopCounting {
 public:
  explicit FlopCounting(FlopSink* sink);
  ~FlopCounting();
  FlopCounting(const FlopCounting&) = delete;
  FlopCounting& operator=(const FlopCounting&) = delete;

 private:
  FlopSink* prev_;
};

namespace detail {

// True when a sink listens on this thread (ops skip computing their cost otherwise).
bool counting_flops();

// Reports `cost` for the op `name` when a sink listens and no enclosing op is reporting; for its
// lifetime, reports of the ops it calls are dropped.
class CountOp {
 public:
  CountOp(const char* name, const OpCost& cost);
  ~CountOp();
  CountOp(const CountOp&) = delete;
  CountOp& operator=(const CountOp&) = delete;

 private:
  bool active_ = false;  // a sink listened at construction: this call holds one depth level
};

// Costs of the common shapes (see the table above).
inline OpCost gemm_cost(double macs) { return {2 * macs, macs, 2 * macs}; }
inline OpCost elementwise_cost(double elements, double per_element = 1) {
  return {elements * per_element, 0, 0};
}

}  // namespace detail
}  // namespace ds::ops
