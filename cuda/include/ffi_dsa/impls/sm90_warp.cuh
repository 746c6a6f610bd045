// Sums over the lanes of a warp, shared by the selects (sm90_bin_select.cuh, sm90_select_rows.cuh,
// sm90_prefill_candidates.cuh). Every lane of the warp calls them.
#pragma once
#include <cstdint>

namespace ffi_dsa::sm90 {

// Sum over the warp (every lane gets it): one redux.sync instead of five dependent shuffles.
__device__ __forceinline__ uint32_t WarpSum(uint32_t x) { return __reduce_add_sync(0xFFFFFFFFu, x); }

// This lane's inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ uint32_t WarpInclusiveSum(uint32_t x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

}  // namespace ffi_dsa::sm90
