#pragma once
// Blockwise symmetric quantization for ZeRO++'s compressed communication (the ZeRO++ paper, Wang
// et al. 2023; DeepSpeed's CUDAQuantizer): qwZ gathers stage-3 weights as int8, qgZ reduces
// gradients as int4. Values go in blocks of kQuantBlock; each block has one fp32 scale
// s = max|x| / qmax (qmax 127 for 8 bits, 7 for 4) and each value becomes round(x / s) in
// [-qmax, qmax], so |x - dequantized(x)| <= s / 2 per element (0 for an all-zero block).
// DeepSpeed picks groups of up to ~8000 elements that divide the partition; here the block size is
// fixed and the last block of a buffer may be shorter.
//
// Layout of a quantized buffer (int32 words, what the collectives move): the block scales (one
// fp32 per block, stored bitwise), then the values packed little-endian, 4 per word for 8 bits, 8
// per word for 4 bits (two's complement nibbles/bytes), zero past n.
//
// Threading: pure functions; large buffers are processed with ds::parallel_for.
#include <cstdint>

namespace ds::zero {

inline constexpr int64_t kQuantBlock = 2048;

// int32 words that n values take quantized to `bits` (8 or 4), scales included.
int64_t quantized_words(int64_t n, int bits);

// x (n floats) -> out (quantized_words(n, bits) words).
void quantize_blocks(const float* x, int64_t n, int bits, int32_t* out);

// in (quantized_words(n, bits) words) -> x (n floats). accumulate: x += values instead of x =.
void dequantize_blocks(const int32_t* in, int64_t n, int bits, float* x, bool accumulate = false);

}  // namespace ds::zero
