// MXFP4's two number formats (docs/contract.md §9), decoded exactly: E2M1 values (sign bit 3,
// magnitude code bits 2..0: 0, 0.5, 1, 1.5, 2, 3, 4, 6; code 8 is -0) and UE8M0 scale bytes
// (2^(byte - 127), 255 NaN). Every E2M1 value has at most 2 significant bits, so a product of two is
// exact in float32 (and in BF16 each value itself), and a sum of 32 such products is a multiple of
// 0.25 below 2^11: the block sums the contract promises exact.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ffi_dsa/contract.h"

namespace ffi_dsa {

constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float DecodeE2M1(uint8_t nibble) {
  const float magnitude = kE2M1Magnitudes[nibble & 0x7];
  return (nibble & 0x8) ? -magnitude : magnitude;
}

// 2^(byte - 127) exactly (byte 0 is the float32 subnormal 2^-127), NaN for 255.
inline float DecodeUe8m0(uint8_t byte) {
  if (byte == kUe8m0NaN) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t bits = byte == 0 ? (1u << 22) : static_cast<uint32_t>(byte) << 23;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Byte `block` of a little-endian int32 holding four UE8M0 bytes (q_scale), by value, not by address.
inline uint8_t ScaleByte(int32_t packed, int block) {
  return static_cast<uint8_t>(static_cast<uint32_t>(packed) >> (8 * block));
}

// The two values a byte holds, element 2j (low nibble) first.
inline const std::array<std::array<float, 2>, 256>& E2M1PairTable() {
  static const std::array<std::array<float, 2>, 256> table = [] {
    std::array<std::array<float, 2>, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = {DecodeE2M1(i & 0xF), DecodeE2M1(i >> 4)};
    return t;
  }();
  return table;
}

// BF16 bits of each nibble's value (exact: two significant bits), twice over, so that a 32-entry
// 16-bit permute indexed by a word whose bit 4 is not cleared still finds the nibble's value.
inline const std::array<uint16_t, 32>& E2M1Bf16Table() {
  static const std::array<uint16_t, 32> table = [] {
    std::array<uint16_t, 32> t{};
    for (int i = 0; i < 32; ++i) {
      const float value = DecodeE2M1(i & 0xF);
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      t[i] = static_cast<uint16_t>(bits >> 16);
    }
    return t;
  }();
  return table;
}

// Each nibble's value as float32 (a 16-entry permute table).
inline const std::array<float, 16>& E2M1Table() {
  static const std::array<float, 16> table = [] {
    std::array<float, 16> t{};
    for (int i = 0; i < 16; ++i) t[i] = DecodeE2M1(i);
    return t;
  }();
  return table;
}

}  // namespace ffi_dsa
