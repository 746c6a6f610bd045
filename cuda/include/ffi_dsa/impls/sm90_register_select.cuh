// The exact top-K of a query row whose slice per CTA fits in registers (up to kRegSliceKeys keys a
// CTA: a row of up to 16K tokens on one CTA, longer rows over a cluster of CTAs), in few short steps:
//
// 1. Each thread loads its keys once into registers (a quad per 2048-key tile, the layout of
//    sm90_cluster_topk.cuh's passes) and counts them into a 4096-bin histogram whose bin is the key's
//    score rounded to FP16, as an ordered 16-bit integer, top 12 bits (NaN in bin 0): monotone in
//    the key, 64 bins per octave, and no pass over the keys to find their range first. A cluster
//    sums the histograms through DSMEM (each CTA sums a 1/C share of the bins and writes it back to
//    every CTA, one round trip: the idea of vLLM's cooperative top-k).
// 2. A block scan from the top finds the bin of the K-th key. Its keys (a few dozen to a few hundred
//    on real rows) are gathered into shared memory, with the cluster's gathered lists copied into
//    every CTA in one round trip, and ranked exactly there (RefineList: all pairs for a short list,
//    else linear sub-bins of the list's key range until it is short or all one key). A bin too
//    crowded to gather (a relu plateau of exact zeros, or scores beyond FP16's range) is narrowed
//    in registers instead: its key range, then linear sub-bins of it, each level a histogram pass.
// 3. Emit: a thread's per-tile (greater, equal) counts, one block scan over (tile, warp) and the
//    lower-ranked CTAs' totals give every winner its output slot by ascending position, ties at the
//    threshold to the smallest positions (the contract's order), with no pass over the keys in
//    memory.
// Every cluster-wide decision is taken from cluster-wide totals, so every CTA of a cluster passes
// the same cluster barriers.
#pragma once
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_cluster_topk.cuh"
#include "ffi_dsa/impls/sm90_select_params.cuh"
#include "ffi_dsa/impls/sm90_warp.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

// Tiles of kTileKeys keys a thread holds: 32 keys, 16K per CTA.
constexpr uint32_t kRegTiles = 8;
constexpr uint32_t kRegSliceKeys = kRegTiles * kTileKeys;
constexpr int kLevelBins = 4096;
constexpr int kLevelBinsPerThread = kLevelBins / kSelectThreads;
static_assert(kLevelBinsPerThread == 8, "a thread scans two quads of bins");
// Candidate keys a CTA gathers and ranks in shared memory.
constexpr uint32_t kListCapacity = 2048;
static_assert(kListCapacity % kSelectThreads == 0, "the cluster's lists are copied a fixed count per thread");
// Lists up to this long are ranked by all pairs of keys; longer ones are narrowed first.
constexpr uint32_t kPairRankMax = 256;
// The emit's (tile, warp) table: one warp scans it, four entries a lane.
constexpr int kEmitEntries = kRegTiles * kSelectWarps;
static_assert(kEmitEntries == 4 * 32, "one warp scans the emit table");

struct RegisterSelectStorage {
  union {
    // sorted=True: rank 0's collects the winners of every CTA of the cluster (in the emit, last).
    SortStorage sorting;
    // Before the emit. A sorted cluster's emit first passes a cluster barrier, so no CTA's winners
    // land in rank 0's buffer while rank 0 still works here.
    struct {
      alignas(16) uint32_t work[2][kListCapacity];  // RefineList's narrowed lists
      alignas(16) uint32_t hist[kLevelBins];
    } pre;
  };
  alignas(16) uint32_t gathered[kListCapacity];  // this CTA's candidates (read by the cluster)
  alignas(16) uint32_t united[kListCapacity];    // the cluster's candidates, rank by rank
  // Read by the other CTAs of the cluster after a cluster barrier:
  uint32_t gathered_count;    // this CTA's candidates
  uint32_t above_count;       // this CTA's keys above every candidate
  uint32_t range_lo, range_hi;  // a crowded bin's key range in this CTA
  unsigned long long emit_total;  // this CTA's (greater << 32) | equal against the threshold
  // Local:
  uint32_t warp_sums[kSelectWarps];
  uint32_t warp_lo[kSelectWarps], warp_hi[kSelectWarps];
  alignas(16) uint32_t emit_table[kEmitEntries];
  uint32_t rank_gathered[kMaxClusterRanks], rank_above[kMaxClusterRanks];
  unsigned long long rank_totals[kMaxClusterRanks];
  uint32_t found_bin, found_above, found_count;
  uint32_t result_key, result_ties;
  uint32_t list_count, cta_emit_total;
};

// ---- small block-wide helpers --------------------------------------------------------------

// Exclusive prefix over the CTA's threads in thread order; `total` gets the sum. One barrier; the
// caller passes another before warp_sums is used again.
__device__ __forceinline__ uint32_t RegBlockExclusiveSum(RegisterSelectStorage& s, uint32_t x, uint32_t& total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t incl = WarpInclusiveSum(x);
  if (lane == 31) s.warp_sums[warp] = incl;
  __syncthreads();
  const uint32_t w = lane < kSelectWarps ? s.warp_sums[lane] : 0u;
  const uint32_t winc = WarpInclusiveSum(w);
  const uint32_t before = __shfl_sync(0xFFFFFFFFu, winc - w, warp);
  total = __shfl_sync(0xFFFFFFFFu, winc, kSelectWarps - 1);
  return before + incl - x;
}

// Smallest `lo` and largest `hi` over the CTA, to every thread. Two barriers.
__device__ __forceinline__ void RegBlockRange(RegisterSelectStorage& s, uint32_t& lo, uint32_t& hi) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  lo = __reduce_min_sync(0xFFFFFFFFu, lo);
  hi = __reduce_max_sync(0xFFFFFFFFu, hi);
  if (lane == 0) {
    s.warp_lo[warp] = lo;
    s.warp_hi[warp] = hi;
  }
  __syncthreads();
  lo = __reduce_min_sync(0xFFFFFFFFu, lane < kSelectWarps ? s.warp_lo[lane] : UINT_MAX);
  hi = __reduce_max_sync(0xFFFFFFFFu, lane < kSelectWarps ? s.warp_hi[lane] : 0u);
  __syncthreads();  // warp_lo / warp_hi are rewritten by the next call
}

__device__ __forceinline__ void ZeroLevelHist(RegisterSelectStorage& s) {
  uint4* h = reinterpret_cast<uint4*>(s.pre.hist);
#pragma unroll
  for (int i = 0; i < kLevelBinsPerThread / 4; ++i) h[threadIdx.x + i * kSelectThreads] = make_uint4(0, 0, 0, 0);
}

// The bin holding the need-th largest counted key (need >= 1), from the top: found_bin, the keys
// in bins above it (found_above < need) and in it (found_count). Returns the histogram's total;
// when that is below need nothing is found. Ends with a barrier.
__device__ uint32_t FindLevelBin(RegisterSelectStorage& s, uint32_t need) {
  const int first = kLevelBins - kLevelBinsPerThread * (threadIdx.x + 1);  // thread 0: the top bins
  const uint4 a = *reinterpret_cast<const uint4*>(&s.pre.hist[first]);
  const uint4 b = *reinterpret_cast<const uint4*>(&s.pre.hist[first + 4]);
  const uint32_t count[kLevelBinsPerThread] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t mine = 0;
#pragma unroll
  for (int i = 0; i < kLevelBinsPerThread; ++i) mine += count[i];
  uint32_t total;
  uint32_t above = RegBlockExclusiveSum(s, mine, total);
#pragma unroll
  for (int i = kLevelBinsPerThread - 1; i >= 0; --i) {
    if (above < need && above + count[i] >= need) {
      s.found_bin = first + i;
      s.found_above = above;
      s.found_count = count[i];
    }
    above += count[i];
  }
  __syncthreads();
  return total;
}

// ---- the cluster's exchanges -----------------------------------------------------------------

// Every CTA's level histogram becomes the cluster's sum: CTA r sums bins [r, r + 1) x 4096 / C over
// the C CTAs and writes the sums back into each of them (a (bin, rank) pair per thread and slot,
// the C ranks of a bin on adjacent lanes). C is a power of two. Two cluster barriers.
__device__ void ClusterSumLevelHist(RegisterSelectStorage& s, int cluster_size, int cluster_rank) {
  ClusterBarrier();  // every CTA's histogram is complete
  const uint32_t per_rank = kLevelBins / cluster_size;
  uint32_t* remote[kLevelBinsPerThread];
  uint32_t v[kLevelBinsPerThread];
#pragma unroll
  for (int k = 0; k < kLevelBinsPerThread; ++k) {
    const uint32_t pair = threadIdx.x + k * kSelectThreads;
    const int rank = static_cast<int>(pair & (cluster_size - 1));
    remote[k] = AtRank(&s.pre.hist[cluster_rank * per_rank + pair / cluster_size], rank);
    v[k] = *remote[k];
  }
#pragma unroll
  for (int k = 0; k < kLevelBinsPerThread; ++k) {
    for (int m = 1; m < cluster_size; m *= 2) v[k] += __shfl_xor_sync(0xFFFFFFFFu, v[k], m);
  }
#pragma unroll
  for (int k = 0; k < kLevelBinsPerThread; ++k) *remote[k] = v[k];
  ClusterBarrier();  // every CTA holds the sums
}

// The cluster's crowded-bin key range: each CTA's range_lo / range_hi combined. One cluster barrier.
__device__ void ClusterRange(RegisterSelectStorage& s, uint32_t& lo, uint32_t& hi, int cluster_size) {
  if (threadIdx.x == 0) {
    s.range_lo = lo;
    s.range_hi = hi;
  }
  ClusterBarrier();
  const int lane = threadIdx.x % 32;
  lo = __reduce_min_sync(0xFFFFFFFFu, lane < cluster_size ? *AtRank(&s.range_lo, lane) : UINT_MAX);
  hi = __reduce_max_sync(0xFFFFFFFFu, lane < cluster_size ? *AtRank(&s.range_hi, lane) : 0u);
}

// Copies every CTA's gathered keys into united (rank 0's first, then rank 1's, ...), after
// publishing this CTA's gathered_count and above_count; rank_gathered / rank_above get every rank's.
// One cluster barrier; all DSMEM loads of a thread are issued before its first store, so the copy
// costs one round trip.
__device__ void UniteGathered(RegisterSelectStorage& s, int cluster_size) {
  const int tid = threadIdx.x;
  ClusterBarrier();
  if (tid < cluster_size) {
    s.rank_gathered[tid] = *AtRank(&s.gathered_count, tid);
    s.rank_above[tid] = *AtRank(&s.above_count, tid);
  }
  __syncthreads();
  uint32_t start[kMaxClusterRanks];
  uint32_t total = 0;
#pragma unroll
  for (int r = 0; r < kMaxClusterRanks; ++r) {
    start[r] = total;
    total += r < cluster_size ? s.rank_gathered[r] : 0u;
  }
  constexpr int kPerThread = kListCapacity / kSelectThreads;
  uint32_t v[kPerThread];
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const uint32_t j = tid + u * kSelectThreads;
    int from = 0;  // the last rank whose entries start at or before j, and where they start
    uint32_t first = 0;
#pragma unroll
    for (int r = 1; r < kMaxClusterRanks; ++r) {
      if (r < cluster_size && j >= start[r]) {
        from = r;
        first = start[r];
      }
    }
    v[u] = j < total ? *AtRank(&s.gathered[j - first], from) : 0u;
  }
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const uint32_t j = tid + u * kSelectThreads;
    if (j < total) s.united[j] = v[u];
  }
  __syncthreads();
}

// ---- exact threshold among gathered candidates -----------------------------------------------

// The need-th largest key of `list` (count keys: every key of the row inside one key interval, so
// every copy of the answer is among them) and how many of its copies win (UINT_MAX: all). Every
// thread gets the answer; each CTA of a cluster computes it alike from its copy of the list.
__device__ Threshold RefineList(RegisterSelectStorage& s, const uint32_t* list, uint32_t count, uint32_t need) {
  const int tid = threadIdx.x;
  int buffer = 0;
#pragma unroll 1
  while (count > kPairRankMax) {
    uint32_t lo = UINT_MAX, hi = 0;
    for (uint32_t j = tid; j < count; j += kSelectThreads) {
      lo = min(lo, list[j]);
      hi = max(hi, list[j]);
    }
    RegBlockRange(s, lo, hi);
    if (lo == hi) return Threshold{lo, need == count ? UINT_MAX : need};
    // Linear sub-bins of [lo, hi]: exact integer arithmetic, so monotone in the key.
    const int width_bits = 32 - __clz(hi - lo);
    const int shift = width_bits > 12 ? width_bits - 12 : 0;
    ZeroLevelHist(s);
    if (tid == 0) s.list_count = 0;
    __syncthreads();
    for (uint32_t j = tid; j < count; j += kSelectThreads) atomicAdd(&s.pre.hist[(list[j] - lo) >> shift], 1u);
    __syncthreads();
    FindLevelBin(s, need);  // its total is count >= need
    const uint32_t bin = s.found_bin;
    need -= s.found_above;
    uint32_t* narrowed = s.pre.work[buffer];
    for (uint32_t j = tid; j < count; j += kSelectThreads) {
      const uint32_t key = list[j];
      if (((key - lo) >> shift) == bin) narrowed[atomicAdd(&s.list_count, 1u)] = key;
    }
    count = s.found_count;
    __syncthreads();
    list = narrowed;
    buffer ^= 1;
  }
  // All pairs, g threads per candidate (adjacent lanes): the largest power of two with g x count
  // threads in the CTA, at most a warp.
  uint32_t g = 32;
  while (g > 1 && g * count > kSelectThreads) g /= 2;
  const uint32_t c = tid / g, part = tid % g;
  uint32_t greater = 0, not_less = 0, e = 0;
  if (c < count) {
    e = list[c];
    for (uint32_t j = part; j < count; j += g) {
      const uint32_t x = list[j];
      greater += x > e;
      not_less += x >= e;
    }
  }
  for (uint32_t m = 1; m < g; m *= 2) {
    greater += __shfl_xor_sync(0xFFFFFFFFu, greater, m);
    not_less += __shfl_xor_sync(0xFFFFFFFFu, not_less, m);
  }
  if (c < count && part == 0 && greater < need && need <= not_less) {  // every copy of e agrees
    s.result_key = e;
    s.result_ties = need == not_less ? UINT_MAX : need - greater;
  }
  __syncthreads();
  const Threshold th{s.result_key, s.result_ties};
  __syncthreads();  // result_* may be rewritten by the next select
  return th;
}

// ---- the slice's keys in registers -----------------------------------------------------------

// A thread's keys: tile u's quad at QuadPosition(u); kNotCandidate past the span's end.
struct RegKeys {
  uint4 q[kRegTiles];
  uint32_t tiles;
  __device__ __forceinline__ uint32_t Key(uint32_t u, int i) const {
    return i == 0 ? q[u].x : (i == 1 ? q[u].y : (i == 2 ? q[u].z : q[u].w));
  }
};

// Issues every load of the thread's keys at once (their latency overlaps).
__device__ __forceinline__ void LoadRegKeys(const KeySpan& span, RegKeys& k) {
  k.tiles = Tiles(span);
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
    const bool whole = (u + 1) * kTileKeys <= span.count;  // the same for every thread
    k.q[u] = whole ? LoadWholeQuad(span, QuadPosition(u)) : LoadQuad(span, QuadPosition(u));
  }
}

// FP16 bin of a key (see the top of the file). NaN, and non-candidates (never counted), bin 0: the
// ordered FP16 of a number is at least 0x03FF (-inf), so no number lands there.
__device__ __forceinline__ uint32_t CoarseBin(uint32_t key) {
  const uint32_t h = __half_as_ushort(__float2half_rn(KeyToScore(key)));
  const uint32_t ordered = (h & 0x8000u) ? (~h & 0xFFFFu) : (h | 0x8000u);
  return key > kNaNKey ? ordered >> 4 : 0u;
}

// A thread's level-0 bins, two per word; 0xFFFF for a key that is no candidate.
struct RegBins {
  uint32_t packed[kRegTiles * 2];
  __device__ __forceinline__ uint32_t Bin(uint32_t u, int i) const { return (packed[2 * u + i / 2] >> (16 * (i & 1))) & 0xFFFFu; }
};

constexpr uint32_t kNoBin = 0xFFFFu;

__device__ __forceinline__ void CountCoarseBins(RegisterSelectStorage& s, const RegKeys& k, RegBins& bins) {
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
    bins.packed[2 * u] = bins.packed[2 * u + 1] = kNoBin | (kNoBin << 16);
    if (u < k.tiles) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t key = k.Key(u, i);
        const uint32_t bin = key != kNotCandidate ? CoarseBin(key) : kNoBin;
        if (bin != kNoBin) atomicAdd(&s.pre.hist[bin], 1u);
        const int shift = 16 * (i & 1);
        bins.packed[2 * u + i / 2] = (bins.packed[2 * u + i / 2] & ~(0xFFFFu << shift)) | (bin << shift);
      }
    }
  }
}

// The candidates (`in`) into gathered and the count of keys above them (`above`) into above_count.
// Both counters are zeroed by the caller before a barrier. Ends with a barrier.
template <typename In, typename Above>
__device__ __forceinline__ void GatherCandidates(RegisterSelectStorage& s, const RegKeys& k, In&& in, Above&& above) {
  uint32_t mine = 0;
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
    if (u < k.tiles) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t key = k.Key(u, i);
        if (in(u, i, key)) {
          const uint32_t j = atomicAdd(&s.gathered_count, 1u);
          if (j < kListCapacity) s.gathered[j] = key;
        }
        mine += above(u, i, key);
      }
    }
  }
  mine = WarpSum(mine);
  if (threadIdx.x % 32 == 0) atomicAdd(&s.above_count, mine);
  __syncthreads();
}

// ---- emit ------------------------------------------------------------------------------------

// (greater, equal) counts against the threshold of the keys before each of this thread's quads in
// the CTA's slice (packed: greater << 16 | equal; a slice holds at most 16K keys), and the CTA's
// totals in cta_emit_total. Two barriers.
__device__ __forceinline__ void EmitCounts(RegisterSelectStorage& s, const RegKeys& k, const Threshold& th,
                                           uint32_t (&before)[kRegTiles]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t own[kRegTiles], incl[kRegTiles];
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
    own[u] = 0;
    if (u < k.tiles) {
#pragma unroll
      for (int i = 0; i < 4; ++i) own[u] += (uint32_t(Wins(k.Key(u, i), th)) << 16) + uint32_t(Ties(k.Key(u, i), th));
    }
    incl[u] = own[u];
  }
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
#pragma unroll
    for (uint32_t u = 0; u < kRegTiles; ++u) {
      if (u < k.tiles) {  // the same for every thread
        const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, incl[u], o);
        if (lane >= o) incl[u] += y;
      }
    }
  }
  if (lane == 31) {
#pragma unroll
    for (uint32_t u = 0; u < kRegTiles; ++u) s.emit_table[u * kSelectWarps + warp] = u < k.tiles ? incl[u] : 0u;
  }
  __syncthreads();
  if (warp == 0) {  // entries in (tile, warp) order: position order
    const uint4 e = *reinterpret_cast<const uint4*>(&s.emit_table[4 * lane]);
    const uint32_t sum = e.x + e.y + e.z + e.w;
    const uint32_t inclusive = WarpInclusiveSum(sum);
    uint4 x;
    x.x = inclusive - sum;
    x.y = x.x + e.x;
    x.z = x.y + e.y;
    x.w = x.z + e.z;
    *reinterpret_cast<uint4*>(&s.emit_table[4 * lane]) = x;
    if (lane == 31) s.cta_emit_total = inclusive;
  }
  __syncthreads();
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) before[u] = s.emit_table[u * kSelectWarps + warp] + incl[u] - own[u];
}

// Every winner of this thread's keys to its slot of the row's output: `out` (ids), or the sort
// buffer `words` (RankWord) when sorted. `lower_*`: the winners and threshold copies of the
// lower-ranked CTAs' slices.
__device__ __forceinline__ void EmitWrite(const SelectParams& p, const RegKeys& k, const Threshold& th,
                                          const uint32_t (&before)[kRegTiles], uint32_t lower_greater,
                                          uint32_t lower_equal, int64_t begin, const int32_t* pages, int32_t* out,
                                          unsigned long long* words) {
  const uint32_t topk = static_cast<uint32_t>(p.topk);
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
    if (u >= k.tiles) break;
    const uint32_t pos = QuadPosition(u);
    uint32_t greater = lower_greater + (before[u] >> 16), equal = lower_equal + (before[u] & 0xFFFFu);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t key = k.Key(u, i);
      const bool wins = Wins(key, th), ties = Ties(key, th);
      const uint32_t slot = wins ? greater + min(equal, th.ties) : greater + equal;
      if ((wins || (ties && equal < th.ties)) && slot < topk) {  // (pos + i is inside the slice)
        const int64_t t = begin + pos + i;
        if (words != nullptr) {
          words[slot] = RankWord(key, static_cast<uint32_t>(t));
        } else {
          out[slot] = p.positions ? static_cast<int32_t>(t) : GlobalTokenId(pages, pos + i);
        }
      }
      greater += wins;
      equal += ties;
    }
  }
}

// The winners and threshold copies of the slices of the CTAs ranked below this one, from the
// cluster's united candidates (every key above them wins; the ones in them are compared with the
// threshold). One barrier.
__device__ __forceinline__ void LowerFromList(RegisterSelectStorage& s, const Threshold& th, int cluster_rank,
                                              uint32_t& lower_greater, uint32_t& lower_equal) {
  uint32_t start = 0, above = 0;
  for (int r = 0; r < cluster_rank; ++r) {
    start += s.rank_gathered[r];
    above += s.rank_above[r];
  }
  uint32_t packed = 0;  // (greater << 16) | equal: the list holds at most kListCapacity keys
  for (uint32_t j = threadIdx.x; j < start; j += kSelectThreads) {
    const uint32_t x = s.united[j];
    packed += (uint32_t(x > th.key) << 16) + uint32_t(x == th.key);
  }
  uint32_t total;
  RegBlockExclusiveSum(s, packed, total);
  lower_greater = above + (total >> 16);
  lower_equal = total & 0xFFFFu;
}

// The same from every CTA's own totals (cta_emit_total), exchanged: for a threshold found without
// a united list. One cluster barrier.
__device__ __forceinline__ void LowerFromTotals(RegisterSelectStorage& s, int cluster_size, int cluster_rank,
                                                uint32_t& lower_greater, uint32_t& lower_equal) {
  if (threadIdx.x == 0) {
    const uint32_t t = s.cta_emit_total;
    s.emit_total = (static_cast<unsigned long long>(t >> 16) << 32) | (t & 0xFFFFu);
  }
  ClusterBarrier();
  if (threadIdx.x < cluster_size) s.rank_totals[threadIdx.x] = *AtRank(&s.emit_total, threadIdx.x);
  __syncthreads();
  lower_greater = lower_equal = 0;
  for (int r = 0; r < cluster_rank; ++r) {
    lower_greater += static_cast<uint32_t>(s.rank_totals[r] >> 32);
    lower_equal += static_cast<uint32_t>(s.rank_totals[r]);
  }
}

// ---- the whole select ------------------------------------------------------------------------

// Result of the threshold search: the threshold, the row's winners, and whether the cluster's
// united list holds what the lower CTAs' counts need.
struct RegThreshold {
  Threshold th;
  uint32_t selected;
  bool from_list;
};

// A crowded level-0 bin (more keys than a list holds): its key range, then linear sub-bins of the
// range counted from the registers, level after level, until the K-th key's sub-bin can be
// gathered or is a single key. `need`: the K-th key's rank inside the bin; `count`: the bin's keys.
__device__ RegThreshold NarrowCrowdedBin(RegisterSelectStorage& s, const RegKeys& k, const RegBins& bins,
                                         uint32_t bin0, uint32_t need, uint32_t count, int cluster_size,
                                         int cluster_rank, const uint32_t topk) {
  uint32_t lo = UINT_MAX, hi = 0;
#pragma unroll
  for (uint32_t u = 0; u < kRegTiles; ++u) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (u < k.tiles && bins.Bin(u, i) == bin0) {
        lo = min(lo, k.Key(u, i));
        hi = max(hi, k.Key(u, i));
      }
    }
  }
  RegBlockRange(s, lo, hi);
  if (cluster_size > 1) ClusterRange(s, lo, hi, cluster_size);
#pragma unroll 1
  while (true) {
    if (lo == hi) return RegThreshold{Threshold{lo, need == count ? UINT_MAX : need}, topk, false};
    const int width_bits = 32 - __clz(hi - lo);
    const int shift = width_bits > 12 ? width_bits - 12 : 0;
    ZeroLevelHist(s);
    if (threadIdx.x == 0) s.gathered_count = s.above_count = 0;
    __syncthreads();
#pragma unroll
    for (uint32_t u = 0; u < kRegTiles; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t key = k.Key(u, i);
        if (u < k.tiles && key >= lo && key <= hi) atomicAdd(&s.pre.hist[(key - lo) >> shift], 1u);
      }
    }
    if (cluster_size > 1) ClusterSumLevelHist(s, cluster_size, cluster_rank); else __syncthreads();
    FindLevelBin(s, need);  // its total is count >= need
    need -= s.found_above;
    count = s.found_count;
    const uint32_t next_lo = lo + (s.found_bin << shift);
    hi = static_cast<uint32_t>(min(uint64_t(hi), uint64_t(next_lo) + ((uint64_t(1) << shift) - 1)));
    lo = next_lo;
    if (count <= kListCapacity) {
      const uint32_t l = lo, h = hi;
      GatherCandidates(s, k, [&](uint32_t, int, uint32_t key) { return key >= l && key <= h; },
                       [&](uint32_t, int, uint32_t key) { return key > h; });
      const uint32_t* list = s.gathered;
      if (cluster_size > 1) {
        UniteGathered(s, cluster_size);
        list = s.united;
      }
      return RegThreshold{RefineList(s, list, count, need), topk, true};
    }
  }
}

// The row's threshold from this CTA's keys (every CTA of the cluster with its own slice).
__device__ RegThreshold RegisterThreshold(const SelectParams& p, RegisterSelectStorage& s, const RegKeys& k,
                                          bool workspace_keys, int cluster_size, int cluster_rank) {
  const uint32_t topk = static_cast<uint32_t>(p.topk);
  ZeroLevelHist(s);
  if (threadIdx.x == 0) s.gathered_count = s.above_count = 0;
  __syncthreads();
  RegBins bins;
  CountCoarseBins(s, k, bins);
  // The keys are in registers: the workspace is no longer read by this CTA.
  if (p.let_next_in && workspace_keys) AllowDependentLaunch();
  if (cluster_size > 1) ClusterSumLevelHist(s, cluster_size, cluster_rank); else __syncthreads();
  const uint32_t total = FindLevelBin(s, topk);
  if (total <= topk) return RegThreshold{kTakeAll, total, false};  // at most K candidates: all win
  const uint32_t bin0 = s.found_bin, need = topk - s.found_above, count = s.found_count;
  if (count > kListCapacity) return NarrowCrowdedBin(s, k, bins, bin0, need, count, cluster_size, cluster_rank, topk);
  GatherCandidates(s, k, [&](uint32_t u, int i, uint32_t) { return bins.Bin(u, i) == bin0; },
                   [&](uint32_t u, int i, uint32_t) {
                     const uint32_t b = bins.Bin(u, i);
                     return b != kNoBin && b > bin0;
                   });
  const uint32_t* list = s.gathered;
  if (cluster_size > 1) {
    UniteGathered(s, cluster_size);
    list = s.united;
  }
  return RegThreshold{RefineList(s, list, count, need), topk, true};
}

// The exact top-K of query row `query_row` (n tokens of block-table row `row`) from this CTA's
// slice of it: keys [begin, begin + span.count) of the query, read from `span` into registers;
// `pages` the slice's page ids (unused for ids="positions"). Every CTA of the row's cluster calls it
// with its own slice; a row of at most kRegSliceKeys tokens is one CTA's (cluster_size 1).
// `workspace_keys`: the keys are ScorePagesKernel's, in the workspace (the next kernel may be let in
// once they are in registers).
__device__ void RegisterSelectSlice(const SelectParams& p, RegisterSelectStorage& s, int64_t query_row, int64_t row,
                                    int64_t n, int64_t begin, const KeySpan& span, const int32_t* pages,
                                    bool workspace_keys, int cluster_size, int cluster_rank) {
  const uint32_t topk = static_cast<uint32_t>(p.topk);
  RegKeys k;
  LoadRegKeys(span, k);
  RegThreshold r{kTakeAll, 0, false};
  const bool threshold = ThresholdNeeded(n, p.topk);
  if (threshold) r = RegisterThreshold(p, s, k, workspace_keys, cluster_size, cluster_rank);

  uint32_t before[kRegTiles];
  EmitCounts(s, k, r.th, before);
  if (!threshold) {
    // Sorted, at most K tokens (one CTA): every candidate wins.
    if (p.let_next_in && workspace_keys) AllowDependentLaunch();
    r.selected = min(topk, (s.cta_emit_total >> 16) + (s.cta_emit_total & 0xFFFFu));
  }
  uint32_t lower_greater = 0, lower_equal = 0;
  if (cluster_size > 1) {
    if (r.from_list) {
      LowerFromList(s, r.th, cluster_rank, lower_greater, lower_equal);
    } else {
      LowerFromTotals(s, cluster_size, cluster_rank, lower_greater, lower_equal);
    }
  }
  int32_t* out = p.topk_indices + query_row * p.topk;
  if (!p.sorted) {
    EmitWrite(p, k, r.th, before, lower_greater, lower_equal, begin, pages, out, nullptr);
#pragma unroll 1
    for (uint32_t i = r.selected + cluster_rank * kSelectThreads + threadIdx.x; i < topk;
         i += cluster_size * kSelectThreads) {
      out[i] = -1;
    }
    if (cluster_size > 1) ClusterBarrier();  // no CTA leaves while another may read its shared memory
    return;
  }
  // Sorted: every CTA's winners into rank 0's sort buffer, which rank 0 sorts and writes.
  if (cluster_size > 1) ClusterBarrier();  // rank 0 is done with `pre`, where its sort buffer lies
  unsigned long long* words = cluster_size > 1 ? AtRank(s.sorting.words, 0) : s.sorting.words;
  EmitWrite(p, k, r.th, before, lower_greater, lower_equal, begin, pages, out, words);
  if (cluster_size > 1) ClusterBarrier();  // every winner is in rank 0's buffer
  if (cluster_rank != 0) return;
  SortSelectedDescending(s.sorting, r.selected);
  const int32_t* row_table = p.block_table + row * p.max_pages;
#pragma unroll 1
  for (uint32_t i = threadIdx.x; i < topk; i += kSelectThreads) {
    int32_t id = -1;
    if (i < r.selected) {
      const uint32_t t = RankWordPosition(s.sorting.words[i]);
      id = p.positions ? static_cast<int32_t>(t) : GlobalTokenId(row_table, t);
    }
    out[i] = id;
  }
}

}  // namespace ffi_dsa::sm90
