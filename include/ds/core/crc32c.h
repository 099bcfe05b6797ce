#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; RFC 3720 appendix B.4): the checksum of
// TFRecord framing (TensorBoard event files). Debian 12 packages no CRC-32C library (Google's
// crc32c is libcrc32c-dev from Debian 13 on; Abseil's absl::ComputeCrc32c needs Abseil 2023, Debian
// 12 has 2022), so this is a table-driven implementation checked against RFC 3720's test vectors
// (tests/test_monitor.cpp) and against event files written by TensorBoard's own writer.
#include <cstddef>
#include <cstdint>

namespace ds {

// crc32c("123456789") == 0xE3069283. `crc` continues an earlier value (0 to start).
uint32_t crc32c(const void* data, size_t len, uint32_t crc = 0);

// TFRecord's "masked" CRC (tensorflow/core/lib/hash/crc32c.h Mask): rotate right by 15 and add
// 0xa282ead8, so that a CRC of data containing CRCs is not degenerate.
inline uint32_t crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace ds
