// FP8 E4M3 (fn variant: no infinities, 0x7F/0xFF are NaN) decoded through 256-entry tables,
// which the CPU path uses instead of per-element bit arithmetic.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ffi_dsa {

inline float DecodeE4M3(uint8_t byte) {
  const int sign = byte >> 7, exponent = (byte >> 3) & 0xF, mantissa = byte & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m * 2^-6 / 8
  } else {
    magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  }
  return sign ? -magnitude : magnitude;
}

inline const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = DecodeE4M3(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// BF16 bits of each E4M3 value. Exact: an E4M3 value has at most 4 significant bits and an exponent
// inside BF16's normal range, so its float32 bits end in 16 zeros (NaN becomes the quiet 0x7FC0).
inline const std::array<uint16_t, 256>& E4M3Bf16Table() {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int i = 0; i < 256; ++i) {
      uint32_t bits;
      const float value = E4M3Table()[i];
      std::memcpy(&bits, &value, sizeof(bits));
      t[i] = static_cast<uint16_t>(bits >> 16);
    }
    return t;
  }();
  return table;
}

}  // namespace ffi_dsa
