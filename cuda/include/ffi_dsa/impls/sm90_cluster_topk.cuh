// Exact top-K of one row's rank keys (rank_key.h), computed by a thread-block cluster: each CTA
// holds a contiguous slice of the row and the CTAs exchange counts through distributed shared
// memory (DSMEM), so a long row is selected by several SMs without another kernel or a round trip
// through global memory (up to 8 SMs). A cluster of one CTA is the plain block-wide case.
//
// Keys live in registers: thread t of a CTA owns kKeysPerThread consecutive positions of each
// tile of kTileKeys keys (one tile = the whole slice for rows up to 8K keys per CTA), so every
// pass is an unrolled loop over registers, and "winners before me" is one block scan.
//
// 1. ClusterThreshold finds the key T of the K-th best key of the row and how many keys equal to
//    T are taken. Fast path: the score range (min/max, computed while the keys are loaded), a
//    2048-bucket histogram linear in the score value (a row's top tail spreads over many buckets,
//    so shared-memory atomics rarely collide; a radix histogram on key bits crowds a row into a
//    few bins, because its scores share exponent bits, and measured 5-10x slower on H100), then
//    the keys of the K-th key's bucket are gathered from every CTA and ranked exactly.
//    Degenerate ranges (all equal, infinities, a bucket too full) fall back to RadixThreshold:
//    MSB-first 4-bit digits, bin totals summed over the cluster.
// 2. ClusterEmit: a block scan of (greater-than-T, equal-to-T) counts plus the totals of the
//    lower-ranked CTAs give every winner its output slot, so winners come out by ascending
//    position and ties at T go to the smallest positions, deterministically.
// 3. SortSelectedDescending: for sorted=True, a block radix sort of (key, ~position) words.
//
// Control flow that reaches a cluster barrier depends only on cluster-wide totals, so every CTA
// of a cluster passes the same barriers.
#pragma once
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

namespace cg = cooperative_groups;

// Winners are keys > key, plus the first `ties` keys == key in position order.
struct Threshold {
  uint32_t key;
  uint32_t ties;
};
// Every candidate wins (the caller knows there are at most K of them).
constexpr Threshold kTakeAll{1u, UINT_MAX};

constexpr int kDigitBits = 4;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBuckets = 2048;
constexpr int kGatherCapacity = 2048;
constexpr int kRankAllPairsMax = 256;  // gathered keys ranked by all-pairs counting up to this

struct SliceStats {
  float lo, hi;  // range of the numbers (keys above kNaNKey)
  uint32_t numbers, nans;
};

// Sorted output: words[0, selected) hold RankWord(key, position) of the winners; the rest of
// the capacity is padded with 0 (sorts last). Afterwards words[r] is the r-th best.
template <int kThreads>
struct SortStorage {
  static constexpr int kItems = (kMaxTopK + kThreads - 1) / kThreads;
  static constexpr int kCapacity = kItems * kThreads;
  using Sort = cub::BlockRadixSort<unsigned long long, kThreads, kItems>;
  unsigned long long words[kCapacity];
  typename Sort::TempStorage temp;
};

template <int kThreads>
struct ClusterSelectStorage {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBucketsPerThread = kBuckets / kThreads;
  static_assert(kBuckets % kThreads == 0 && kWarps >= kBins, "thread roles");
  SortStorage<kThreads> sorting;  // rank 0's is the target of every CTA's winners
  // Read by the other CTAs of the cluster (after a cluster barrier):
  SliceStats stats;
  uint32_t hist[kBuckets];
  uint32_t gathered[kGatherCapacity];
  uint32_t gathered_count;
  uint32_t bin_local[2][kBins];  // by pass parity: a pass never overwrites what a slower CTA still reads
  unsigned long long emit_totals;  // (greater, equal) counts of this CTA's slice
  // Local:
  uint32_t united[kGatherCapacity];  // the gathered keys of every CTA
  uint32_t warp_bins[kWarps][kBins];
  SliceStats warp_stats[kWarps];
  uint32_t bin_total[kBins];
  uint32_t result_key, result_ties, result_count;
  uint32_t digit, above, take_all;
  union {
    typename cub::BlockScan<uint32_t, kThreads>::TempStorage scan32;
    typename cub::BlockScan<unsigned long long, kThreads>::TempStorage scan64;
  };
};

template <typename T>
__device__ __forceinline__ T* AtRank(T* local, int rank) {
  return cg::this_cluster().map_shared_rank(local, rank);
}
__device__ __forceinline__ void ClusterBarrier() { cg::this_cluster().sync(); }

__device__ __forceinline__ float KeyToScore(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Must run before the first cluster barrier of the select (they are read remotely after it).
template <int kThreads>
__device__ void ResetClusterSelect(ClusterSelectStorage<kThreads>& s) {
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) s.hist[i] = 0;
  if (threadIdx.x == 0) s.gathered_count = 0;
}

__device__ __forceinline__ void AccumulateStats(SliceStats& st, uint32_t key) {
  if (key > kNaNKey) {
    const float v = KeyToScore(key);
    st.lo = fminf(st.lo, v);
    st.hi = fmaxf(st.hi, v);
    ++st.numbers;
  }
  st.nans += key == kNaNKey;
}
__device__ __forceinline__ SliceStats EmptyStats() {
  return SliceStats{__int_as_float(0x7F800000), __int_as_float(0xFF800000), 0u, 0u};
}
__device__ __forceinline__ SliceStats Combine(SliceStats a, const SliceStats& b) {
  a.lo = fminf(a.lo, b.lo);
  a.hi = fmaxf(a.hi, b.hi);
  a.numbers += b.numbers;
  a.nans += b.nans;
  return a;
}

// Combined over the 32 lanes of the warp (every lane gets the result).
__device__ __forceinline__ SliceStats WarpStats(SliceStats st) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    SliceStats other;
    other.lo = __shfl_xor_sync(0xFFFFFFFFu, st.lo, o);
    other.hi = __shfl_xor_sync(0xFFFFFFFFu, st.hi, o);
    other.numbers = __shfl_xor_sync(0xFFFFFFFFu, st.numbers, o);
    other.nans = __shfl_xor_sync(0xFFFFFFFFu, st.nans, o);
    st = Combine(st, other);
  }
  return st;
}

// The row's stats, to every thread of every CTA: block reduce, then (cluster) sum over the CTAs.
template <int kThreads>
__device__ SliceStats RowStats(ClusterSelectStorage<kThreads>& s, SliceStats st, int cluster_size) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  st = WarpStats(st);
  if (lane == 0) s.warp_stats[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = WarpStats(lane < kThreads / 32 ? s.warp_stats[lane] : EmptyStats());
    if (lane == 0) s.stats = st;
  }
  if (cluster_size == 1) {
    __syncthreads();
    return s.stats;
  }
  ClusterBarrier();
  SliceStats all = EmptyStats();
  for (int r = 0; r < cluster_size; ++r) all = Combine(all, *AtRank(&s.stats, r));
  return all;
}

// `for_each_key(f)` calls f(key) for every key this thread owns (any split of the cluster's
// keys among its threads). With `cluster_size` 1 the search is local to the CTA (and may run on
// data that every CTA holds identically). `whole_row`: the keys are all the row's keys, so two
// shortcuts are sound: at most K keys (all win), and a digit bin that holds exactly the remaining
// winners (the threshold is then the bin's prefix with unlimited ties). On a subset (the K-th
// key's value bucket) neither is: keys outside the subset may lie between the prefix and the
// bucket, so the search runs to the exact K-th key. Ends with a barrier. The fallback path:
// per-warp bins with shared-memory atomics (slow when keys crowd, reached only for degenerate
// rows and crowded buckets).
template <int kThreads, typename ForEachKey>
__device__ Threshold RadixThreshold(ClusterSelectStorage<kThreads>& s, uint32_t topk, int cluster_size,
                                    ForEachKey&& for_each_key, bool whole_row = true) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint32_t prefix = 0, prefix_mask = 0, remaining = topk;
  int pass = 0;
#pragma unroll 1
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits, ++pass) {
    if (lane < kBins) s.warp_bins[warp][lane] = 0;
    __syncwarp();
    for_each_key([&](uint32_t key) {
      if (key != kNotCandidate && (key & prefix_mask) == prefix) atomicAdd(&s.warp_bins[warp][(key >> shift) & (kBins - 1)], 1u);
    });
    __syncthreads();
    if (warp < kBins) {
      uint32_t total = 0;
      for (int w = lane; w < kThreads / 32; w += 32) total += s.warp_bins[w][warp];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
      if (lane == 0) s.bin_local[pass & 1][warp] = total;
    }
    if (cluster_size > 1) {
      ClusterBarrier();  // also a block barrier
      if (tid < kBins) {
        uint32_t total = 0;
        for (int r = 0; r < cluster_size; ++r) total += *AtRank(&s.bin_local[pass & 1][tid], r);
        s.bin_total[tid] = total;
      }
    } else {
      __syncthreads();
      if (tid < kBins) s.bin_total[tid] = s.bin_local[pass & 1][tid];
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t total = 0, above = 0, digit = 0;
      for (int bin = 0; bin < kBins; ++bin) total += s.bin_total[bin];
      for (int bin = kBins - 1; bin >= 0; --bin) {
        digit = bin;
        if (above + s.bin_total[bin] >= remaining) break;
        above += s.bin_total[bin];
      }
      s.take_all = whole_row && shift == 32 - kDigitBits && total <= topk;  // at most K candidates: all win
      s.digit = digit;
      s.above = above;
    }
    __syncthreads();
    if (s.take_all) {
      __syncthreads();
      return kTakeAll;
    }
    remaining -= s.above;
    prefix |= s.digit << shift;
    prefix_mask |= uint32_t(kBins - 1) << shift;
    const bool whole_bin = whole_row && s.bin_total[s.digit] == remaining;
    __syncthreads();  // s.digit / s.bin_total are rewritten by the next pass
    // Every key of the row with this prefix wins: the lowest key of the prefix, unlimited ties.
    if (whole_bin) return Threshold{prefix, UINT_MAX};
  }
  return Threshold{prefix, remaining};
}

// The row's threshold, given the row's stats (every CTA has the same). Call after
// ResetClusterSelect and RowStats. Ends with a barrier.
template <int kThreads, typename ForEachKey>
__device__ Threshold ClusterThreshold(ClusterSelectStorage<kThreads>& s, uint32_t topk, const SliceStats& row,
                                      int cluster_size, ForEachKey&& for_each_key) {
  using Storage = ClusterSelectStorage<kThreads>;
  const int tid = threadIdx.x;
  if (row.numbers + row.nans <= topk) return kTakeAll;
  if (row.numbers < topk) return Threshold{kNaNKey, topk - row.numbers};  // every number, then NaNs by position
  const float lo = row.lo, range = row.hi - row.lo;
  if (!(range > 0.0f && range < __int_as_float(0x7F800000))) {  // all equal, or infinities
    return RadixThreshold<kThreads>(s, topk, cluster_size, for_each_key);
  }
  // Monotone in the score, so monotone in the key: bucket order is rank order.
  const float per_unit = static_cast<float>(kBuckets) / range;
  if (!(per_unit < __int_as_float(0x7F800000))) {  // a range so small that 2048 / range overflows
    return RadixThreshold<kThreads>(s, topk, cluster_size, for_each_key);
  }
  auto bucket_of = [&](uint32_t key) { return min(kBuckets - 1, static_cast<int>((KeyToScore(key) - lo) * per_unit)); };

  for_each_key([&](uint32_t key) {
    if (key > kNaNKey) atomicAdd(&s.hist[bucket_of(key)], 1u);
  });
  if (cluster_size > 1) ClusterBarrier(); else __syncthreads();
  {  // the bucket of the K-th number: thread t owns buckets counted from the top
    constexpr int kPer = Storage::kBucketsPerThread;
    const int first = kBuckets - kPer * (tid + 1);  // this thread's lowest bucket
    uint32_t count[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) count[i] = s.hist[first + i];
    for (int r = 1; r < cluster_size; ++r) {  // the other CTAs, each starting at a different one
      const uint32_t* h = AtRank(s.hist, (static_cast<int>(cg::this_cluster().block_rank()) + r) % cluster_size);
#pragma unroll
      for (int i = 0; i < kPer; ++i) count[i] += h[first + i];
    }
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) sum += count[i];
    uint32_t above;
    cub::BlockScan<uint32_t, kThreads>(s.scan32).ExclusiveSum(sum, above);
    if (above < topk && above + sum >= topk) {
#pragma unroll
      for (int i = kPer - 1; i >= 0; --i) {
        if (above < topk && above + count[i] >= topk) {
          s.result_key = first + i;
          s.result_ties = above;
          s.result_count = count[i];
        }
        above += count[i];
      }
    }
  }
  __syncthreads();
  const int kth_bucket = static_cast<int>(s.result_key);
  const uint32_t rank = topk - s.result_ties;  // the K-th number is the rank-th best of its bucket
  const uint32_t in_bucket = s.result_count;   // over the whole row
  if (in_bucket > kGatherCapacity) {           // too concentrated for the fast path
    __syncthreads();
    return RadixThreshold<kThreads>(s, topk, cluster_size, for_each_key);
  }
  for_each_key([&](uint32_t key) {
    if (key > kNaNKey && bucket_of(key) == kth_bucket) s.gathered[atomicAdd(&s.gathered_count, 1u)] = key;
  });
  // Every CTA copies the whole bucket (any order: only the rank-th key and its multiplicity
  // matter), then ranks it locally, identically in every CTA.
  const uint32_t* united = s.gathered;
  if (cluster_size > 1) {
    ClusterBarrier();
    uint32_t offset = 0;
    for (int r = 0; r < cluster_size; ++r) {
      const uint32_t* src = AtRank(s.gathered, r);
      const uint32_t count = *AtRank(&s.gathered_count, r);
      for (uint32_t i = tid; i < count; i += kThreads) s.united[offset + i] = src[i];
      offset += count;
    }
    united = s.united;
  }
  __syncthreads();
  Threshold th;
  if (in_bucket <= kRankAllPairsMax) {
    if (tid < in_bucket) {
      const uint32_t e = united[tid];
      uint32_t greater = 0, not_less = 0;
      for (uint32_t j = 0; j < in_bucket; ++j) {
        const uint32_t x = united[j];
        greater += x > e;
        not_less += x >= e;
      }
      if (greater < rank && rank <= not_less) {  // every copy of the key agrees
        s.result_key = e;
        s.result_ties = rank - greater;
      }
    }
    __syncthreads();
    th = Threshold{s.result_key, s.result_ties};
  } else {
    // Every key equal to the K-th lies in this bucket, so ties found among the gathered keys are
    // the ties of the row.
    th = RadixThreshold<kThreads>(
        s, rank, /*cluster_size=*/1,
        [&](auto&& f) { for (uint32_t i = tid; i < in_bucket; i += kThreads) f(united[i]); },
        /*whole_row=*/false);
  }
  __syncthreads();
  return th;
}

__device__ __forceinline__ bool Wins(uint32_t key, const Threshold& th) { return key > th.key; }
__device__ __forceinline__ bool Ties(uint32_t key, const Threshold& th) {
  return key == th.key && key != kNotCandidate;  // a threshold of 0 (all -inf) must not take invalid tokens
}

template <int kThreads>
__device__ void SortSelectedDescending(SortStorage<kThreads>& s, uint32_t selected) {
  using Storage = SortStorage<kThreads>;
  for (int i = selected + threadIdx.x; i < Storage::kCapacity; i += kThreads) s.words[i] = 0ull;
  __syncthreads();
  unsigned long long items[Storage::kItems];
#pragma unroll
  for (int i = 0; i < Storage::kItems; ++i) items[i] = s.words[threadIdx.x * Storage::kItems + i];
  __syncthreads();
  typename Storage::Sort(s.temp).SortDescending(items);
#pragma unroll
  for (int i = 0; i < Storage::kItems; ++i) s.words[threadIdx.x * Storage::kItems + i] = items[i];
  __syncthreads();
}

}  // namespace ffi_dsa::sm90
