// The exact top-K of one query row's rank keys (rank_key.h) from a histogram of fixed bins
// (select_bins.h) that the caller builds where the keys first reach shared memory. One CTA or a
// thread-block cluster (each CTA a contiguous slice of the row); templated on the threads that
// run it and the barrier they share, so a kernel may run it on all its threads or on a part.
//
// After the histogram, two passes over the keys and one emit, placed by scans (never by atomics:
// the output is in ascending position, ties go to the smaller position, the same bytes every run):
//   1. ThresholdBin: one block scan of the bins (a cluster: coarse group sums of every CTA, then
//      the fine bins of the K-th group) gives the bin B of the K-th best key, the keys above it and
//      how many of B's keys win ("need").
//   2. MemberPass: per (tile, warp) counts of keys above B and in B, and B's keys ("members")
//      with their positions in a short list (a cluster: each CTA its own, read by all).
//   3. Resolve: a bin of one value (NaN, exact zero, or whose members are all equal) needs no
//      ranking: its first `need` keys by position win. A short list (the common case on spread
//      keys) is ranked by all pairs over the whole group, each member by the lanes of one warp,
//      whose first marks it in place (kWinMark) if it wins: one barrier. A longer one is split by
//      a 256-way digit of the keys and only the threshold digit's few members are ranked (all pairs
//      over the whole list if that digit is crowded), then marked; a list too long falls back to an
//      exact radix search inside B (RefineInBin).
//   4. Emit: a winner's slot is the winners before it (lower CTAs, lower tiles and warps, lower
//      lanes by ballot); each warp sums the (tile, warp) counts before its own with warp
//      reductions as it walks the tiles, so no block scan. Sorted output: the winners'
//      (key, position) words are merge-sorted by the cluster's first CTA.
// The idea of binning where keys are written and ranking only the threshold bin's members follows
// vLLM's radix top-k; the bins, the marks and the ordered emit are this project's.
//
// Control flow that reaches a cluster barrier depends only on row-wide values (the same in every
// CTA), so every CTA of a cluster passes the same barriers.
#pragma once
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <cub/block/block_merge_sort.cuh>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_select_stamps.cuh"
#include "ffi_dsa/impls/sm90_warp.cuh"
#include "ffi_dsa/rank_key.h"
#include "ffi_dsa/select_bins.h"

namespace ffi_dsa::sm90::topk {

namespace cg = cooperative_groups;

constexpr int kMaxRanks = 16;  // the largest cluster the exchanges are written for (sm_90's)
constexpr uint32_t kGroupBins = 32;  // a cluster exchanges group sums first, then one group's bins
constexpr uint32_t kGroups = kSelectBins / kGroupBins;
// Members a row lists; more go to RefineInBin.
constexpr uint32_t kMemberCapacity = 512;
// The members are split by a 256-way digit of their keys first (RankByDigit); the members of the
// threshold digit are ranked by all pairs up to this many (beyond, every member is).
constexpr uint32_t kMemberDigits = 256;
constexpr uint32_t kDigitMembers = 64;
// A list of at most kThreads / kShortListDivisor members is ranked by all pairs at once
// (RankAndMarkShort: at least 8 threads a member, so at most kThreads / 64 compares a thread, behind
// one barrier), not split by digits first (four barriers, then MarkWinners' fifth).
constexpr uint32_t kShortListDivisor = 8;
// Written over a member's key when it wins: never a key (rank_key.h maps every NaN to kNaNKey).
constexpr uint32_t kWinMark = 0xFFFFFFFFu;
// Most keys of one emit chunk: its (tile, warp) counts are packed as two 16-bit halves.
constexpr uint32_t kMaxChunkKeys = 32768;
// Tiles whose quads a pass loads before using the first (independent loads in flight).
constexpr uint32_t kBatchTiles = 4;

// Where a branch-free count puts non-candidates (SelectSmallRow): a bin past the histogram, never
// read, so no count has to be taken back out of the NaN bin.
constexpr uint32_t kNoneBin = kSelectBins;

template <int kThreads>
struct Shape {
  static constexpr int kWarps = kThreads / 32;
  static constexpr uint32_t kTileKeys = kThreads * 4;  // a quad per thread
  // A chunk's (tile, warp) counts are one per thread: 128 keys a thread at most.
  static constexpr uint32_t kChunkKeys = kMaxChunkKeys < 128u * kThreads ? kMaxChunkKeys : 128u * kThreads;
  static constexpr uint32_t kChunkTiles = kChunkKeys / kTileKeys;
  static constexpr uint32_t kBinsPerThread = kSelectBins / kThreads;
  // RefineInBin's 256 digits: one a thread, or a few in a group of fewer threads.
  static constexpr uint32_t kDigitsPerThread = kThreads >= 256 ? 1 : 256 / kThreads;
  static_assert(kThreads % 128 == 0 && kSelectBins % kThreads == 0 && kGroups <= kThreads, "thread roles");
  static_assert(kChunkTiles * kWarps <= kThreads && kChunkKeys < 65536, "one count per thread, 16-bit halves");
};

// What a CTA's member pass counted, read by the other CTAs of its cluster.
struct PassTotals {
  uint32_t greater;  // keys above the threshold bin
  uint32_t equal;    // keys in it
  uint32_t listed;   // of those, appended to the member list (may pass the capacity: then not all)
  uint32_t lo, hi;   // the smallest and largest key in it
};

template <int kThreads>
struct Storage {
  // Read by the cluster's other CTAs:
  // The bins, then kNoneBin and padding to whole quads.
  alignas(16) uint32_t hist[kSelectBins + 4];
  uint32_t group_sums[kGroups];
  uint2 members[kMemberCapacity];  // (key, position in the row)
  PassTotals totals;
  PassTotals recount;  // RecountTotals' (wins, ties): never over the totals the others read
  // Local:
  uint2 united[kMemberCapacity];  // every CTA's members (RefineInBin's digit counts, read by the others)
  uint32_t member_rank[kMemberCapacity];  // a member's rank, or 0 (wins) / need (loses) after RankByDigit
  uint32_t member_digits[kMemberDigits];  // RankByDigit's histogram
  uint16_t digit_members[kDigitMembers];  // RankByDigit: the threshold digit's members (list indices)
  uint32_t table[kThreads];  // (tile, warp) counts of the current chunk (the emit sums its prefixes per warp)
  uint32_t warp_sums[Shape<kThreads>::kWarps];
  PassTotals rank_totals[kMaxRanks];
  uint32_t bin, above, need;  // ThresholdBin's results
  uint32_t bin_lo, bin_hi;    // the threshold bin's key range (SelectBinLowKey, SelectBinHighKey)
  uint32_t group, group_above;
  uint32_t digit, digit_above, digit_count;  // RefineInBin's
  uint32_t member_digit, member_digit_above, digit_member_count;  // RankByDigit's
  uint32_t word_slots;          // sorted output: winning members' words placed so far
  uint32_t lower_winners;       // winning members before this CTA's slice
  unsigned long long* stamps;   // the select's stamp slot (sm90_select_stamps.cuh; set by its caller), or null
};

// Sorted output: words[0, selected) hold RankWord(key, position) of the winners; the rest is
// padded with 0 (sorts last). Afterwards words[r] is the r-th best.
template <int kThreads>
struct SortStorage {
  static constexpr int kItems = (kMaxTopK + kThreads - 1) / kThreads;
  static constexpr int kCapacity = kItems * kThreads;
  struct Greater {
    __device__ bool operator()(unsigned long long a, unsigned long long b) const { return a > b; }
  };
  using Sort = cub::BlockMergeSort<unsigned long long, kThreads, kItems>;
  unsigned long long words[kCapacity];
  typename Sort::TempStorage temp;
};

// The keys of a CTA's slice: `staged` in shared memory (zero past `count`, to whole tiles), or
// else `global`, the workspace read through L2 (written by the previous kernel: never through L1;
// readable to the next multiple of 4 keys past `count`, which is masked).
struct SliceKeys {
  uint32_t* staged;
  uint32_t* global;
  uint32_t count;
};

// How the emit decides a key: keys above `above` win; keys equal to `tie_key` (0: none) are ties,
// of which the first `ties` of the row by position win (ties == 0: no tie is ranked, the fast
// path); with `marks`, keys equal to kWinMark (members ranked as winners) win.
struct Cut {
  uint32_t above, tie_key, ties;
  bool marks;
  __device__ __forceinline__ bool Wins(uint32_t key) const { return key > above || (marks && key == kWinMark); }
  __device__ __forceinline__ bool Ties(uint32_t key) const { return key == tie_key && key != kNotCandidate; }
};

// Where a winner goes: its id into `out` (unsorted), or its rank word into `words` (sorted).
struct RowOutput {
  int32_t* out;             // the query row's K outputs
  const int32_t* pages;     // the slice's page ids (shared memory, or the block table's row from the slice)
  const int32_t* row_table; // the row's block-table row (sorted ids)
  unsigned long long* words;  // the cluster's first CTA's sort buffer (sorted)
  uint32_t begin;           // the slice's first position in the row
  bool positions, sorted;
  // The id of the key at `pos`, a multiple of 4: the quad's 4 keys share a page, so the quad's
  // other ids follow it (one page lookup a quad, not a key).
  __device__ __forceinline__ int32_t QuadId(uint32_t pos) const {
    return positions ? static_cast<int32_t>(begin + pos) : pages[pos / kPageTokens] * kPageTokens + int32_t(pos % kPageTokens);
  }
  // Key i of the quad at `pos` (its id quad_id + i) into slot `slot`. The order is a template
  // argument, so that the emit's loop holds one kind of write, not both under predicates; an id
  // goes out by a global store (`out` is a generic pointer: a plain write would be a generic one).
  template <bool kSorted>
  __device__ __forceinline__ void Write(uint32_t slot, int32_t quad_id, uint32_t pos, int i, uint32_t key) const {
    if constexpr (kSorted) {
      words[slot] = RankWord(key, begin + pos + i);
    } else {
      StoreOutput(out + slot, quad_id + i);
    }
  }
};

template <typename T>
__device__ __forceinline__ T* AtRank(T* local, int rank) {
  return cg::this_cluster().map_shared_rank(local, rank);
}
__device__ __forceinline__ void ClusterSync() { cg::this_cluster().sync(); }
// A cluster barrier for the exchanges where each CTA writes only its own shared memory and the
// others read it through DSMEM after the barrier (bins, group sums, totals, members, digit counts).
// ClusterSync releases at GPU scope (MEMBAR.ALL.GPU: ~900 of its ~1,550 cycles on 1024-thread CTAs,
// benchmarks/probes/cluster_probe.cu); these exchanges need only this CTA's shared memory released
// at cluster scope (the restricted fence: MEMBAR.ALL.CTA), and the wait acquires. That orders
// writes before the barrier with reads after it, not reads before it with writes after it: so no
// memory another CTA reads is written again afterwards (RecountTotals and RefineInBin count into
// storage of their own). Not for a CTA that writes another's shared memory (the sorted words).
__device__ __forceinline__ void ClusterSyncOwnShared() {
  asm volatile(
      "fence.release.sync_restrict::shared::cta.cluster;\n"
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;" ::: "memory");
}
// The two halves of a cluster barrier: arrive once this CTA is done reading the others' shared
// memory, wait before it exits (so its own stays readable until every CTA has arrived). The arrive
// publishes nothing, so it is relaxed (the default release would stall every warp on a GPU-scope
// MEMBAR as the emit starts); it relies, as CUTLASS's relaxed arrive before a kernel's exit does, on
// each thread's remote loads having returned (their values used) before it issues the arrive.
__device__ __forceinline__ void ClusterArrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void ClusterWait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

template <int kThreads, int kBarrier>
__device__ __forceinline__ void GroupSync() {
  if constexpr (kBarrier == 0) {
    __syncthreads();
  } else {
    NamedBarrierSync(kBarrier, kThreads);
  }
}

// Exclusive prefix sum over the group's threads in thread order (.x) and the sum (.y): returned,
// not through a reference (which would put it in local memory: the function is not inlined, one
// copy serving every caller). Ends with a barrier.
template <int kThreads, int kBarrier>
__device__ __noinline__ uint2 ScanSum(uint32_t* warp_sums, uint32_t x, int tid) {
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t incl = WarpInclusiveSum(x);
  if (lane == 31) warp_sums[warp] = incl;
  GroupSync<kThreads, kBarrier>();
  const uint32_t warps = WarpInclusiveSum(lane < kWarps ? warp_sums[lane] : 0u);
  const uint32_t before = warp > 0 ? __shfl_sync(0xFFFFFFFFu, warps, warp - 1) : 0u;
  const uint32_t total = __shfl_sync(0xFFFFFFFFu, warps, kWarps - 1);
  GroupSync<kThreads, kBarrier>();
  return make_uint2(before + incl - x, total);
}
template <int kThreads, int kBarrier>
__device__ __forceinline__ uint32_t ExclusiveSum(uint32_t* warp_sums, uint32_t x, uint32_t& total, int tid) {
  const uint2 r = ScanSum<kThreads, kBarrier>(warp_sums, x, tid);
  total = r.y;
  return r.x;
}

template <int kThreads>
__device__ __forceinline__ uint32_t Tiles(const SliceKeys& keys) {
  return (keys.count + Shape<kThreads>::kTileKeys - 1) / Shape<kThreads>::kTileKeys;
}

// Keys [pos, pos + 4) of the slice (kNotCandidate past its end).
__device__ __forceinline__ uint4 LoadQuad(const SliceKeys& keys, uint32_t pos) {
  if (keys.staged != nullptr) return *reinterpret_cast<const uint4*>(keys.staged + pos);
  uint4 q = make_uint4(kNotCandidate, kNotCandidate, kNotCandidate, kNotCandidate);
  if (pos < keys.count) {
    q = __ldcg(reinterpret_cast<const uint4*>(keys.global + pos));
    if (pos + 4 > keys.count) {
      q.y = pos + 1 < keys.count ? q.y : kNotCandidate;
      q.z = pos + 2 < keys.count ? q.z : kNotCandidate;
      q.w = kNotCandidate;
    }
  }
  return q;
}

// f(tile, position of the quad in the slice, quad) for tiles [first, end) of the slice; thread
// tid holds the 4 keys at tid * 4 of each tile (a warp's 16-byte loads cover 512 contiguous bytes:
// no bank conflicts, whole L2 sectors). Every thread walks the same tiles (warp collectives in f
// stay whole). Staged keys are read a quad per iteration (the other warps hide a shared load);
// L2 reads go kBatchTiles at a time, so their latencies overlap, with the end checks only in the
// slice's last tile.
template <int kThreads, typename F>
__device__ __forceinline__ void ForEachQuad(const SliceKeys& keys, uint32_t first, uint32_t end, int tid, F&& f) {
  constexpr uint32_t kTileKeys = Shape<kThreads>::kTileKeys;
  const uint32_t mine = static_cast<uint32_t>(tid) * 4;
  if (keys.staged != nullptr) {
#pragma unroll 1
    for (uint32_t t = first; t < end; ++t) f(t, t * kTileKeys + mine, *reinterpret_cast<const uint4*>(keys.staged + t * kTileKeys + mine));
    return;
  }
  const uint32_t whole = keys.count / kTileKeys;  // tiles with no key past the slice
#pragma unroll 1
  for (uint32_t t = first; t < end; t += kBatchTiles) {
    const uint32_t batch = min(kBatchTiles, end - t);  // uniform
    uint4 q[kBatchTiles];
#pragma unroll
    for (uint32_t u = 0; u < kBatchTiles; ++u) {
      const uint32_t pos = (t + u) * kTileKeys + mine;
      if (u < batch) q[u] = t + u < whole ? __ldcg(reinterpret_cast<const uint4*>(keys.global + pos)) : LoadQuad(keys, pos);
    }
#pragma unroll
    for (uint32_t u = 0; u < kBatchTiles; ++u) {
      if (u < batch) f(t + u, (t + u) * kTileKeys + mine, q[u]);
    }
  }
}

// ---- 0. the histogram ---------------------------------------------------------------------------

// Everything of the select's state but the bins, zeroed before a select (totals, the members'
// ranks and digits).
template <int kThreads>
__device__ __forceinline__ void ResetAllButBins(Storage<kThreads>& s, int tid) {
#pragma unroll 1
  for (uint32_t i = tid; i < kMemberCapacity; i += kThreads) s.member_rank[i] = 0;
#pragma unroll
  for (uint32_t i = tid; i < kMemberDigits; i += kThreads) s.member_digits[i] = 0;
  if (tid == 0) {
    s.totals = PassTotals{0u, 0u, 0u, UINT_MAX, 0u};
    s.lower_winners = 0, s.digit_member_count = 0, s.word_slots = 0;
  }
}

// Before the histogram is built: zero bins, totals and the members' ranks. The caller syncs before
// the first count.
template <int kThreads>
__device__ __forceinline__ void Reset(Storage<kThreads>& s, int tid) {
#pragma unroll
  for (uint32_t i = 0; i < Shape<kThreads>::kBinsPerThread; ++i) s.hist[tid + i * kThreads] = 0;
  if (tid < 4) s.hist[kNoneBin + tid] = 0;  // never read: zeroed only to be defined
  ResetAllButBins(s, tid);
}

// A histogram of at most 65535 keys, two 16-bit counts a word: bin b in half b % 2 of word b / 2
// (the fused kernel's page loop keeps one a query beside its page ring, where 32-bit bins for N
// queries would take the shared memory of N = 3 and 4 batches' keys).
constexpr uint32_t kPairedBinWords = kSelectBins / 2;

// Counts one key (any candidate) into a select's histogram, or into a paired one.
template <int kThreads>
__device__ __forceinline__ void CountKey(Storage<kThreads>& s, uint32_t key) {
  if (key != kNotCandidate) atomicAdd(&s.hist[SelectBin(key)], 1u);
}
__device__ __forceinline__ void CountKeyPaired(uint32_t* pairs, uint32_t key) {
  if (key != kNotCandidate) {
    const uint32_t bin = SelectBin(key);
    atomicAdd(&pairs[bin / 2], 1u << (bin % 2 * 16));
  }
}

// Reset with the histogram counted elsewhere, two bins a word (`pairs`, kPairedBinWords words,
// 8-byte aligned). The caller syncs before the select.
template <int kThreads>
__device__ __forceinline__ void ResetFromPairedBins(Storage<kThreads>& s, const uint32_t* pairs, int tid) {
  static_assert(Shape<kThreads>::kBinsPerThread % 4 == 0, "whole quads of bins a thread");
#pragma unroll
  for (uint32_t i = 0; i < Shape<kThreads>::kBinsPerThread / 4; ++i) {
    const uint32_t k = tid + i * kThreads;  // bins 4k .. 4k + 3, words 2k and 2k + 1
    const uint2 w = reinterpret_cast<const uint2*>(pairs)[k];
    reinterpret_cast<uint4*>(s.hist)[k] = make_uint4(w.x & 0xFFFFu, w.x >> 16, w.y & 0xFFFFu, w.y >> 16);
  }
  ResetAllButBins(s, tid);
}

template <int kThreads>
__device__ __forceinline__ void CountQuad(Storage<kThreads>& s, const uint4& q) {
  CountKey(s, q.x);
  CountKey(s, q.y);
  CountKey(s, q.z);
  CountKey(s, q.w);
}

// ---- 1. the threshold bin -----------------------------------------------------------------------

// The threshold bin: the bin of the K-th key, the keys in the bins above it, how many of its own
// keys win, and its key range [lo, hi].
struct ThresholdBin {
  uint32_t bin, above, need, lo, hi;
};

// The one thread that finds the threshold bin publishes it with its key range: the range is ~35
// instructions of branches, once instead of on every thread.
template <int kThreads>
__device__ __forceinline__ void PublishThreshold(Storage<kThreads>& s, uint32_t bin, uint32_t above, uint32_t need) {
  s.bin = bin, s.above = above, s.need = need;
  s.bin_lo = SelectBinLowKey(bin), s.bin_hi = SelectBinHighKey(bin);
}

// One CTA: thread t holds kBinsPerThread bins counted from the top. Each warp sums its bins, and
// after one barrier every warp knows the counts above it: only the warp whose bins hold the K-th
// key looks further (its lanes, then the lane's bins) and publishes the bin for all behind a second
// barrier (every warp finding it again, to save that barrier, costs each warp more than the barrier).
// Returns it as well, for callers that keep it in registers. With at most K candidates every one
// wins: the threshold is the NaN bin, every NaN needed.
template <int kThreads, int kBarrier>
__device__ ThresholdBin ThresholdBinLocal(Storage<kThreads>& s, uint32_t topk, int tid) {
  constexpr uint32_t kPer = Shape<kThreads>::kBinsPerThread;
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t first = kSelectBins - kPer * (tid + 1);
  uint32_t c[kPer], sum = 0;
#pragma unroll
  for (uint32_t i = 0; i < kPer; i += 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(&s.hist[first + i]);
    c[i] = v.x, c[i + 1] = v.y, c[i + 2] = v.z, c[i + 3] = v.w;
    sum += v.x + v.y + v.z + v.w;
  }
  const uint32_t warp_total = WarpSum(sum);
  if (lane == 0) s.warp_sums[warp] = warp_total;
  GroupSync<kThreads, kBarrier>();
  const uint32_t w = lane < kWarps ? s.warp_sums[lane] : 0u;
  const uint32_t total = WarpSum(w);
  const uint32_t warp_above = WarpSum(lane < warp ? w : 0u);  // the warps before this one
  if (total <= topk) {
    if (tid == 0) PublishThreshold(s, kNaNBin, total - s.hist[kNaNBin], s.hist[kNaNBin]);
  } else if (warp_above < topk && warp_above + warp_total >= topk) {  // this warp's bins hold the K-th key
    uint32_t above = warp_above + WarpInclusiveSum(sum) - sum;
    if (above < topk && above + sum >= topk) {
      uint32_t bin = 0, bin_above = 0;
#pragma unroll
      for (int i = kPer - 1; i >= 0; --i) {
        if (above < topk && above + c[i] >= topk) bin = first + i, bin_above = above;
        above += c[i];
      }
      PublishThreshold(s, bin, bin_above, topk - bin_above);
    }
  }
  GroupSync<kThreads, kBarrier>();
  return ThresholdBin{s.bin, s.above, s.need, s.bin_lo, s.bin_hi};
}

// Each CTA's group sums, before the cluster barrier that publishes them.
template <int kThreads>
__device__ __forceinline__ void GroupSums(Storage<kThreads>& s, int tid) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll 1
  for (uint32_t g = warp; g < kGroups; g += Shape<kThreads>::kWarps) {
    const uint32_t c = WarpSum(s.hist[g * kGroupBins + lane]);
    if (lane == 0) s.group_sums[g] = c;
  }
}

// A cluster, after the barrier that published every CTA's bins and group sums: the group of the
// K-th key from the group sums of every rank, then its bin from that group's bins of every rank.
template <int kThreads, int kBarrier>
__device__ void ThresholdBinCluster(Storage<kThreads>& s, uint32_t topk, int ranks, int tid) {
  const uint32_t g = kGroups - 1 - tid;  // thread t: the t-th group from the top
  uint32_t count = 0;
  if (tid < static_cast<int>(kGroups)) {
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) count += r < ranks ? AtRank(s.group_sums, r)[g] : 0u;
  }
  uint32_t total;
  const uint32_t above = ExclusiveSum<kThreads, kBarrier>(s.warp_sums, count, total, tid);
  const bool take_all = total <= topk;
  if (!take_all && tid < static_cast<int>(kGroups) && above < topk && above + count >= topk) {
    s.group = g, s.group_above = above;
  }
  GroupSync<kThreads, kBarrier>();
  if (tid < 32) {
    const uint32_t bin = take_all ? kNaNBin : s.group * kGroupBins + (kGroupBins - 1 - tid);  // lane 0: the top
    uint32_t c = 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) c += r < ranks ? AtRank(s.hist, r)[bin] : 0u;
    if (take_all) {
      if (tid == 0) PublishThreshold(s, kNaNBin, total - c, c);
    } else {
      const uint32_t a = s.group_above + WarpInclusiveSum(c) - c;
      if (a < topk && a + c >= topk) PublishThreshold(s, bin, a, topk - a);
    }
  }
  GroupSync<kThreads, kBarrier>();
}

// ---- 2. the member pass -------------------------------------------------------------------------

// Over the slice: the first chunk's (tile, warp) counts, packed (keys above bin [lo, hi]) << 16 |
// (keys in it); this CTA's totals; and with `collect` the bin's keys with their row positions.
template <int kThreads>
__device__ void MemberPass(Storage<kThreads>& s, const SliceKeys& keys, uint32_t begin, uint32_t lo, uint32_t hi,
                           bool collect, int tid) {
  constexpr int kWarps = Shape<kThreads>::kWarps;
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t tiles = Tiles<kThreads>(keys);
  const bool table = tiles <= Shape<kThreads>::kChunkTiles;
  uint32_t greater = 0, equal = 0;  // this warp's, uniform
  ForEachQuad<kThreads>(keys, 0, tiles, tid, [&](uint32_t t, uint32_t pos, const uint4& q) {
    const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t key = quad[i];
      const bool in = key >= lo && key <= hi;  // lo >= kNaNKey: never a non-candidate
      packed += (uint32_t(key > hi) << 16) + uint32_t(in);
      if (collect && in) {
        const uint32_t j = atomicAdd(&s.totals.listed, 1u);
        if (j < kMemberCapacity) s.members[j] = make_uint2(key, begin + pos + i);
        atomicMin(&s.totals.lo, key);
        atomicMax(&s.totals.hi, key);
      }
    }
    packed = WarpSum(packed);
    if (table && lane == 0) s.table[t * kWarps + warp] = packed;
    greater += packed >> 16;
    equal += packed & 0xFFFFu;
  });
  if (lane == 0 && (greater | equal) != 0) {
    atomicAdd(&s.totals.greater, greater);
    atomicAdd(&s.totals.equal, equal);
  }
}

// ---- 3. resolve ---------------------------------------------------------------------------------

// Does member `a` come before member `b` in the row's order (key descending, then position
// ascending)? One 64-bit compare of their rank words: written as `||` of two compares, the
// all-pairs loops compiled each compare to a branch in a convergence region of its own.
__device__ __forceinline__ bool Precedes(const uint2& a, const uint2& b) { return RankWord(a.x, a.y) > RankWord(b.x, b.y); }

// Every CTA's `totals` (s.totals or s.recount: copied into rank_totals) and the row's; `lower`: the
// sums over the ranks before `rank`. A cluster: the first warp copies the ranks' totals once; then
// every warp combines them lane by lane (lane r: rank r) with warp reductions, not a loop over the
// ranks in every thread.
template <int kThreads, int kBarrier>
__device__ PassTotals GatherTotals(Storage<kThreads>& s, PassTotals* totals, int ranks, int rank, PassTotals& lower,
                                   int tid) {
  if (ranks == 1) {  // after the caller's barrier: this CTA's totals are the row's
    lower = PassTotals{0u, 0u, 0u, UINT_MAX, 0u};
    return *totals;
  }
  const int lane = tid % 32;
  if (tid < ranks) s.rank_totals[tid] = *AtRank(totals, tid);
  GroupSync<kThreads, kBarrier>();
  const bool mine = lane < ranks, below = lane < rank;
  const PassTotals t = mine ? s.rank_totals[lane] : PassTotals{0u, 0u, 0u, UINT_MAX, 0u};
  const PassTotals row{WarpSum(t.greater), WarpSum(t.equal), WarpSum(t.listed), __reduce_min_sync(0xFFFFFFFFu, t.lo),
                       __reduce_max_sync(0xFFFFFFFFu, t.hi)};
  lower = PassTotals{WarpSum(below ? t.greater : 0u), WarpSum(below ? t.equal : 0u), WarpSum(below ? t.listed : 0u),
                     UINT_MAX, 0u};
  return row;
}

// A cluster's members into `united`, each CTA's list after the lower ranks'; returns the row's
// list (one CTA: its own). Ends with a barrier when it copies.
template <int kThreads, int kBarrier>
__device__ const uint2* UniteMembers(Storage<kThreads>& s, int ranks, uint32_t count, int tid) {
  if (ranks == 1) return s.members;
#pragma unroll 1
  for (uint32_t j = tid; j < count; j += kThreads) {
    int from = 0;  // the rank whose entries hold j
    uint32_t first = 0, start = 0;
#pragma unroll 1
    for (int r = 0; r < ranks; ++r) {
      if (j >= start) from = r, first = start;
      start += s.rank_totals[r].listed;
    }
    s.united[j] = AtRank(s.members, from)[j - first];
  }
  GroupSync<kThreads, kBarrier>();
  return s.united;
}

// An all-pairs rank of `count` members (count >= 1) split over a group's threads: S = 2^log threads
// a member (S a power of two, so no division), thread t ranking member t / S (and every
// kThreads / S-th after it) against [begin, end), its 1/S share of the list. log is that of the
// largest S with S * count <= kThreads, at most max_log; 0 when the list is longer than the group,
// whose threads then take several members each.
struct MemberShares {
  int log;
  uint32_t first, begin, end;  // the thread's first member, its share of the list
};
template <int kThreads>
__device__ __forceinline__ MemberShares SplitMembers(uint32_t count, int max_log, int tid) {
  const int log = min(max_log, max(0, (31 - __clz(kThreads)) - (32 - __clz(count - 1))));
  const uint32_t share = static_cast<uint32_t>(tid) & ((1u << log) - 1u);
  const uint32_t per = (count + (1u << log) - 1u) >> log;
  return MemberShares{log, static_cast<uint32_t>(tid) >> log, share * per, min(count, (share + 1) * per)};
}
// The members of list[begin, end) that come before `me`.
__device__ __forceinline__ uint32_t CountBefore(const uint2* list, uint32_t begin, uint32_t end, const uint2& me) {
  uint32_t before = 0;
#pragma unroll 4
  for (uint32_t j = begin; j < end; ++j) before += Precedes(list[j], me);
  return before;
}

// Each member's place in the row's order (key descending, then position ascending) among the
// members (SplitMembers' shares, summed by atomics into member_rank).
template <int kThreads, int kBarrier>
__device__ void RankMembers(Storage<kThreads>& s, const uint2* list, uint32_t count, int tid) {
  const MemberShares m = SplitMembers<kThreads>(count, 31, tid);
#pragma unroll 1
  for (uint32_t i = m.first; i < count; i += kThreads >> m.log) {
    atomicAdd(&s.member_rank[i], CountBefore(list, m.begin, m.end, list[i]));
  }
  GroupSync<kThreads, kBarrier>();
}

// Which members win, without ranking them all: a histogram of a 256-way digit of their keys (the
// top 8 of the bits where the bin's observed lo and hi differ) gives the digit D of the need-th;
// members of a higher digit win, of a lower one lose, and only D's members (a few, on spread keys)
// are ranked by all pairs among themselves. member_rank[j] becomes 0 for a winner and `need` for a
// loser. Returns false, having changed no rank, when D holds more than kDigitMembers members (keys
// bunched inside the bin): then every member is ranked (RankMembers). Ends with a barrier. The
// members are the same list in every CTA of a cluster, so every CTA finds the same winners.
template <int kThreads, int kBarrier>
__device__ bool RankByDigit(Storage<kThreads>& s, const uint2* list, uint32_t count, uint32_t lo, uint32_t hi,
                            uint32_t need, int tid) {
  const int shift = max(0, (32 - __clz(hi - lo)) - 8);  // lo < hi: (hi - lo) >> shift < 256
  auto digit = [&](uint32_t key) { return (key - lo) >> shift; };
#pragma unroll 1
  for (uint32_t j = tid; j < count; j += kThreads) atomicAdd(&s.member_digits[digit(list[j].x)], 1u);
  GroupSync<kThreads, kBarrier>();
  if (tid < 32) {  // the first warp: 8 digits a lane, from the top
    constexpr uint32_t kPerLane = kMemberDigits / 32;
    uint32_t c[kPerLane], sum = 0;
#pragma unroll
    for (uint32_t i = 0; i < kPerLane; ++i) c[i] = s.member_digits[kMemberDigits - 1 - (tid * kPerLane + i)], sum += c[i];
    uint32_t above = WarpInclusiveSum(sum) - sum;
#pragma unroll
    for (uint32_t i = 0; i < kPerLane; ++i) {
      if (above < need && above + c[i] >= need) {
        s.member_digit = kMemberDigits - 1 - (tid * kPerLane + i), s.member_digit_above = above;
      }
      above += c[i];
    }
  }
  GroupSync<kThreads, kBarrier>();
  const uint32_t d = s.member_digit, need_in_d = need - s.member_digit_above;
#pragma unroll 1
  for (uint32_t j = tid; j < count; j += kThreads) {
    if (digit(list[j].x) == d) {
      const uint32_t k = atomicAdd(&s.digit_member_count, 1u);
      if (k < kDigitMembers) s.digit_members[k] = static_cast<uint16_t>(j);
    }
  }
  GroupSync<kThreads, kBarrier>();
  const uint32_t in_d = s.digit_member_count;
  if (in_d > kDigitMembers) return false;  // uniform
#pragma unroll 1
  for (uint32_t j = tid; j < count; j += kThreads) {
    const uint32_t g = digit(list[j].x);
    if (g != d) s.member_rank[j] = g > d ? 0u : need;
  }
#pragma unroll 1
  for (uint32_t i = tid; i < in_d; i += kThreads) {
    const uint2 me = list[s.digit_members[i]];
    uint32_t before = 0;
#pragma unroll 1
    for (uint32_t k = 0; k < in_d; ++k) {
      const uint2 o = list[s.digit_members[k]];
      before += Precedes(o, me);
    }
    s.member_rank[s.digit_members[i]] = before < need_in_d ? 0u : need;
  }
  GroupSync<kThreads, kBarrier>();
  return true;
}

// A winning member of this CTA's slice [begin, begin + keys.count) becomes kWinMark in place, and
// counts in its (tile, warp) entry when the table holds the slice; a winner before the slice counts
// in lower_winners (zeroed by ResetAllButBins). Sorted output instead: the cluster's first CTA
// writes the member's word after the `greater` winners of the row (in any order: the words are
// sorted next).
template <int kThreads>
__device__ __forceinline__ void MarkWinner(Storage<kThreads>& s, const uint2& m, const SliceKeys& keys, uint32_t begin,
                                           bool table, const RowOutput& o, uint32_t row_greater, int rank) {
  constexpr uint32_t kTileKeys = Shape<kThreads>::kTileKeys;
  if (o.sorted) {
    if (rank == 0) o.words[row_greater + atomicAdd(&s.word_slots, 1u)] = RankWord(m.x, m.y);
    return;
  }
  if (m.y < begin) {
    atomicAdd(&s.lower_winners, 1u);
  } else if (m.y - begin < keys.count) {
    const uint32_t p = m.y - begin;
    if (keys.staged != nullptr) {
      keys.staged[p] = kWinMark;
    } else {
      __stcg(keys.global + p, kWinMark);
    }
    if (table) atomicAdd(&s.table[(p / kTileKeys) * Shape<kThreads>::kWarps + (p % kTileKeys) / 128], 1u << 16);
  }
}

// The winners (rank < need) among the RankByDigit / RankMembers ranks, marked (MarkWinner). Ends
// with a barrier.
template <int kThreads, int kBarrier>
__device__ void MarkWinners(Storage<kThreads>& s, const uint2* list, const SliceKeys& keys, uint32_t begin,
                            uint32_t count, uint32_t need, bool table, const RowOutput& o, uint32_t row_greater, int rank,
                            int tid) {
#pragma unroll 1
  for (uint32_t j = tid; j < count; j += kThreads) {
    if (s.member_rank[j] < need) MarkWinner(s, list[j], keys, begin, table, o, row_greater, rank);
  }
  GroupSync<kThreads, kBarrier>();
}

// The all-pairs rank of a short list (at most kThreads / kShortListDivisor members, count >= 1):
// SplitMembers' S threads a member, S at most 32 so that they are consecutive lanes of one warp
// (at least 8 for a short list), each comparing the member with its share of the list (read by
// broadcast from shared memory); the shares are summed by shuffles within the S lanes. Returns
// true on the first of a winning member's lanes, with the member in `me`: that lane marks it. No
// atomics on the ranks, no barrier. Every CTA of a cluster ranks the same list alike.
template <int kThreads>
__device__ __forceinline__ bool ShortListWinner(const uint2* list, uint32_t count, uint32_t need, uint2& me, int tid) {
  const MemberShares m = SplitMembers<kThreads>(count, 5, tid);  // a short list: every member has its S lanes
  me = make_uint2(0u, 0u);
  // Most warps hold no member (the warp's first lane's member is past the list): they skip it all.
  if (((static_cast<uint32_t>(tid) & ~31u) >> m.log) >= count) return false;  // uniform
  const bool mine = m.first < count;
  if (mine) me = list[m.first];
  uint32_t before = mine ? CountBefore(list, m.begin, m.end, me) : 0u;
  if (m.log == 5) {  // a whole warp a member (lists of at most kThreads / 32): one reduction
    before = WarpSum(before);
  } else {
#pragma unroll 1
    for (int step = 1; step < (1 << m.log); step <<= 1) before += __shfl_xor_sync(0xFFFFFFFFu, before, step);
  }
  return mine && m.begin == 0 && before < need;
}

// A short list ranked (ShortListWinner) and its winners marked at once (MarkWinner). Ends with a
// barrier.
template <int kThreads, int kBarrier>
__device__ void RankAndMarkShort(Storage<kThreads>& s, const uint2* list, const SliceKeys& keys, uint32_t begin,
                                 uint32_t count, uint32_t need, bool table, const RowOutput& o, uint32_t row_greater,
                                 int rank, int tid) {
  uint2 me;
  if (ShortListWinner<kThreads>(list, count, need, me, tid)) MarkWinner(s, me, keys, begin, table, o, row_greater, rank);
  GroupSync<kThreads, kBarrier>();
}

// The exact key T of the need-th best key among the row's keys in [lo, hi] (the threshold bin's
// observed range), and how many copies of T win: MSB-first 8-bit digits over the bits where lo
// and hi differ, digit counts summed over the cluster. For bins too crowded to rank (so no member
// list is united): each pass counts into a buffer of its own in `united`, at most four (32 bits of
// 8-bit digits), so no memory another CTA has read is written again.
static_assert(sizeof(uint2) * kMemberCapacity >= 4 * 256 * sizeof(uint32_t), "RefineInBin's four digit buffers");
template <int kThreads, int kBarrier>
__device__ Cut RefineInBin(Storage<kThreads>& s, const SliceKeys& keys, uint32_t lo, uint32_t hi, uint32_t need,
                           int ranks, int tid) {
  const int top = 31 - __clz(lo ^ hi);  // lo < hi
  int shift = max(0, top - 7);
  uint32_t prefix = shift + 8 >= 32 ? 0u : lo & ~((1u << (shift + 8)) - 1u);
  constexpr uint32_t kPer = Shape<kThreads>::kDigitsPerThread;
  const uint32_t tiles = Tiles<kThreads>(keys);
  const bool owner = static_cast<uint32_t>(tid) * kPer < 256;  // this thread holds digits
#pragma unroll 1
  for (int pass = 0;; ++pass) {
    uint32_t* digits = reinterpret_cast<uint32_t*>(s.united) + 256 * pass;
#pragma unroll
    for (uint32_t i = 0; i < kPer; ++i) {
      if (owner) digits[tid * kPer + i] = 0;
    }
    GroupSync<kThreads, kBarrier>();
    const uint32_t mask = shift + 8 >= 32 ? 0u : ~((1u << (shift + 8)) - 1u);
    ForEachQuad<kThreads>(keys, 0, tiles, tid, [&](uint32_t, uint32_t, const uint4& q) {
      const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (quad[i] >= lo && quad[i] <= hi && (quad[i] & mask) == prefix) atomicAdd(&digits[(quad[i] >> shift) & 255u], 1u);
      }
    });
    if (ranks > 1) ClusterSyncOwnShared(); else GroupSync<kThreads, kBarrier>();
    // Thread t: the digits t * kPer .. t * kPer + kPer - 1 counted from the top.
    uint32_t c[kPer], sum = 0;
#pragma unroll
    for (uint32_t i = 0; i < kPer; ++i) {
      const uint32_t d = 255 - (tid * kPer + i);
      c[i] = 0;
      if (owner) {
#pragma unroll 1
        for (int r = 0; r < ranks; ++r) c[i] += ranks > 1 ? AtRank(digits, r)[d] : digits[d];
      }
      sum += c[i];
    }
    uint32_t total;
    uint32_t above = ExclusiveSum<kThreads, kBarrier>(s.warp_sums, sum, total, tid);
#pragma unroll
    for (uint32_t i = 0; i < kPer; ++i) {
      if (owner && above < need && above + c[i] >= need) {
        s.digit = 255 - (tid * kPer + i), s.digit_above = above, s.digit_count = c[i];
      }
      above += c[i];
    }
    GroupSync<kThreads, kBarrier>();
    prefix |= s.digit << shift;
    need -= s.digit_above;
    const uint32_t copies = s.digit_count;
    GroupSync<kThreads, kBarrier>();
    if (shift == 0) return need == copies ? Cut{prefix - 1u, 0u, 0u, false} : Cut{prefix, prefix, need, false};
    shift = max(0, shift - 8);
  }
}

// ---- 4. emit -------------------------------------------------------------------------------------

// Every winner of the slice to its slot: `lower_greater` / `lower_equal` winners above the cut /
// ties of the row before this slice (the fast path adds them into one count). With `table_ready`
// the table already holds the slice's (tile, warp) counts (one chunk); else each chunk is counted
// first. Reads the table until it returns: a caller that reuses the storage passes a barrier first.
template <int kThreads, int kBarrier, bool kSorted>
__device__ void Emit(Storage<kThreads>& s, const SliceKeys& keys, const Cut& cut, bool table_ready,
                     uint32_t lower_greater, uint32_t lower_equal, uint32_t topk, const RowOutput& row_output, int tid) {
  // The output row's pointer held as one value: otherwise each id's address is rebuilt from the
  // row's base and index (four instructions a store instead of one).
  RowOutput o = row_output;
  o.out = OpaquePointer(o.out);
  constexpr int kWarps = Shape<kThreads>::kWarps;
  constexpr uint32_t kChunkTiles = Shape<kThreads>::kChunkTiles;
  const int warp = tid / 32, lane = tid % 32;
  const bool fast = cut.ties == 0;
  const uint32_t below = LaneMaskLt();
  const uint32_t tiles = Tiles<kThreads>(keys);
  uint32_t carry_g = lower_greater, carry_e = lower_equal;
  auto counts = [&](const uint4& q) {
    auto one = [&](uint32_t key) { return (uint32_t(cut.Wins(key)) << 16) + uint32_t(cut.Ties(key)); };
    return one(q.x) + one(q.y) + one(q.z) + one(q.w);
  };
#pragma unroll 1
  for (uint32_t c0 = 0; c0 < tiles; c0 += kChunkTiles) {
    const uint32_t ct = min(kChunkTiles, tiles - c0);
    if (!table_ready) {
      ForEachQuad<kThreads>(keys, c0, c0 + ct, tid, [&](uint32_t t, uint32_t, const uint4& q) {
        const uint32_t x = WarpSum(counts(q));
        if (lane == 0) s.table[(t - c0) * kWarps + warp] = x;
      });
      GroupSync<kThreads, kBarrier>();
    }
    // Each warp's prefix from the table itself: tile t's entries (one a warp) go to the lanes, and
    // the warp's own is the chunk's tiles before t plus tile t's warps before it, two warp
    // reductions. No warp publishes a scan for the others, so no barrier is passed here.
    uint32_t chunk_before = 0;  // the chunk's counts in the tiles walked so far (uniform)
    ForEachQuad<kThreads>(keys, c0, c0 + ct, tid, [&](uint32_t t, uint32_t pos, const uint4& q) {
      const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
      const uint32_t counted = lane < kWarps ? s.table[(t - c0) * kWarps + lane] : 0u;
      const uint32_t v = fast ? counted >> 16 : counted;
      const uint32_t entry = chunk_before + WarpSum(lane < warp ? v : 0u);
      chunk_before += WarpSum(v);
      if (fast) {
        bool wins[4];
        uint32_t slot = carry_g + entry;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wins[i] = cut.Wins(quad[i]);
          slot += __popc(__ballot_sync(0xFFFFFFFFu, wins[i]) & below);
        }
        if (wins[0] || wins[1] || wins[2] || wins[3]) {
          const int32_t id = kSorted ? 0 : o.QuadId(pos);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (wins[i] && slot < topk) o.Write<kSorted>(slot, id, pos, i, quad[i]);
            slot += wins[i];
          }
        }
      } else {
        const uint32_t x = counts(q);
        const uint32_t before = entry + WarpInclusiveSum(x) - x;
        uint32_t greater = carry_g + (before >> 16), equal = carry_e + (before & 0xFFFFu);
        const int32_t id = x != 0 && !kSorted ? o.QuadId(pos) : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool wins = cut.Wins(quad[i]), ties = cut.Ties(quad[i]);
          const uint32_t slot = wins ? greater + min(equal, cut.ties) : greater + equal;
          if ((wins || (ties && equal < cut.ties)) && slot < topk) o.Write<kSorted>(slot, id, pos, i, quad[i]);
          greater += wins;
          equal += ties;
        }
      }
    });
    if (fast) {
      carry_g += chunk_before;
    } else {
      carry_g += chunk_before >> 16;
      carry_e += chunk_before & 0xFFFFu;
    }
    if (c0 + ct < tiles) GroupSync<kThreads, kBarrier>();  // the next chunk's counts rewrite the table
  }
}

template <int kThreads, int kBarrier>
__device__ void SortDescending(SortStorage<kThreads>& s, uint32_t selected, int tid) {
  using Sort = SortStorage<kThreads>;
  for (int i = selected + tid; i < Sort::kCapacity; i += kThreads) s.words[i] = 0ull;
  GroupSync<kThreads, kBarrier>();
  unsigned long long items[Sort::kItems];
#pragma unroll
  for (int i = 0; i < Sort::kItems; ++i) items[i] = s.words[tid * Sort::kItems + i];
  GroupSync<kThreads, kBarrier>();
  typename Sort::Sort(s.temp).Sort(items, typename Sort::Greater());  // distinct words: stability moot
#pragma unroll
  for (int i = 0; i < Sort::kItems; ++i) s.words[tid * Sort::kItems + i] = items[i];
  GroupSync<kThreads, kBarrier>();
}

// ---- the row ------------------------------------------------------------------------------------

// This CTA's (wins, ties) under `cut` as its totals, exchanged over the cluster: the lower ranks'
// sums (RefineInBin's cut, which the member pass did not count).
template <int kThreads, int kBarrier>
__device__ PassTotals RecountTotals(Storage<kThreads>& s, const SliceKeys& keys, const Cut& cut, int ranks, int rank,
                                    int tid) {
  if (tid == 0) s.recount = PassTotals{0u, 0u, 0u, UINT_MAX, 0u};
  GroupSync<kThreads, kBarrier>();
  uint32_t g = 0, e = 0;
  ForEachQuad<kThreads>(keys, 0, Tiles<kThreads>(keys), tid, [&](uint32_t, uint32_t, const uint4& q) {
    const uint32_t quad[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) g += cut.Wins(quad[i]), e += cut.Ties(quad[i]);
  });
  g = WarpSum(g), e = WarpSum(e);
  if (tid % 32 == 0) atomicAdd(&s.recount.greater, g), atomicAdd(&s.recount.equal, e);
  if (ranks > 1) ClusterSyncOwnShared(); else GroupSync<kThreads, kBarrier>();
  PassTotals lower;
  GatherTotals<kThreads, kBarrier>(s, &s.recount, ranks, rank, lower, tid);
  return lower;
}

// When every copy of a single-valued threshold bin wins, the member pass's (above, in) counts of
// the table become one winner count.
template <int kThreads, int kBarrier>
__device__ void FoldTable(Storage<kThreads>& s, uint32_t entries, int tid) {
  if (static_cast<uint32_t>(tid) < entries) {
    const uint32_t v = s.table[tid];
    s.table[tid] = ((v >> 16) + (v & 0xFFFFu)) << 16;
  }
  GroupSync<kThreads, kBarrier>();
}

// The exact top-K of a query row from this CTA's slice of it (`ranks` CTAs, this one `rank`), once
// the slice's histogram is built (Reset, CountKey, then a barrier, or ResetFromPairedBins from bins
// counted elsewhere, then a barrier; a cluster's bins not yet published). `sort`: the cluster's
// first CTA's sort storage (sorted output; o.words points there).
// Sorted output needs kBarrier 0 (the whole CTA runs the select); a group of a CTA (kBarrier > 0)
// emits unsorted only. `stamped` (the call's stamp_select, from a kernel parameter: off, no stamp
// site touches shared memory): its first thread stamps the phases' ends and the last write into
// s.stamps (sm90_select_stamps.cuh; the caller sets it and stamps the start).
template <int kThreads, int kBarrier>
__device__ void SelectRow(Storage<kThreads>& s, SortStorage<kThreads>* sort, const SliceKeys& keys, const RowOutput& o,
                          uint32_t topk, int ranks, int rank, bool stamped, int tid) {
  if (ranks > 1) {
    GroupSums(s, tid);
    ClusterSyncOwnShared();  // every CTA's bins and group sums
    ThresholdBinCluster<kThreads, kBarrier>(s, topk, ranks, tid);
  } else {
    ThresholdBinLocal<kThreads, kBarrier>(s, topk, tid);
  }
  if (stamped && tid == 0) StampAt(s.stamps, kStampThresholdCycles);
  const uint32_t bin = s.bin, need = s.need;  // either way published in shared memory
  const uint32_t selected = min(topk, s.above + need);
  // Computed here, not read from s.bin_lo / s.bin_hi: reading them made ptxas nearly double the
  // fused kernels of N >= 2 queries (benchmarks/NOTES.md, "Cluster barriers released at cluster scope").
  const uint32_t lo = SelectBinLowKey(bin), hi = SelectBinHighKey(bin);
  const bool single = SingleValueBin(bin);
  MemberPass<kThreads>(s, keys, o.begin, lo, hi, !single, tid);
  if (ranks > 1) ClusterSyncOwnShared(); else GroupSync<kThreads, kBarrier>();  // every CTA's totals and members
  PassTotals lower;
  const PassTotals row = GatherTotals<kThreads, kBarrier>(s, &s.totals, ranks, rank, lower, tid);
  if (stamped && tid == 0) {
    StampAt(s.stamps, kStampMembersCycles);
    StampCount(s.stamps, kStampBinKeys, row.equal);
  }
  const uint32_t entries = Tiles<kThreads>(keys) * Shape<kThreads>::kWarps;
  const bool table = Tiles<kThreads>(keys) <= Shape<kThreads>::kChunkTiles;
  bool table_ready = table;
  Cut cut;
  uint32_t lower_greater = lower.greater, lower_equal = lower.equal;
  if (single || row.lo == row.hi) {  // one value: its first `need` copies by position win
    const uint32_t value = single ? lo : row.lo;
    if (need == row.equal) {
      cut = Cut{value - 1u, 0u, 0u, false};
      lower_greater += lower_equal;
      if (table) FoldTable<kThreads, kBarrier>(s, entries, tid);
    } else {
      cut = Cut{value, value, need, false};
    }
  } else if (row.listed <= kMemberCapacity) {  // rank the members, mark the winners
    const uint2* list = UniteMembers<kThreads, kBarrier>(s, ranks, row.listed, tid);
    if (row.listed <= kThreads / kShortListDivisor) {
      RankAndMarkShort<kThreads, kBarrier>(s, list, keys, o.begin, row.listed, need, table, o, row.greater, rank, tid);
    } else {
      if (!RankByDigit<kThreads, kBarrier>(s, list, row.listed, row.lo, row.hi, need, tid)) {
        RankMembers<kThreads, kBarrier>(s, list, row.listed, tid);
      }
      MarkWinners<kThreads, kBarrier>(s, list, keys, o.begin, row.listed, need, table, o, row.greater, rank, tid);
    }
    cut = Cut{hi, 0u, 0u, !o.sorted};
    if (!o.sorted) lower_greater += s.lower_winners;
  } else {  // too many members: the exact threshold inside the bin
    cut = RefineInBin<kThreads, kBarrier>(s, keys, row.lo, row.hi, need, ranks, tid);
    const PassTotals recount = RecountTotals<kThreads, kBarrier>(s, keys, cut, ranks, rank, tid);
    lower_greater = recount.greater, lower_equal = recount.equal;
    if (cut.ties == 0) lower_greater += lower_equal;
    table_ready = false;
  }
  if (stamped && tid == 0) StampAt(s.stamps, kStampResolvedCycles);
  if (ranks > 1 && !o.sorted) ClusterArrive();  // done reading the other CTAs' shared memory
  if (!o.sorted) {
    Emit<kThreads, kBarrier, false>(s, keys, cut, table_ready, lower_greater, lower_equal, topk, o, tid);
#pragma unroll 1
    for (uint32_t i = selected + rank * kThreads + tid; i < topk; i += ranks * kThreads) o.out[i] = -1;
    if (stamped) {
      GroupSync<kThreads, kBarrier>();  // every id of the slice is written
      if (tid == 0) StampDone(s.stamps);
    }
    if (ranks > 1) ClusterWait();
    return;
  }
  if constexpr (kBarrier == 0) {  // cub's block sort synchronizes the whole CTA: sorted output runs on all of it
    Emit<kThreads, kBarrier, true>(s, keys, cut, table_ready, lower_greater, lower_equal, topk, o, tid);
    if (ranks > 1) ClusterSync(); else GroupSync<kThreads, kBarrier>();  // every winner's word is in place
    if (rank != 0) {
      if (stamped && tid == 0) StampDone(s.stamps);
      return;
    }
    SortDescending<kThreads, kBarrier>(*sort, selected, tid);
#pragma unroll 1
    for (uint32_t i = tid; i < topk; i += kThreads) {
      int32_t id = -1;
      if (i < selected) {
        const uint32_t t = RankWordPosition(sort->words[i]);
        id = o.positions ? static_cast<int32_t>(t) : GlobalTokenId(o.row_table, t);
      }
      o.out[i] = id;
    }
    if (stamped) {
      GroupSync<kThreads, kBarrier>();  // every id of the row is written
      if (tid == 0) StampDone(s.stamps);
    }
  } else {
    __trap();  // a group of a CTA emits unsorted only (the caller runs sorted output on every thread)
  }
}

}  // namespace ffi_dsa::sm90::topk
