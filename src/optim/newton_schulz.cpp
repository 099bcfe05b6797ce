// Newton-Schulz orthogonalisation for Muon (optim/muon.h), in fp32 through the loaded BLAS.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../backend/cpu/cpu_backend.h"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/optim/muon.h"

namespace ds::optim {

namespace {

using backend::sgemm;

// bf16 operands (DeepSpeed's GPU precision) through oneDNN, fp32 accumulation and results; set
// per call of newton_schulz (one thread runs it: the GEMMs themselves are parallel).
thread_local bool t_bf16 = false;
thread_local std::vector<uint16_t> t_a16, t_b16;

void to_bf16(const float* x, int64_t n, std::vector<uint16_t>& out) {
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = float_to_bf16(x[i]);
}

// c (m, n) = alpha * op(a) op(b) + beta * c, row-major, a (m, k) or (k, m), b (k, n) or (n, k).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (t_bf16) {
    to_bf16(a, m * k, t_a16);
    to_bf16(b, k * n, t_b16);
    if (backend::onednn_gemm_bf16(ta, tb, m, n, k, alpha, t_a16.data(), lda, t_b16.data(), ldb,
                                  beta, c, ldc))
      return;
  }
  sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// c (n, n) = alpha * a (n, k) a^T + beta * c
void gram(const float* a, int64_t n, int64_t k, float alpha, float beta, float* c) {
  gemm(false, true, n, n, k, alpha, a, k, a, k, beta, c, n);
}

// c (m, n) = alpha * a (m, k) b (k, n) + beta * c
void mm(const float* a, const float* b, int64_t m, int64_t n, int64_t k, float alpha, float beta,
        float* c) {
  gemm(false, false, m, n, k, alpha, a, k, b, n, beta, c, n);
}

// z (n, n) = b * r + c * r r
void quintic_poly(const float* r, int64_t n, float* z) {
  std::memcpy(z, r, static_cast<size_t>(n * n) * sizeof(float));
  mm(r, r, n, n, n, kNsC, kNsB, z);
}

// The standard iteration on x (n, m), n <= m: X = a X + (b A + c A A) X with A = X X^T.
void ns_standard(float* x, int64_t n, int64_t m, int steps) {
  std::vector<float> a(static_cast<size_t>(n * n)), b(static_cast<size_t>(n * n));
  std::vector<float> y(static_cast<size_t>(n * m));
  for (int i = 0; i < steps; ++i) {
    gram(x, n, m, 1.0f, 0.0f, a.data());
    quintic_poly(a.data(), n, b.data());
    std::memcpy(y.data(), x, y.size() * sizeof(float));
    mm(b.data(), y.data(), n, m, n, 1.0f, kNsA, x);  // x = a * y + B y
  }
}

// The Gram iteration on x (n, m), n < m (DeepSpeed's zeropower_via_gram_newtonschulz): iterates
// on R = X X^T and accumulates Q with X_final = Q X, restarting from X = Q X at step 2.
void ns_gram(float* x, int64_t n, int64_t m, int steps) {
  const size_t nn = static_cast<size_t>(n * n);
  std::vector<float> r(nn), z(nn), q(nn), t(nn), y(static_cast<size_t>(n * m));
  constexpr int kRestart = 2;
  bool have_q = false;
  gram(x, n, m, 1.0f, 0.0f, r.data());
  auto apply_q = [&] {  // x = Q x
    std::memcpy(y.data(), x, y.size() * sizeof(float));
    mm(q.data(), y.data(), n, m, n, 1.0f, 0.0f, x);
  };
  for (int i = 0; i < steps; ++i) {
    if (i == kRestart) {
      apply_q();
      gram(x, n, m, 1.0f, 0.0f, r.data());
      have_q = false;
    }
    quintic_poly(r.data(), n, z.data());
    if (!have_q) {
      q = z;
      for (int64_t d = 0; d < n; ++d) q[static_cast<size_t>(d * n + d)] += kNsA;
      have_q = true;
    } else {
      t = q;
      mm(z.data(), t.data(), n, n, n, 1.0f, kNsA, q.data());  // Q = a Q + Z Q
    }
    if (i < steps - 1 && i + 1 != kRestart) {
      t = r;
      mm(z.data(), r.data(), n, n, n, 1.0f, kNsA, t.data());  // RZ = a R + Z R
      r = t;
      mm(z.data(), t.data(), n, n, n, 1.0f, kNsA, r.data());  // R = a RZ + Z RZ
    }
  }
  if (have_q) apply_q();
}

}  // namespace

void newton_schulz(float* x, int64_t rows, int64_t cols, int steps, NsMethod method,
                   bool bf16_operands) {
  t_bf16 = bf16_operands;
  DS_CHECK(rows > 0 && cols > 0 && steps >= 0,
           "[muon] newton_schulz: bad shape ({}, {}) or steps {}", rows, cols, steps);
  const int64_t numel = rows * cols;
  // Work on the wide orientation (n <= m): A = X X^T is then the smaller Gram matrix.
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows, m = tall ? rows : cols;
  std::vector<float> w(static_cast<size_t>(numel));
  double ss = 0;
  for (int64_t i = 0; i < numel; ++i) ss += static_cast<double>(x[i]) * x[i];
  // Frobenius norm <= 1 bounds the spectral norm by 1, where the iteration converges.
  const float inv = 1.0f / (static_cast<float>(std::sqrt(ss)) + 1e-7f);
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        w[static_cast<size_t>(j * rows + i)] = x[i * cols + j] * inv;
  } else {
    for (int64_t i = 0; i < numel; ++i) w[static_cast<size_t>(i)] = x[i] * inv;
  }
  if (method == NsMethod::gram && n < m)
    ns_gram(w.data(), n, m, steps);
  else
    ns_standard(w.data(), n, m, steps);
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) x[i * cols + j] = w[static_cast<size_t>(j * rows + i)];
  } else {
    std::memcpy(x, w.data(), static_cast<size_t>(numel) * sizeof(float));
  }
}

}  // namespace ds::optim
