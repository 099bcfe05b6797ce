// CPU kernels of the losses that cross_entropy_forward/backward (nn_kernels.cpp) do not cover:
// binary cross entropy with logits, and the three pieces of the vocabulary-parallel cross entropy
// (tensor parallelism cuts the logits by columns; the caller all-reduces the row statistics).
//
// The arithmetic is that of the host loops these kernels replaced (src/ops/nn.cpp,
// src/nn/tensor_parallel.cpp), so results are bitwise those of before (BCE's sum up to 2^16
// elements: above, it adds fixed tiles of 2^16 in order, deterministic but not the old sequential
// sum's rounding): BCE's terms in double,
// the vocabulary sums of exp in double, the gradients with std::exp in float. Rows are processed
// in one thread each, in a fixed order: no result depends on the thread count.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::backend {
namespace {

void check_f32(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts)
    DS_CHECK(t->dtype() == DType::f32 && t->is_contiguous(),
             "[cpu:{}] kernel takes contiguous fp32, got {} {}{}", op, dtype_name(t->dtype()),
             shape_str(t->shape()), t->is_contiguous() ? "" : " (strided)");
}

// The (N) targets as int64 after checking their dtype and count.
std::vector<int64_t> target_ids(const Tensor& targets, int64_t N, const char* op) {
  DS_CHECK((targets.dtype() == DType::i32 || targets.dtype() == DType::i64) &&
               targets.is_contiguous() && targets.numel() == N,
           "[cpu:{}] targets must be {} contiguous int32/int64 ids, got {} {}", op, N,
           dtype_name(targets.dtype()), shape_str(targets.shape()));
  return targets.to_int_vector();
}

constexpr int64_t kBceTile = 1 << 16;  // BCE sums: fixed tiles, added in order

}  // namespace

// ---- binary cross entropy with logits ----

double CpuBackend::bce_with_logits_sum(const Tensor& x, const Tensor& y) {
  check_f32({&x, &y}, "bce_with_logits");
  DS_CHECK(x.numel() == y.numel(), "[cpu:bce_with_logits] {} logits and {} targets", x.numel(),
           y.numel());
  const int64_t n = x.numel();
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  const int64_t tiles = (n + kBceTile - 1) / kBceTile;
  std::vector<double> partial(static_cast<size_t>(tiles), 0.0);
  parallel_for(tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double acc = 0.0;
      for (int64_t i = t * kBceTile; i < std::min(n, (t + 1) * kBceTile); ++i) {
        const double v = px[i];  // max(x, 0) - x y + log(1 + exp(-|x|)), stable for any x
        acc += std::max(v, 0.0) - v * py[i] + std::log1p(std::exp(-std::abs(v)));
      }
      partial[static_cast<size_t>(t)] = acc;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void CpuBackend::bce_with_logits_backward(const Tensor& x, const Tensor& y, double scale,
                                          const Tensor& dx) {
  check_f32({&x, &y, &dx}, "bce_with_logits_backward");
  DS_CHECK(x.numel() == y.numel() && x.numel() == dx.numel(),
           "[cpu:bce_with_logits_backward] x, y and dx sizes differ: {}, {}, {}", x.numel(),
           y.numel(), dx.numel());
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* pd = dx.data<float>();
  parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)  // (sigmoid(x) - y) * scale
      pd[i] =
          static_cast<float>((1.0 / (1.0 + std::exp(-static_cast<double>(px[i]))) - py[i]) * scale);
  });
}

// ---- vocabulary-parallel cross entropy ----

void CpuBackend::vocab_ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                const Tensor& row_max, const Tensor& target_logit) {
  check_f32({&logits, &row_max, &target_logit}, "vocab_ce_stats");
  const int64_t N = logits.dim() == 2 ? logits.size(0) : -1, Vl = N < 0 ? 0 : logits.size(1);
  DS_CHECK(N >= 0 && row_max.numel() == N && target_logit.numel() == N,
           "[cpu:vocab_ce_stats] logits (N, Vl) and (N) statistics, got {}, {}, {}",
           shape_str(logits.shape()), shape_str(row_max.shape()), shape_str(target_logit.shape()));
  const std::vector<int64_t> t = target_ids(targets, N, "vocab_ce_stats");
  const float* L = logits.data<float>();
  float* M = row_max.data<float>();
  float* TL = target_logit.data<float>();
  parallel_for(N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const float* row = L + n * Vl;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Vl; ++j) m = std::max(m, row[j]);
      M[n] = m;
      const int64_t v = t[static_cast<size_t>(n)] - vocab_begin;  // the target's local column
      TL[n] = (v >= 0 && v < Vl) ? row[v] : 0.0f;
    }
  });
}

void CpuBackend::vocab_ce_sum_exp(const Tensor& logits, const Tensor& row_max,
                                  const Tensor& sum_exp) {
  check_f32({&logits, &row_max, &sum_exp}, "vocab_ce_sum_exp");
  const int64_t N = logits.dim() == 2 ? logits.size(0) : -1, Vl = N < 0 ? 0 : logits.size(1);
  DS_CHECK(N >= 0 && row_max.numel() == N && sum_exp.numel() == N,
           "[cpu:vocab_ce_sum_exp] logits (N, Vl) and (N) statistics, got {}, {}, {}",
           shape_str(logits.shape()), shape_str(row_max.shape()), shape_str(sum_exp.shape()));
  const float* L = logits.data<float>();
  const float* M = row_max.data<float>();
  float* S = sum_exp.data<float>();
  parallel_for(N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const float* row = L + n * Vl;
      double s = 0.0;
      for (int64_t j = 0; j < Vl; ++j) s += std::exp(static_cast<double>(row[j] - M[n]));
      S[n] = static_cast<float>(s);
    }
  });
}

void CpuBackend::vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                   int64_t ignore_index, const Tensor& row_max,
                                   const Tensor& sum_exp, float scale, const Tensor& dlogits) {
  check_f32({&logits, &row_max, &sum_exp, &dlogits}, "vocab_ce_backward");
  const int64_t N = logits.dim() == 2 ? logits.size(0) : -1, Vl = N < 0 ? 0 : logits.size(1);
  DS_CHECK(N >= 0 && dlogits.numel() == N * Vl && row_max.numel() == N && sum_exp.numel() == N,
           "[cpu:vocab_ce_backward] logits and dlogits (N, Vl), (N) statistics; got {}, {}, {}",
           shape_str(logits.shape()), shape_str(dlogits.shape()), shape_str(row_max.shape()));
  const std::vector<int64_t> t = target_ids(targets, N, "vocab_ce_backward");
  const float* L = logits.data<float>();
  const float* M = row_max.data<float>();
  const float* S = sum_exp.data<float>();
  float* D = dlogits.data<float>();
  parallel_for(N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      float* dr = D + n * Vl;
      const int64_t tv = t[static_cast<size_t>(n)];
      if (tv == ignore_index) {
        std::fill(dr, dr + Vl, 0.0f);
        continue;
      }
      const float* row = L + n * Vl;
      const float inv = 1.0f / S[n];
      for (int64_t j = 0; j < Vl; ++j) dr[j] = std::exp(row[j] - M[n]) * inv * scale;
      const int64_t v = tv - vocab_begin;
      if (v >= 0 && v < Vl) dr[v] -= scale;
    }
  });
}

}  // namespace ds::backend
