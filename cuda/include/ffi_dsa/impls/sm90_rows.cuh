// Row lengths as the kernels see them (contract.h's ClampLength, the SPEC rule for bad lengths),
// read from seq_lens on the device.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

__device__ __forceinline__ int64_t ClampedLength(const int32_t* seq_lens, int64_t b, int32_t max_pages) {
  return ClampLength(seq_lens[b], max_pages);
}

// A row of more than K tokens needs a threshold (and the row stats it starts from); one of at most
// K tokens takes every valid token.
__host__ __device__ __forceinline__ bool ThresholdNeeded(int64_t tokens, int32_t topk) { return tokens > topk; }

// A row of at most K tokens ordered by position needs no scores: every token on a valid page
// wins, whatever its score (NaN included), and the output is those tokens in position order.
// Kernel 1 skips such rows and kernel 2 writes them without waiting for kernel 1; the host skips
// kernel 1 when no row can be longer than the block table allows (tokens = max_pages * 64).
__host__ __device__ __forceinline__ bool ScoresNeeded(int64_t tokens, int32_t topk, bool sorted) {
  return sorted || ThresholdNeeded(tokens, topk);
}

// Pages kernel 1 scores for a row of n tokens.
__device__ __forceinline__ int32_t ScoredPages(int64_t n, int32_t topk, bool sorted) {
  return ScoresNeeded(n, topk, sorted) ? static_cast<int32_t>((n + kPageTokens - 1) / kPageTokens) : 0;
}

}  // namespace ffi_dsa::sm90
