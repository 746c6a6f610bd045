// Row lengths as the kernels see them (SPEC "bad input": a negative length counts as 0, a length
// past the block table is cut to max_pages * 64), shared so that every kernel agrees.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

__device__ __forceinline__ int64_t ClampedLength(const int32_t* seq_lens, int64_t b, int32_t max_pages) {
  const int64_t n = seq_lens[b];
  const int64_t cap = int64_t(max_pages) * kPageTokens;
  return n < 0 ? 0 : (n > cap ? cap : n);
}

__device__ __forceinline__ int32_t RowPages(const int32_t* seq_lens, int64_t b, int32_t max_pages) {
  return static_cast<int32_t>((ClampedLength(seq_lens, b, max_pages) + kPageTokens - 1) / kPageTokens);
}

}  // namespace ffi_dsa::sm90
