// Row lengths as the kernels see them (contract.h's ClampLength, the SPEC rule for bad lengths),
// read from seq_lens on the device.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

__device__ __forceinline__ int64_t ClampedLength(const int32_t* seq_lens, int64_t b, int32_t max_pages) {
  return ClampLength(seq_lens[b], max_pages);
}

__device__ __forceinline__ int32_t RowPages(const int32_t* seq_lens, int64_t b, int32_t max_pages) {
  return static_cast<int32_t>((ClampedLength(seq_lens, b, max_pages) + kPageTokens - 1) / kPageTokens);
}

}  // namespace ffi_dsa::sm90
