// Exact top-K of one row's rank keys (rank_key.h), computed by a thread-block cluster: each CTA
// holds a contiguous slice of the row and the CTAs exchange counts through distributed shared
// memory (DSMEM), so a long row is selected by several SMs without another kernel or a round trip
// through global memory (up to 16 SMs). A cluster of one CTA is the plain block-wide case.
//
// Every pass reads its keys from a KeySpan (a CTA's slice staged in shared memory, the slice
// walked from L2 when it is too long to stage, or the gathered keys of one bucket) through one
// loop over tiles of one 4-key quad per thread. Each pass exists once in the binary (code is
// fetched as it executes: see kSelectThreads), where passes unrolled over keys held in registers
// and instantiated at every call site multiply the code warps wait to fetch. (A smaller binary
// alone does not shorten the select, though: its phases are chains of dependent steps and
// barriers.) Cluster exchanges read one value per CTA (stats, totals, counts) or a
// coarse-then-fine histogram, never a whole histogram per thread.
//
// 1. ClusterThreshold finds the key T of the K-th best key of the row and how many keys equal to
//    T are taken. Fast path: the score range (min/max), a 2048-bucket histogram linear in the
//    score value (a row's top tail spreads over many buckets, so shared-memory atomics rarely
//    collide; a radix histogram on key bits crowds a row into a few bins, because its scores
//    share exponent bits, and its atomics serialize there), then the keys of the K-th key's
//    bucket are gathered from every CTA and ranked exactly. Degenerate ranges (all equal,
//    infinities, a bucket too full) fall back to RadixThreshold: MSB-first 4-bit digits, bin
//    totals summed over the cluster.
// 2. Emit (sm90_select_rows.cuh): (greater-than-T, equal-to-T) counts per (tile, warp), their
//    block prefix, a warp scan inside the tile and the totals of the lower-ranked CTAs give every
//    winner its output slot, so winners come out by ascending position and ties at T go to the
//    smallest positions, deterministically. When K takes every copy of T (the threshold says
//    "unlimited ties"), a winner is any key >= T and warp ballots replace the scan.
// 3. SortSelectedDescending: for sorted=True, a block merge sort of (key, ~position) words.
//
// Control flow that reaches a cluster barrier depends only on cluster-wide totals, so every CTA
// of a cluster passes the same barriers.
#pragma once
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <cub/block/block_merge_sort.cuh>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_slice_stats.cuh"
#include "ffi_dsa/impls/sm90_warp.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

namespace cg = cooperative_groups;

// The select is a chain of short dependent steps, so it wants many warps, but not at the price of
// a register cap: two CTAs per SM at 64 registers each lose more to spills and lost ILP than the
// extra warps win, so it is one 512-thread CTA per SM. A pass walks the keys as tiles of one
// 4-key quad per thread, in a loop that is not unrolled: the kernel runs once per launch, so
// straight-line code is fetched from L2 as it executes, and a rolled loop is fetched once.
constexpr int kSelectThreads = 512;
constexpr int kTileKeys = kSelectThreads * 4;  // 2048

// Winners are keys > key, plus the first `ties` keys == key in position order (UINT_MAX: all of
// them, which lets the emit skip ranking ties).
struct Threshold {
  uint32_t key;
  uint32_t ties;
};
// Every candidate wins (the caller knows there are at most K of them).
constexpr Threshold kTakeAll{1u, UINT_MAX};

constexpr int kDigitBits = 4;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBuckets = 2048;
constexpr int kGroupBuckets = 32;  // the histogram is exchanged coarse (groups of 32) then fine
constexpr int kGroups = kBuckets / kGroupBuckets;
// Largest cluster the exchanges are written for (sm_90's non-portable maximum).
constexpr int kMaxClusterRanks = 16;
constexpr int kGatherCapacity = 2048;
static_assert(kGatherCapacity % kSelectThreads == 0, "the gathered keys are copied a fixed count per thread");
constexpr int kRankAllPairsMax = 256;  // gathered keys ranked by all-pairs counting up to this
// Slices of at most this many tiles get their emit count table from the gather pass (below).
constexpr uint32_t kCountedTiles = 16;
constexpr int kSelectWarps = kSelectThreads / 32;
static_assert(kGroups <= kSelectThreads && kGroupBuckets == 32 && kSelectWarps >= kBins && kBuckets == 4 * kSelectThreads,
              "thread roles");

// The keys one pass reads: `staged` in shared memory, or else `global`, read through L2 (written
// by the previous kernel: never through L1). Either buffer may be read up to the next multiple of
// 4 keys past `count` (the workspace rows and the staging buffers are whole pages); those keys
// are masked, never used.
struct KeySpan {
  const uint32_t* staged;
  const uint32_t* global;
  uint32_t count;
};

__device__ __forceinline__ uint32_t Tiles(const KeySpan& span) { return (span.count + kTileKeys - 1) / kTileKeys; }

// The quad a thread holds of a tile: warp w the 128 keys at 128 w, lane l the 4 at 4 l. A warp's
// 16-byte loads read 512 contiguous bytes: no shared-memory bank conflicts (16 consecutive keys
// per thread, read as 16-byte loads at a 64-byte stride, would conflict 4 ways on every pass) and
// whole sectors from L2.
__device__ __forceinline__ uint32_t QuadPosition(uint32_t tile) { return tile * kTileKeys + threadIdx.x * 4; }

// Keys [pos, pos + 4) of a span that holds all of them: no end checks.
__device__ __forceinline__ uint4 LoadWholeQuad(const KeySpan& span, uint32_t pos) {
  return span.staged != nullptr ? *reinterpret_cast<const uint4*>(span.staged + pos)
                                : __ldcg(reinterpret_cast<const uint4*>(span.global + pos));
}

// Keys [pos, pos + 4) of the span; kNotCandidate past its end.
__device__ __forceinline__ uint4 LoadQuad(const KeySpan& span, uint32_t pos) {
  uint4 q = make_uint4(kNotCandidate, kNotCandidate, kNotCandidate, kNotCandidate);
  if (pos < span.count) {
    q = LoadWholeQuad(span, pos);
    if (pos + 4 > span.count) {
      q.y = pos + 1 < span.count ? q.y : kNotCandidate;
      q.z = pos + 2 < span.count ? q.z : kNotCandidate;
      q.w = kNotCandidate;
    }
  }
  return q;
}

// Tiles are walked kBatchTiles at a time: the batch's loads are issued together and its
// independent chains overlap (one tile per iteration would wait out each load in turn).
constexpr uint32_t kBatchTiles = 4;

// The quads of tiles [t, t + kBatchTiles) of the span. A tile wholly inside the span (every
// tile of a row of whole 8K-key multiples, all but the last otherwise) skips LoadQuad's end
// checks: ~5 of the ~12 instructions per key of a histogram pass. Tiles past the end read as
// empty quads (all kNotCandidate).
__device__ __forceinline__ void LoadBatch(const KeySpan& span, uint32_t t, uint4 (&q)[kBatchTiles]) {
  if ((t + kBatchTiles) * kTileKeys <= span.count) {  // the same for every thread
#pragma unroll
    for (uint32_t u = 0; u < kBatchTiles; ++u) q[u] = LoadWholeQuad(span, QuadPosition(t + u));
  } else {
#pragma unroll
    for (uint32_t u = 0; u < kBatchTiles; ++u) {
      const bool whole = (t + u + 1) * kTileKeys <= span.count;  // the same for every thread
      q[u] = whole ? LoadWholeQuad(span, QuadPosition(t + u)) : LoadQuad(span, QuadPosition(t + u));
    }
  }
}

// f(position of the quad in the span, quad) for every tile of the span; every thread of the CTA
// walks the same tiles. A batch that runs past the span's last tile stops there: a 4K-key slice
// (two tiles) would otherwise spend half of every pass on empty quads.
template <typename F>
__device__ __forceinline__ void ForEachQuad(const KeySpan& span, F&& f) {
  const uint32_t tiles = Tiles(span);
#pragma unroll 1
  for (uint32_t t = 0; t < tiles; t += kBatchTiles) {
    uint4 q[kBatchTiles];
    LoadBatch(span, t, q);
#pragma unroll
    for (uint32_t u = 0; u < kBatchTiles; ++u) {
      if (t + u >= tiles) break;  // the same for every thread: warp collectives inside f stay whole
      f(QuadPosition(t + u), q[u]);
    }
  }
}
template <typename F>
__device__ __forceinline__ void ForEachKey(const KeySpan& span, F&& f) {
  ForEachQuad(span, [&](uint32_t, const uint4& q) {
    f(q.x);
    f(q.y);
    f(q.z);
    f(q.w);
  });
}


// Sorted output: words[0, selected) hold RankWord(key, position) of the winners; the rest of
// the capacity is padded with 0 (sorts last). Afterwards words[r] is the r-th best.
struct SortStorage {
  static constexpr int kItems = (kMaxTopK + kSelectThreads - 1) / kSelectThreads;
  static constexpr int kCapacity = kItems * kSelectThreads;
  // Merge sort: 9 merge rounds over 2048 words, where a radix sort of the 64-bit words needs 16
  // passes of 4-bit digits, each a histogram, a block scan and a scatter.
  struct Greater {
    __device__ bool operator()(unsigned long long a, unsigned long long b) const { return a > b; }
  };
  using Sort = cub::BlockMergeSort<unsigned long long, kSelectThreads, kItems>;
  unsigned long long words[kCapacity];
  typename Sort::TempStorage temp;
};

struct ClusterSelectStorage {
  SortStorage sorting;  // rank 0's is the target of every CTA's winners
  // Read by the other CTAs of the cluster (after a cluster barrier):
  SliceStats stats;
  alignas(16) uint32_t hist[kBuckets];  // one CTA: read as 4 buckets per thread
  uint32_t group_hist[kGroups];
  alignas(16) uint32_t gathered[kGatherCapacity];  // read in quads (16-byte loads) when ranked
  uint32_t gathered_count;
  uint32_t bin_local[2][kBins];  // by pass parity: a pass never overwrites what a slower CTA still reads
  unsigned long long emit_totals;  // (greater, equal) counts of this CTA's slice
  // Local:
  uint32_t gathered_pos[kGatherCapacity];  // slice position of each of this CTA's gathered keys
  uint32_t warp_sums[kSelectWarps];
  unsigned long long warp_sums64[kSelectWarps];
  uint32_t chunk_offsets[kSelectThreads];  // emit: (tile, warp) counts, then their exclusive prefix
  SliceStats row_stats;
  uint32_t rank_counts[kMaxClusterRanks];
  unsigned long long rank_totals[kMaxClusterRanks];
  uint32_t kth_group, group_above;
  alignas(16) uint32_t united[kGatherCapacity];  // the gathered keys of every CTA (read in quads)
  uint32_t warp_bins[kSelectWarps][kBins];
  SliceStats warp_stats[kSelectWarps];
  uint32_t bin_total[kBins];
  uint32_t result_key, result_ties, result_count;
  uint32_t digit, above, take_all;
};

template <typename T>
__device__ __forceinline__ T* AtRank(T* local, int rank) {
  return cg::this_cluster().map_shared_rank(local, rank);
}
__device__ __forceinline__ void ClusterBarrier() { cg::this_cluster().sync(); }
// A cluster barrier for clusters, a block barrier for one CTA.
__device__ __forceinline__ void RowBarrier(int cluster_size) {
  if (cluster_size > 1) ClusterBarrier(); else __syncthreads();
}

// Exclusive prefix sum over the CTA's threads in thread order; `total` gets the sum. Not inlined:
// one copy serves every caller. Ends with a barrier.
__device__ __noinline__ uint32_t BlockExclusiveSum(ClusterSelectStorage& s, uint32_t x, uint32_t& total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t incl = WarpInclusiveSum(x);
  if (lane == 31) s.warp_sums[warp] = incl;
  __syncthreads();
  const uint32_t warps = WarpInclusiveSum(lane < kSelectWarps ? s.warp_sums[lane] : 0u);
  const uint32_t before = warp > 0 ? __shfl_sync(0xFFFFFFFFu, warps, warp - 1) : 0u;
  total = __shfl_sync(0xFFFFFFFFu, warps, kSelectWarps - 1);
  __syncthreads();
  return before + incl - x;
}

// Sum over the CTA (every thread gets it). Ends with a barrier.
__device__ __forceinline__ unsigned long long BlockSum64(ClusterSelectStorage& s, unsigned long long x) {
  x = WarpSum(x);
  if (threadIdx.x % 32 == 0) s.warp_sums64[threadIdx.x / 32] = x;
  __syncthreads();
  unsigned long long total = 0;
#pragma unroll 1
  for (int w = 0; w < kSelectWarps; ++w) total += s.warp_sums64[w];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float KeyToScore(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Must run before the first cluster barrier of the select (they are read remotely after it).
__device__ __forceinline__ void ResetClusterSelect(ClusterSelectStorage& s) {
  for (int i = threadIdx.x; i < kBuckets; i += kSelectThreads) s.hist[i] = 0;
  if (threadIdx.x == 0) s.gathered_count = 0;
}

// The row's stats, to every thread of every CTA, from every thread's share (`st`: a part of this
// CTA's slice, the parts disjoint): block reduce, then (cluster) sum over the CTAs.
__device__ SliceStats RowStats(ClusterSelectStorage& s, SliceStats st, int cluster_size) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  st = WarpStats(st);
  if (lane == 0) s.warp_stats[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = WarpStats(lane < kSelectWarps ? s.warp_stats[lane] : EmptyStats());
    if (lane == 0) s.stats = st;
  }
  if (cluster_size == 1) {
    __syncthreads();
    return s.stats;
  }
  ClusterBarrier();
  // One remote read per CTA of the cluster (lane r reads rank r), not one per thread: each DSMEM
  // read is a round trip, and 512 threads reading every rank queue 512 x cluster of them.
  if (warp == 0) {
    st = WarpStats(lane < cluster_size ? *AtRank(&s.stats, lane) : EmptyStats());
    if (lane == 0) s.row_stats = st;
  }
  __syncthreads();
  return s.row_stats;
}

// MSB-first radix search for the topk-th best key of `span` (each CTA of the cluster passes its
// own slice; `cluster_size` 1: the search is local to the CTA). `whole_row`: the keys are all the
// row's keys, so two shortcuts are sound: at most K keys (all win), and a digit bin that holds
// exactly the remaining winners (the threshold is then the bin's prefix with unlimited ties). On
// a subset (the K-th key's value bucket) neither is: keys outside the subset may lie between the
// prefix and the bucket, so the search runs to the exact K-th key. Per-warp bins with
// shared-memory atomics: slow when keys crowd, reached only for degenerate rows and crowded
// buckets. Not inlined: one copy serves both callers. Ends with a barrier.
__device__ __noinline__ Threshold RadixThreshold(ClusterSelectStorage& s, const KeySpan span, uint32_t topk,
                                                 int cluster_size, bool whole_row) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint32_t prefix = 0, prefix_mask = 0, remaining = topk;
  int pass = 0;
#pragma unroll 1
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits, ++pass) {
    if (lane < kBins) s.warp_bins[warp][lane] = 0;
    __syncwarp();
    ForEachKey(span, [&](uint32_t key) {
      if (key != kNotCandidate && (key & prefix_mask) == prefix) atomicAdd(&s.warp_bins[warp][(key >> shift) & (kBins - 1)], 1u);
    });
    __syncthreads();
    if (warp < kBins) {
      uint32_t total = 0;
      for (int w = lane; w < kSelectWarps; w += 32) total += s.warp_bins[w][warp];
      total = WarpSum(total);
      if (lane == 0) s.bin_local[pass & 1][warp] = total;
    }
    RowBarrier(cluster_size);
    if (tid < kBins) {
      uint32_t total = 0;
      for (int r = 0; r < cluster_size; ++r) total += cluster_size > 1 ? *AtRank(&s.bin_local[pass & 1][tid], r) : s.bin_local[pass & 1][tid];
      s.bin_total[tid] = total;
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

// What the bucket search could not settle: a radix search over `span`.
struct RadixJob {
  KeySpan span;
  uint32_t topk;
  int cluster_size;
  bool whole_row;
};

// The value-bucket fast path. Returns true with `th` set, or false with the radix search that
// must finish the job. `counted`: the pass that gathered the K-th bucket also left the emit's
// count table of a slice of at most kCountedTiles tiles in chunk_offsets: entry t * kSelectWarps
// + w = (keys of tile t, warp w in buckets above the K-th) << 16, the packing of the emit's
// (greater, equal) counts; the gathered keys (with their positions in gathered_pos) are all that
// is left to count once the threshold is known (AddGatheredCounts). Ends with a barrier.
__device__ bool BucketThreshold(ClusterSelectStorage& s, const KeySpan& slice, uint32_t topk, const SliceStats& row,
                                int cluster_size, Threshold& th, RadixJob& job, bool& counted) {
  const int tid = threadIdx.x;
  job = RadixJob{slice, topk, cluster_size, true};
  counted = false;
  const float lo = KeyToScore(row.lo), range = KeyToScore(row.hi) - lo;
  if (!(range > 0.0f && range < __int_as_float(0x7F800000))) return false;  // all equal, or infinities
  // Monotone in the score, so monotone in the key: bucket order is rank order.
  const float per_unit = static_cast<float>(kBuckets) / range;
  if (!(per_unit < __int_as_float(0x7F800000))) return false;  // a range so small that 2048 / range overflows
  // Every key lies in [row.lo, row.hi]; the clamp below 0 is insurance should stats and keys
  // ever disagree (an index below the histogram would corrupt shared memory silently).
  auto bucket_of = [&](uint32_t key) {
    return min(kBuckets - 1, max(0, static_cast<int>((KeyToScore(key) - lo) * per_unit)));
  };

  ForEachKey(slice, [&](uint32_t key) {
    if (key > kNaNKey) atomicAdd(&s.hist[bucket_of(key)], 1u);
  });
  __syncthreads();
  if (cluster_size == 1) {  // thread t owns 4 buckets counted from the top
    const int first = kBuckets - 4 * (tid + 1);
    const uint4 c = *reinterpret_cast<const uint4*>(&s.hist[first]);
    const uint32_t count[4] = {c.x, c.y, c.z, c.w};
    uint32_t total;
    uint32_t above = BlockExclusiveSum(s, c.x + c.y + c.z + c.w, total);
#pragma unroll
    for (int i = 3; i >= 0; --i) {
      if (above < topk && above + count[i] >= topk) {
        s.result_key = first + i;
        s.result_ties = above;
        s.result_count = count[i];
      }
      above += count[i];
    }
  } else {
    // A cluster, coarse then fine: the group of 32 buckets that holds the K-th number, then its
    // bucket. A CTA reads 64 + 32 counts from each other CTA instead of the whole histogram (every
    // thread reading its 4 buckets of every CTA: for a cluster of 8, 7 x 2048 remote loads per CTA
    // instead of 7 x 96).
    const int warp = tid / 32, lane = tid % 32;
    for (int g = warp; g < kGroups; g += kSelectWarps) {
      const uint32_t c = WarpSum(s.hist[g * kGroupBuckets + lane]);
      if (lane == 0) s.group_hist[g] = c;
    }
    ClusterBarrier();
    {
      const int g = kGroups - 1 - tid;  // thread t: the t-th group from the top
      uint32_t count = 0;
      if (tid < kGroups) {
#pragma unroll
        for (int r = 0; r < kMaxClusterRanks; ++r) {
          if (r < cluster_size) count += AtRank(s.group_hist, r)[g];
        }
      }
      uint32_t total;
      const uint32_t above = BlockExclusiveSum(s, count, total);
      if (tid < kGroups && above < topk && above + count >= topk) {
        s.kth_group = g;
        s.group_above = above;
      }
    }
    __syncthreads();
    if (warp == 0) {
      const int bucket = static_cast<int>(s.kth_group) * kGroupBuckets + (kGroupBuckets - 1 - lane);  // lane 0: the top
      uint32_t count = 0;
#pragma unroll
      for (int r = 0; r < kMaxClusterRanks; ++r) {
        if (r < cluster_size) count += AtRank(s.hist, r)[bucket];
      }
      const uint32_t above = s.group_above + WarpInclusiveSum(count) - count;
      if (above < topk && above + count >= topk) {
        s.result_key = bucket;
        s.result_ties = above;
        s.result_count = count;
      }
    }
  }
  __syncthreads();
  const int kth_bucket = static_cast<int>(s.result_key);
  const uint32_t rank = topk - s.result_ties;  // the K-th number is the rank-th best of its bucket
  const uint32_t in_bucket = s.result_count;   // over the whole row
  if (in_bucket > kGatherCapacity) {           // too concentrated for the fast path
    __syncthreads();
    return false;
  }
  // Gather the bucket, and count every (tile, warp)'s keys above it: those win whatever the exact
  // threshold inside the bucket turns out to be (buckets are monotone in the key), so the emit
  // needs no counting pass of its own.
  const uint32_t tiles = Tiles(slice);
  const bool count_above = tiles <= kCountedTiles;
  const int warp = tid / 32, lane = tid % 32;
  ForEachQuad(slice, [&](uint32_t pos, const uint4& q) {
    const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
    uint32_t above = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t key = quad[i];
      if (key > kNaNKey) {
        const int bucket = bucket_of(key);
        above += bucket > kth_bucket;
        if (bucket == kth_bucket) {
          const uint32_t j = atomicAdd(&s.gathered_count, 1u);
          s.gathered[j] = key;
          s.gathered_pos[j] = pos + i;
        }
      }
    }
    if (count_above) {
      above = WarpSum(above);
      const uint32_t tile = pos / kTileKeys;
      if (lane == 0) s.chunk_offsets[tile * kSelectWarps + warp] = above << 16;
    }
  });
  counted = count_above;
  // Every CTA copies the whole bucket (any order: only the rank-th key and its multiplicity
  // matter), then ranks it locally, identically in every CTA.
  uint32_t* united = s.gathered;
  if (cluster_size > 1) {
    ClusterBarrier();
    if (tid < cluster_size) s.rank_counts[tid] = *AtRank(&s.gathered_count, tid);
    __syncthreads();
    // Entry j of the united bucket comes from the rank whose range of entries holds j. Every
    // thread issues all its DSMEM loads before its first store, so the copy costs one round trip;
    // a loop rank by rank would cost one per rank (a store may alias the next rank's load, so the
    // compiler keeps them in order).
    uint32_t start[kMaxClusterRanks];
    uint32_t total = 0;
#pragma unroll
    for (int r = 0; r < kMaxClusterRanks; ++r) {
      start[r] = total;
      total += r < cluster_size ? s.rank_counts[r] : 0u;
    }
    constexpr int kPerThread = kGatherCapacity / kSelectThreads;
    uint32_t v[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const uint32_t j = tid + u * kSelectThreads;
      int from = 0;  // the last rank whose entries start at or before j
      uint32_t first = 0;
#pragma unroll
      for (int r = 1; r < kMaxClusterRanks; ++r) {
        if (r < cluster_size && j >= start[r]) {
          from = r;
          first = start[r];
        }
      }
      v[u] = j < total ? AtRank(s.gathered, from)[j - first] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const uint32_t j = tid + u * kSelectThreads;
      if (j < total) s.united[j] = v[u];
    }
    united = s.united;
  }
  __syncthreads();
  if (in_bucket > kRankAllPairsMax) {
    // Every key equal to the K-th lies in this bucket, so ties found among the gathered keys are
    // the ties of the row.
    job = RadixJob{KeySpan{united, nullptr, in_bucket}, rank, 1, false};
    return false;
  }
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
      // All of the key's copies lie in this bucket: when K takes every one of them, say
      // "unlimited" so that the emit need not rank ties by position.
      s.result_ties = rank == not_less ? UINT_MAX : rank - greater;
    }
  }
  __syncthreads();
  th = Threshold{s.result_key, s.result_ties};
  __syncthreads();
  return true;
}

// The row's threshold, given the row's stats (every CTA has the same). Call after
// ResetClusterSelect and RowStats. `counted`: see BucketThreshold. Ends with a barrier.
__device__ Threshold ClusterThreshold(ClusterSelectStorage& s, const KeySpan& slice, uint32_t topk,
                                      const SliceStats& row, int cluster_size, bool& counted) {
  counted = false;
  if (row.numbers + row.nans <= topk) return kTakeAll;
  if (row.numbers < topk) return Threshold{kNaNKey, topk - row.numbers};  // every number, then NaNs by position
  Threshold th;
  RadixJob job;
  if (BucketThreshold(s, slice, topk, row, cluster_size, th, job, counted)) return th;
  return RadixThreshold(s, job.span, job.topk, job.cluster_size, job.whole_row);  // (gathered or whole slice)
}

__device__ __forceinline__ bool Wins(uint32_t key, const Threshold& th) { return key > th.key; }
__device__ __forceinline__ bool Ties(uint32_t key, const Threshold& th) {
  return key == th.key && key != kNotCandidate;  // a threshold of 0 (all -inf) must not take invalid tokens
}

// Completes a count table left by BucketThreshold (`counted`): the gathered keys' (greater,
// equal) counts against the threshold, added to their (tile, warp) entries. Ends with a barrier.
__device__ void AddGatheredCounts(ClusterSelectStorage& s, const Threshold& th) {
#pragma unroll 1
  for (uint32_t j = threadIdx.x; j < s.gathered_count; j += kSelectThreads) {
    const uint32_t key = s.gathered[j], pos = s.gathered_pos[j];
    const uint32_t entry = (pos / kTileKeys) * kSelectWarps + (pos % kTileKeys) / (kTileKeys / kSelectWarps);
    atomicAdd(&s.chunk_offsets[entry], (uint32_t(Wins(key, th)) << 16) + uint32_t(Ties(key, th)));
  }
  __syncthreads();
}

__device__ void SortSelectedDescending(SortStorage& s, uint32_t selected) {
  for (int i = selected + threadIdx.x; i < SortStorage::kCapacity; i += kSelectThreads) s.words[i] = 0ull;
  __syncthreads();
  unsigned long long items[SortStorage::kItems];
#pragma unroll
  for (int i = 0; i < SortStorage::kItems; ++i) items[i] = s.words[threadIdx.x * SortStorage::kItems + i];
  __syncthreads();
  typename SortStorage::Sort(s.temp).Sort(items, SortStorage::Greater());  // words are distinct: stability moot
#pragma unroll
  for (int i = 0; i < SortStorage::kItems; ++i) s.words[threadIdx.x * SortStorage::kItems + i] = items[i];
  __syncthreads();
}

}  // namespace ffi_dsa::sm90
