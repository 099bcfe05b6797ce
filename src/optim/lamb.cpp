// Lamb (DeepSpeed FusedLamb's formula) over segments of a flat buffer. Two passes: the first
// updates the moments and sums ||p||^2 and ||update||^2 per segment, the second recomputes the
// update from (p, m, v) and applies it scaled by the segment's trust ratio. Recomputing reads
// p, m, v once more instead of writing and re-reading an update buffer (cheaper, no scratch).
#include <cmath>
#include <vector>

#include "optim_internal.h"

namespace ds::optim {
namespace {

using detail::Out16;

struct Tile {
  int64_t segment, begin, end;
};

// Per-step constants, shared by both passes so they compute bitwise the same update.
struct LambConsts {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
  float bc1, bc2;   // divide m and v (1 in legacy mode)
  float step_mult;  // multiplies lr (legacy mode: sqrt(bc2) / bc1, else 1)
  bool eps_inside_sqrt;
};

LambConsts make_consts(const LambConfig& c, int64_t step, float grad_scale) {
  DS_CHECK(step >= 1, "[optim] Lamb: step must be >= 1 (1-based count after increment), got {}",
           step);
  check_config(c);
  const double t = static_cast<double>(step);
  LambConsts k{};
  k.grad_scale = grad_scale;
  k.beta1 = c.beta1;
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.beta2 = c.beta2;
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.eps = c.eps;
  k.weight_decay = c.weight_decay;
  const double bc1 = c.bias_correction ? 1.0 - std::pow(double{c.beta1}, t) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(double{c.beta2}, t) : 1.0;
  const bool legacy = c.legacy_bias_correction;
  k.bc1 = legacy ? 1.0f : static_cast<float>(bc1);
  k.bc2 = legacy ? 1.0f : static_cast<float>(bc2);
  k.step_mult = legacy ? static_cast<float>(std::sqrt(bc2) / bc1) : 1.0f;
  k.eps_inside_sqrt = c.eps_inside_sqrt;
  return k;
}

// update = m_hat / denom + wd * p; explicit fma so both passes (and any compiler) agree.
inline float lamb_element_update(float p, float m, float v, const LambConsts& k) {
  const float m_hat = m / k.bc1, v_hat = v / k.bc2;
  const float denom = k.eps_inside_sqrt ? std::sqrt(v_hat + k.eps) : std::sqrt(v_hat) + k.eps;
  return std::fma(k.weight_decay, p, m_hat / denom);
}

// The segment list to use (an empty list means one segment over [0, n)), validated.
std::vector<Segment> resolve_segments(std::span<const Segment> segments, int64_t n) {
  if (segments.empty()) return {Segment{0, n}};
  int64_t end = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& sg = segments[s];
    DS_CHECK(sg.numel >= 0 && sg.offset >= end && sg.offset + sg.numel <= n,
             "[optim] Lamb: segment {} (offset {}, numel {}) is negative, overlaps the previous "
             "one or leaves the buffer of {} elements; segments must be sorted and disjoint",
             s, sg.offset, sg.numel, n);
    end = sg.offset + sg.numel;
  }
  return {segments.begin(), segments.end()};
}

std::vector<Tile> make_tiles(const std::vector<Segment>& segs) {
  std::vector<Tile> tiles;
  for (size_t s = 0; s < segs.size(); ++s)
    for (int64_t b = segs[s].offset; b < segs[s].offset + segs[s].numel; b += kTileElems)
      tiles.push_back(
          {static_cast<int64_t>(s), b, std::min(b + kTileElems, segs[s].offset + segs[s].numel)});
  return tiles;
}

}  // namespace

void check_config(const LambConfig& c) {
  DS_CHECK(std::isfinite(c.lr) && c.lr >= 0, "[optim] Lamb: lr must be >= 0, got {}", c.lr);
  DS_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
           "[optim] Lamb: betas must be in [0, 1), got ({}, {})", c.beta1, c.beta2);
  DS_CHECK(c.eps >= 0 && c.weight_decay >= 0,
           "[optim] Lamb: eps and weight_decay must be >= 0, got {} and {}", c.eps, c.weight_decay);
  DS_CHECK(c.min_coeff >= 0 && c.min_coeff <= c.max_coeff,
           "[optim] Lamb: need 0 <= min_coeff <= max_coeff, got min_coeff {} max_coeff {}",
           c.min_coeff, c.max_coeff);
}

void lamb_moments(const float* p, const float* g, float* m, float* v, int64_t n,
                  std::span<const Segment> segments, int64_t step, const LambConfig& c,
                  float grad_scale, double* w2, double* u2) {
  detail::check_buffers("Lamb", n, p, g);
  DS_CHECK(n == 0 || (m != nullptr && v != nullptr), "[optim] Lamb: null moment buffer");
  const LambConsts k = make_consts(c, step, grad_scale);
  const std::vector<Segment> segs = resolve_segments(segments, n);
  const std::vector<Tile> tiles = make_tiles(segs);
  // Per-tile partial sums, added per segment in tile order below: the result does not depend on
  // how tiles were spread over threads.
  std::vector<double> tw2(tiles.size()), tu2(tiles.size());
  parallel_for(static_cast<int64_t>(tiles.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      double sw = 0, su = 0;
      for (int64_t i = tiles[t].begin; i < tiles[t].end; ++i) {
        const float gi = g[i] * k.grad_scale;
        const float mi = std::fma(gi, k.one_minus_beta1, m[i] * k.beta1);
        const float vi = std::fma(gi * gi, k.one_minus_beta2, v[i] * k.beta2);
        m[i] = mi;
        v[i] = vi;
        const float u = lamb_element_update(p[i], mi, vi, k);
        sw += double{p[i]} * p[i];
        su += double{u} * u;
      }
      tw2[t] = sw;
      tu2[t] = su;
    }
  });
  for (size_t s = 0; s < segs.size(); ++s) w2[s] = u2[s] = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    w2[tiles[t].segment] += tw2[t];
    u2[tiles[t].segment] += tu2[t];
  }
}

float lamb_trust_ratio(double w2, double u2, const LambConfig& c) {
  const double w = std::sqrt(w2), u = std::sqrt(u2);
  if (w == 0 || u == 0) return 1.0f;
  return static_cast<float>(std::clamp(w / u, double{c.min_coeff}, double{c.max_coeff}));
}

void lamb_apply(float* p, const float* m, const float* v, int64_t n,
                std::span<const Segment> segments, int64_t step, const LambConfig& c,
                const float* coeffs, void* out16, DType out16_dtype) {
  detail::check_buffers("Lamb", n, p, m);
  const Out16 kind = detail::out16_kind(out16, out16_dtype);
  const LambConsts k = make_consts(c, step, 1.0f);
  const std::vector<Segment> segs = resolve_segments(segments, n);
  const std::vector<Tile> tiles = make_tiles(segs);
  auto* o16 = static_cast<uint16_t*>(out16);
  parallel_for(static_cast<int64_t>(tiles.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float neg_step = -(c.lr * k.step_mult * coeffs[tiles[t].segment]);
      for (int64_t i = tiles[t].begin; i < tiles[t].end; ++i) {
        const float pi = std::fma(lamb_element_update(p[i], m[i], v[i], k), neg_step, p[i]);
        p[i] = pi;
        if (kind != Out16::none) detail::store16_scalar(o16 + i, kind, pi);
      }
    }
  });
}

void lamb_update(float* p, const float* g, float* m, float* v, int64_t n,
                 std::span<const Segment> segments, int64_t step, const LambConfig& c,
                 float grad_scale, void* out16, DType out16_dtype, float* coeffs_out) {
  const size_t count = segments.empty() ? 1 : segments.size();
  std::vector<double> w2(count), u2(count);
  std::vector<float> coeffs(count);
  lamb_moments(p, g, m, v, n, segments, step, c, grad_scale, w2.data(), u2.data());
  for (size_t s = 0; s < count; ++s) coeffs[s] = lamb_trust_ratio(w2[s], u2[s], c);
  lamb_apply(p, m, v, n, segments, step, c, coeffs.data(), out16, out16_dtype);
  if (coeffs_out != nullptr) std::copy(coeffs.begin(), coeffs.end(), coeffs_out);
}

}  // namespace ds::optim
