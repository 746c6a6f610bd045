// Row lengths as the kernels see them (contract.h's ClampLength, the SPEC rule for bad lengths),
// read from seq_lens on the device.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

// How the N query tokens of each row see it (docs/contract.md §7). Query j of row b is query row
// b * N + j: its q, weights, workspace keys and output row.
struct QueryShape {
  int32_t queries;      // N
  bool per_query_lens;  // seq_lens is [B, N]; else [B], the queries being the row's last N tokens
};

// Tokens query j of row b sees, from a seq_lens entry already read (the select reads it through
// L2). At most the entry itself, so it fits 32 bits.
__device__ __forceinline__ int32_t QueryLengthOf(int32_t entry, int j, QueryShape qs, int32_t max_pages) {
  return static_cast<int32_t>(VisibleTokens(entry, j, qs.queries, qs.per_query_lens, max_pages));
}
__device__ __forceinline__ const int32_t* QueryLengthEntry(const int32_t* seq_lens, int64_t b, int j, QueryShape qs) {
  return seq_lens + SeqLensIndex(b, j, qs.queries, qs.per_query_lens);
}
__device__ __forceinline__ int32_t QueryLength(const int32_t* seq_lens, int64_t b, int j, QueryShape qs,
                                               int32_t max_pages) {
  return QueryLengthOf(*QueryLengthEntry(seq_lens, b, j, qs), j, qs, max_pages);
}

// A row of more than K tokens needs a threshold; one of at most K tokens takes every valid token.
__host__ __device__ __forceinline__ bool ThresholdNeeded(int64_t tokens, int32_t topk) { return tokens > topk; }

// A row of at most K tokens ordered by position needs no scores: every token on a valid page
// wins, whatever its score (NaN included), and the output is those tokens in position order.
// ScorePagesKernel skips such rows and SelectRowsKernel writes them before waiting for it;
// the host launches SelectRowsKernel alone when no row can need scores (every row is at most the
// block table's width, max_pages * 64 tokens). FusedRowsKernel writes them after its selects (at
// once when none of the row's queries needs scores).
__host__ __device__ __forceinline__ bool ScoresNeeded(int64_t tokens, int32_t topk, bool sorted) {
  return sorted || ThresholdNeeded(tokens, topk);
}

// Pages ScorePagesKernel scores for a query of n tokens.
__device__ __forceinline__ int32_t ScoredPages(int64_t n, int32_t topk, bool sorted) {
  return ScoresNeeded(n, topk, sorted) ? static_cast<int32_t>((n + kPageTokens - 1) / kPageTokens) : 0;
}

// Pages ScorePagesKernel scores for row b: each page once for all of the row's kQueries queries, up
// to the longest prefix among those that need scores. ScoresNeeded grows with the length, so the
// row's longest query decides: with seq_lens [B] (or one query) the last query, which sees
// seq_lens[b] itself (one load: this runs, inlined, in every role's prologue and row walk).
template <int kQueries>
__device__ __forceinline__ int32_t RowScoredPages(const int32_t* seq_lens, int64_t b, QueryShape qs, int32_t max_pages,
                                                  int32_t topk, bool sorted) {
  int32_t longest = seq_lens[b * (qs.per_query_lens ? kQueries : 1)];
  if (kQueries > 1 && qs.per_query_lens) {
#pragma unroll
    for (int j = 1; j < kQueries; ++j) longest = max(longest, seq_lens[b * kQueries + j]);
  }
  return ScoredPages(ClampLength(longest, max_pages), topk, sorted);
}

}  // namespace ffi_dsa::sm90
