// Summary of a run of rank keys that the select's value-bucket threshold starts from: the range
// of the numbers and how many numbers and NaNs there are. Kept in the key domain (rank_key.h:
// monotone in the score), so that the warp reductions are single redux.sync instructions.
//
// FusedRowsKernel sums each thread's share while it scores (no pass over the keys);
// SelectRowsKernel sums its share from the workspace keys in L2 while their copy lands, so that
// pass hides behind the copy. (ScorePagesKernel does not store a summary per 16 tokens instead:
// on the HBM-bound scoring the extra stores and per-page reductions cost more than the hidden pass.)
#pragma once
#include <climits>
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct SliceStats {
  uint32_t lo, hi;  // smallest and largest key of the numbers (keys above kNaNKey)
  uint32_t numbers, nans;
};

__device__ __forceinline__ SliceStats EmptyStats() { return SliceStats{UINT_MAX, 0u, 0u, 0u}; }

__device__ __forceinline__ void AddKey(SliceStats& st, uint32_t key) {
  const bool number = key > kNaNKey;
  st.lo = min(st.lo, number ? key : UINT_MAX);
  st.hi = max(st.hi, key);  // NaN and non-candidate keys lie below every number
  st.numbers += number;
  st.nans += key == kNaNKey;
}

// Combined over the 32 lanes of the warp (every lane gets the result).
__device__ __forceinline__ SliceStats WarpStats(const SliceStats& st) {
  return SliceStats{__reduce_min_sync(0xFFFFFFFFu, st.lo), __reduce_max_sync(0xFFFFFFFFu, st.hi),
                    __reduce_add_sync(0xFFFFFFFFu, st.numbers), __reduce_add_sync(0xFFFFFFFFu, st.nans)};
}

}  // namespace ffi_dsa::sm90
