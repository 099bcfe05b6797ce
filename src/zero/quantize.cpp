#include "ds/zero/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::zero {
namespace {

int qmax_of(int bits) { return bits == 8 ? 127 : 7; }
int64_t blocks_of(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
int64_t values_per_word(int bits) { return 32 / bits; }

void check_bits(int bits) {
  DS_CHECK(bits == 8 || bits == 4, "[zero] quantization to {} bits: 8 or 4 are supported", bits);
}

}  // namespace

int64_t quantized_words(int64_t n, int bits) {
  check_bits(bits);
  const int64_t per = values_per_word(bits);
  return blocks_of(n) + (n + per - 1) / per;
}

void quantize_blocks(const float* x, int64_t n, int bits, int32_t* out) {
  check_bits(bits);
  const int64_t nb = blocks_of(n), words = quantized_words(n, bits);
  std::memset(out, 0, static_cast<size_t>(words) * sizeof(int32_t));
  auto* scales = reinterpret_cast<float*>(out);
  auto* values = reinterpret_cast<uint8_t*>(out + nb);
  const int qmax = qmax_of(bits);
  // A block is kQuantBlock values: a whole number of bytes for both widths, so blocks never share
  // a byte and can be done in parallel.
  parallel_for(nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
      float amax = 0.0f;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = amax / static_cast<float>(qmax);
      scales[b] = scale;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t i = lo; i < hi; ++i) {
        const int q = std::clamp(static_cast<int>(std::nearbyint(x[i] * inv)), -qmax, qmax);
        if (bits == 8) {
          values[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
        } else {
          const auto nibble = static_cast<uint8_t>(q & 0xF);
          values[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
        }
      }
    }
  });
}

void dequantize_blocks(const int32_t* in, int64_t n, int bits, float* x, bool accumulate) {
  check_bits(bits);
  const int64_t nb = blocks_of(n);
  const auto* scales = reinterpret_cast<const float*>(in);
  const auto* values = reinterpret_cast<const uint8_t*>(in + nb);
  parallel_for(nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
      const float scale = scales[b];
      for (int64_t i = lo; i < hi; ++i) {
        int q;
        if (bits == 8) {
          q = static_cast<int8_t>(values[i]);
        } else {
          const int nibble = (values[i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xF;
          q = nibble >= 8 ? nibble - 16 : nibble;
        }
        const float v = static_cast<float>(q) * scale;
        x[i] = accumulate ? x[i] + v : v;
      }
    }
  });
}

}  // namespace ds::zero
