// The select's histogram bins: a fixed, data-independent, monotone map from rank keys (rank_key.h)
// to 4096 bins, from integer operations alone (no float convert), so the histogram can be built
// where keys first reach shared memory without knowing the row's range first. Each bin is a
// contiguous key range (SelectBinHighKey maps it back), so later passes compare keys with a bin's
// bounds instead of recomputing bins. Plain C++ as well: tests/test_select_bins.py checks the map
// over every 32-bit key on the host.
//
// Layout: bin 0 holds NaN alone (it ranks below every number), bins 1..2047 the negative numbers,
// bin 2048 exact zero alone (a relu plateau's ties then sit in one bin of a single value), bins
// 2049..4095 the positive numbers. A number's bin is its binade and the top 6 bits of its mantissa
// (64 bins per binade, as an fp16 rounding gives) over a window of 32 binades, |x| in [2^-14, 2^18);
// beyond the window the end bins take everything (the select then ranks that bin's members).
#pragma once
#include <cstdint>

#include "ffi_dsa/rank_key.h"

namespace ffi_dsa {

constexpr uint32_t kSelectBins = 4096;
constexpr uint32_t kNaNBin = 0;
constexpr uint32_t kZeroBin = 2048;
constexpr uint32_t kZeroKey = 0x80000000u;  // ScoreToKey(+-0)
constexpr int kBinMantissaBits = 6;
constexpr int kBinShift = 23 - kBinMantissaBits;
// Biased exponent of the window's lowest binade (2^-14) in units of bins.
constexpr uint32_t kBinLowCode = 113u << kBinMantissaBits;
// Codes per sign: 0 (the window's floor and below) .. kBinTopCode (its ceiling and above).
constexpr uint32_t kBinTopCode = 2046u;
static_assert(kZeroBin + 1 + kBinTopCode == kSelectBins - 1 && kZeroBin - 1 - kBinTopCode == kNaNBin + 1, "bin layout");

// The bin of a candidate's key (key >= kNaNKey; kNotCandidate is never binned).
FFI_DSA_HD uint32_t SelectBin(uint32_t key) {
  const bool positive = key > kZeroKey;
  // The score's magnitude bits (exponent, mantissa) for either sign: a positive key is the bits
  // with the sign set, a negative one their complement.
  const uint32_t magnitude = positive ? key - kZeroKey : 0x7FFFFFFFu - key;
  const uint32_t v = magnitude >> kBinShift;
  const uint32_t over = v > kBinLowCode ? v - kBinLowCode : 0u;
  const uint32_t code = over < kBinTopCode ? over : kBinTopCode;
  uint32_t bin = positive ? kZeroBin + 1 + code : kZeroBin - 1 - code;
  if (key == kZeroKey) bin = kZeroBin;
  if (key <= kNaNKey) bin = kNaNBin;
  return bin;
}

// The largest key of bin `bin` (every key of the bin is at most this; the next bin's smallest is
// this plus one).
FFI_DSA_HD uint32_t SelectBinHighKey(uint32_t bin) {
  if (bin == kNaNBin) return kNaNKey;
  if (bin == kZeroBin) return kZeroKey;
  if (bin == kSelectBins - 1) return 0xFFFFFFFFu;
  if (bin > kZeroBin) {  // positive: the code's largest magnitude
    const uint32_t v = kBinLowCode + (bin - kZeroBin - 1);
    return kZeroKey + ((v + 1u) << kBinShift) - 1u;
  }
  const uint32_t code = kZeroBin - 1 - bin;  // negative: the code's smallest magnitude
  return code == 0 ? 0x7FFFFFFFu : 0x7FFFFFFFu - ((kBinLowCode + code) << kBinShift);
}

// The smallest key of bin `bin` (kNaNKey for the NaN bin).
FFI_DSA_HD uint32_t SelectBinLowKey(uint32_t bin) { return bin == kNaNBin ? kNaNKey : SelectBinHighKey(bin - 1) + 1u; }

// Bins that hold a single key value: their ties need no ranking, only positions.
FFI_DSA_HD bool SingleValueBin(uint32_t bin) { return bin == kNaNBin || bin == kZeroBin; }

}  // namespace ffi_dsa
