// The select of PrefillRowsKernel (sm90_prefill_rows.cuh), run while it scores: each query row keeps
// its candidates in shared memory, as rank words (rank_key.h: key, then the smaller position), and a
// rising threshold key. A row's buffer is split into one region per warp of the team: each warp
// appends the words of its (query, token) pairs whose key beats the row's threshold to its own
// region, so that taking a word needs no atomic and no barrier. The team's warpgroups score their
// pages independently and meet once per epoch (a few pages each), with one barrier that also asks
// whether some warp's region could not take another epoch. Only then is the row cut: its words,
// wherever they lie, are cut to the K best, or a few more (the K-th word's whole radix bucket, which
// costs fewer passes than the exact K-th word), dealt out evenly over the regions again, and the
// threshold rises to the cut's key. Cuts happen only between epochs, and every page of a later epoch
// lies past every page of an earlier one: a later key that only equals the threshold is rightly
// kept out, its position being larger than every kept word's with that key, and at least K words
// rank above it. The exact top K is thus always inside the buffer, whatever the data (plateaus,
// ties, NaN, scores rising along the row), and no score leaves the SM. The output order (by
// position, or by rank word) is made once, when the row is written.
//
// Everything here is run by the team that scores two query rows (two math warpgroups, 256 threads,
// sm90_prefill_rows.cuh), synchronised by the team's named barrier; thresholds are the same in
// every thread of it, and a region's count in every lane of its warp.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_warp.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

// Words a row's buffer holds: K plus a few epochs' words, as many as the CTA's shared memory leaves
// beside the stage ring and the Q tiles: every word more spaces the cuts out. With 64 heads
// PrefillSmem is then exactly the 227 KB a CTA may have, so a new shared field must take its bytes
// from here. Rows of random scores cut their buffer a few times per 64K keys (about
// K * ln(length / K) words beat a rising threshold).
constexpr int kCandidateCapacity = 5072;
// Query rows a team scores (both in one wgmma sequence per page): two, since a warp's region
// counts of both are packed 16 bits each into one word.
constexpr int kTeamRows = 2;
// The threads of a team: two warpgroups, each scoring every other page of the block.
constexpr int kTeamWarpgroups = 2;
constexpr int kTeamThreads = kTeamWarpgroups * kWarpgroupThreads;
constexpr int kTeamWarps = kTeamThreads / 32;
// Pages each warpgroup of a team scores between two meetings of the team: the warpgroups drift apart
// freely inside an epoch, so that one's products run while the other scores.
constexpr int kEpochPages = 8;
constexpr int kTeamEpochPages = kTeamWarpgroups * kEpochPages;
// A warp's region of a row's buffer, and the words the warp can add to it in an epoch (a page's
// tokens are spread over the warpgroup's four warps, 16 rows of the m64 accumulators each). A row is
// cut at an epoch's end when some warp's region holds more than kCutAbove words: the next epoch
// could overflow it.
constexpr int kRegionWords = kCandidateCapacity / kTeamWarps;
static_assert(kRegionWords * kTeamWarps == kCandidateCapacity, "the regions tile the buffer");
constexpr int kWarpEpochWords = kEpochPages * (kPageTokens / 4);
constexpr int kCutAbove = kRegionWords - kWarpEpochWords;
static_assert(kRegionWords < (1 << 16), "a region's count fits 16 bits");
// Whether a warp's region of row q (its count in `counts`, 16 bits a row) could not take another
// epoch.
__device__ __forceinline__ bool RegionFull(uint32_t counts, int q) {
  return ((counts >> (16 * q)) & 0xFFFFu) > static_cast<uint32_t>(kCutAbove);
}
// A cut at an epoch's end may keep up to this many words more than K (the whole bucket of the
// K-th word): an exact K-th word would cost more radix passes, and a superset of the K best is
// as good a buffer. The row's output cut is exact.
constexpr int kCutSlack = 256;
static_assert((kMaxTopK + kCutSlack + kTeamWarps - 1) / kTeamWarps <= kCutAbove,
              "a cut buffer, dealt out over the regions, must take an epoch");
// Words each lane holds when its region is compacted: the whole region is read into registers
// before any word moves.
constexpr int kCompactPerLane = (kRegionWords + 31) / 32;
constexpr int kRadixBuckets = 256;
static_assert(kRadixBuckets == kTeamThreads, "BestCut clears its histogram with one store per thread");
// Positions a row's output pass orders at a time: the bitmap lies in its buffer behind the K kept
// words (whose first half then holds the ids on their way out).
constexpr int kBitmapWords = (kCandidateCapacity - kMaxTopK) * 2;
constexpr int64_t kBitmapPositions = int64_t(kBitmapWords) * 32;

// One team's scratch.
struct CandidateScratch {
  uint32_t histogram[kRadixBuckets];
  uint32_t warp_sums[kTeamWarps];  // each warp's region counts (both rows) at a cut; TeamExclusiveSum's sums
  uint32_t moved;                  // words a compaction kept (zero between compactions)
  uint32_t max_key[kTeamRows];     // the largest key each row has taken in (at the last GatherTotals)
  uint32_t pick[3];                // digit, words still needed, words in its bucket
};

// The lanes whose (query, token) pair is of the team's first row: the accumulator layout puts
// query (lane >> 1) & 1 in each lane (sm90_prefill_rows.cuh).
constexpr uint32_t kFirstRowLanes = 0x33333333u;

// One row's buffer (a region per warp; each warp keeps its regions' counts itself, in `counts`)
// and its threshold (the same in every thread of the team).
struct RowRegion {
  uint64_t* words;      // the row's whole buffer
  uint32_t threshold;   // kNotCandidate at first: every key of a valid token beats it
};

// A rank word `cut` such that `keep` to `keep + slack` of the row's `count` words (each warp's
// `region_count` words at the start of its region) lie at or above it: a radix select over the bits in
// which the words can differ (all keys lie in [lo_key, hi_key], so the bits above the highest one
// where those two differ are the same in every word), eight bits a pass from the top, that stops
// as soon as the bucket holding the keep-th word can be taken whole with at most `slack` words
// more. Words are distinct (they hold positions), so it ends. 0 when keep >= count. Ends with a
// barrier either way (the compaction that follows relies on it).
__device__ __forceinline__ uint64_t BestCut(const uint64_t* region, int region_count, int count, int keep, int slack,
                                            uint32_t lo_key, uint32_t hi_key, CandidateScratch& s, int t,
                                            int barrier) {
  if (keep >= count) {  // uniform
    NamedBarrierSync(barrier, kTeamThreads);
    return 0;
  }
  const int lane = t % 32;
  const uint32_t differ = lo_key ^ hi_key;
  // The words' low `top` bits can differ; above them every word holds `prefix`.
  int top = differ == 0u ? 32 : 64 - __clz(differ);
  uint64_t prefix = top == 64 ? 0 : (static_cast<uint64_t>(hi_key) << 32) >> top;
  while (true) {
    const int bits = top < 8 ? top : 8;
    const int shift = top - bits;
    const uint32_t digit_mask = (1u << bits) - 1u;
    s.histogram[t] = 0;
    NamedBarrierSync(barrier, kTeamThreads);
    for (int e = lane; e < region_count; e += 32) {
      const uint64_t w = region[e];
      if (top == 64 || (w >> top) == prefix) atomicAdd(&s.histogram[(w >> shift) & digit_mask], 1u);
    }
    NamedBarrierSync(barrier, kTeamThreads);
    if (t < 32) {
      // Lane l reads buckets 255 - 8l down to 248 - 8l: a prefix sum over lanes counts the words
      // in higher buckets.
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        c[b] = s.histogram[255 - 8 * t - b];
        sum += c[b];
      }
      const uint32_t inclusive = WarpInclusiveSum(sum);
      uint32_t above = inclusive - sum;
      const uint32_t need = static_cast<uint32_t>(keep);
      if (above < need && need <= inclusive) {
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          if (above < need && need <= above + c[b]) {
            s.pick[0] = 255 - 8 * t - b;
            s.pick[1] = need - above;
            s.pick[2] = c[b];
          }
          above += c[b];
        }
      }
    }
    NamedBarrierSync(barrier, kTeamThreads);
    prefix = (prefix << bits) | s.pick[0];
    top = shift;
    keep = static_cast<int>(s.pick[1]);
    // Uniform: every thread read the same pick. The last bits hold one word per bucket.
    if (s.pick[2] - s.pick[1] <= static_cast<uint32_t>(slack) || top == 0) break;
  }
  return prefix << top;
}

// Keeps the row's words >= cut (each warp's `region_count` words at the start of its region; cut 0
// keeps all) and returns how many: word g of them (in no particular order) goes to words[g] when
// `contiguous`, else to slot g / kTeamWarps of region g % kTeamWarps, so that the regions come out
// evenly filled. Every word is read into registers before any moves; each warp reserves its
// words' indices with one atomic.
__device__ __forceinline__ int CompactRow(uint64_t* words, uint64_t* region, int region_count, uint64_t cut,
                                          bool contiguous, CandidateScratch& s, int t, int barrier) {
  const int lane = t % 32;
  uint64_t w[kCompactPerLane];
  uint32_t mine = 0;
#pragma unroll
  for (int k = 0; k < kCompactPerLane; ++k) {
    const int e = k * 32 + lane;
    w[k] = e < region_count ? region[e] : 0;
    mine += e < region_count && w[k] >= cut ? 1u : 0u;
  }
  const uint32_t inclusive = WarpInclusiveSum(mine);
  uint32_t base = 0;
  if (lane == 31 && inclusive != 0u) base = atomicAdd(&s.moved, inclusive);
  int g = static_cast<int>(__shfl_sync(0xFFFFFFFFu, base, 31) + inclusive - mine);
  NamedBarrierSync(barrier, kTeamThreads);  // every word is read, every warp's indices reserved
#pragma unroll
  for (int k = 0; k < kCompactPerLane; ++k) {
    const int e = k * 32 + lane;
    if (e < region_count && w[k] >= cut) {
      words[contiguous ? g : (g % kTeamWarps) * kRegionWords + g / kTeamWarps] = w[k];
      ++g;
    }
  }
  const int kept = static_cast<int>(s.moved);
  NamedBarrierSync(barrier, kTeamThreads);  // the words are in place; every thread read `moved`
  if (t == 0) s.moved = 0u;  // the next compaction's atomics follow BestCut's barrier
  return kept;
}

// Appends this lane's word to its row's region when it `enters`; `counts` are the warp's words
// in its regions of both rows (row 0's in the low 16 bits, row 1's in the high), the same in
// every lane. `row_lanes` are the lanes of this lane's row, `row_shift` its 16-bit half of `counts`.
__device__ __forceinline__ void AppendWord(uint64_t* region, uint32_t& counts, bool enters, uint64_t word,
                                           uint32_t row_lanes, uint32_t row_shift) {
  const uint32_t entering = __ballot_sync(0xFFFFFFFFu, enters);
  if (enters) region[((counts >> row_shift) & 0xFFFFu) + __popc(entering & row_lanes & LaneMaskLt())] = word;
  counts += static_cast<uint32_t>(__popc(entering & kFirstRowLanes)) |
            (static_cast<uint32_t>(__popc(entering & ~kFirstRowLanes)) << 16);
}

// The team's view of both rows after a barrier: each row's word count and a bound on its largest
// key, from every warp's region counts (`counts`) and its lanes' largest added keys (`lane_max`,
// of the lane's own row `query`; a word a cut dropped may still count, which only widens the
// bound). Every thread of the team, at the same point.
struct RowTotals {
  int count[kTeamRows];
  uint32_t max_key[kTeamRows];
  bool cut[kTeamRows];  // some warp's region of the row could not take another epoch
};
__device__ __forceinline__ RowTotals GatherTotals(uint32_t counts, uint32_t lane_max, int query, CandidateScratch& s,
                                                  int t, int barrier) {
  const int warp = t / 32, lane = t % 32;
#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {
    const uint32_t high = __reduce_max_sync(0xFFFFFFFFu, query == q ? lane_max : 0u);
    if (lane == 0) atomicMax(&s.max_key[q], high);
  }
  if (lane == 0) s.warp_sums[warp] = counts;
  NamedBarrierSync(barrier, kTeamThreads);
  RowTotals r;
#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {
    r.count[q] = 0;
    r.cut[q] = false;
    r.max_key[q] = s.max_key[q];
  }
#pragma unroll
  for (int x = 0; x < kTeamWarps; ++x) {
    const uint32_t h = s.warp_sums[x];
#pragma unroll
    for (int q = 0; q < kTeamRows; ++q) {
      r.count[q] += static_cast<int>((h >> (16 * q)) & 0xFFFFu);
      r.cut[q] = r.cut[q] || RegionFull(h, q);
    }
  }
  // warp_sums is next written after another barrier (an epoch's end, or a cut's).
  return r;
}

// Cuts row q (count words, largest key max_key) to its `keep` best words, or up to `slack` more,
// dealt out evenly over the regions again, and raises its threshold to the cut's key (a lower
// bound of the keep-th best word's key: a superset still enters). Updates this warp's `counts`.
__device__ __forceinline__ void CutRow(RowRegion& row, int q, int count, uint32_t max_key, int keep, int slack,
                                       uint32_t& counts, CandidateScratch& s, int t, int barrier) {
  // Through a shuffle, so that the compiler knows `counts` stays warp-uniform.
  const int warp = __shfl_sync(0xFFFFFFFFu, t / 32, 0);
  uint64_t* region = row.words + warp * kRegionWords;
  const int mine = static_cast<int>((counts >> (16 * q)) & 0xFFFFu);
  const uint64_t cut = BestCut(region, mine, count, keep, slack, row.threshold, max_key, s, t, barrier);
  const int kept = CompactRow(row.words, region, mine, cut, false, s, t, barrier);
  const uint32_t ours = static_cast<uint32_t>((kept + kTeamWarps - 1 - warp) / kTeamWarps);
  counts = (counts & ~(0xFFFFu << (16 * q))) | (ours << (16 * q));
  const uint32_t cut_key = static_cast<uint32_t>(cut >> 32);
  if (cut_key > row.threshold) row.threshold = cut_key;
}

// The end of an epoch (every thread of the team, after its pages): one barrier, which also tells
// whether some warp's region of a row could not take another epoch; if so, that row is cut.
__device__ __forceinline__ void EndEpoch(RowRegion (&rows)[kTeamRows], uint32_t& counts, uint32_t lane_max, int query,
                                         int topk, CandidateScratch& s, int t, int barrier) {
  if (!NamedBarrierAny(barrier, kTeamThreads, RegionFull(counts, 0) || RegionFull(counts, 1))) return;  // uniform
  const RowTotals totals = GatherTotals(counts, lane_max, query, s, t, barrier);
#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {
    if (totals.cut[q]) CutRow(rows[q], q, totals.count[q], totals.max_key[q], topk, kCutSlack, counts, s, t, barrier);
  }
}

// Sorts words[0, n) in descending order, n a power of two (a bitonic network over the team).
__device__ __forceinline__ void SortDescending(uint64_t* words, int n, int t, int barrier) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = t; i < n / 2; i += kTeamThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const uint64_t a = words[lo], b = words[hi];
        const bool descending = (lo & size) == 0;
        if ((a < b) == descending) {
          words[lo] = b;
          words[hi] = a;
        }
      }
      NamedBarrierSync(barrier, kTeamThreads);
    }
  }
}

// The team's exclusive prefix sum of `value` over its threads (in thread order), and the total.
__device__ __forceinline__ int TeamExclusiveSum(int value, CandidateScratch& s, int t, int barrier, int& total) {
  const int warp = t / 32, lane = t % 32;
  const int inclusive = static_cast<int>(WarpInclusiveSum(static_cast<uint32_t>(value)));
  if (lane == 31) s.warp_sums[warp] = static_cast<uint32_t>(inclusive);
  NamedBarrierSync(barrier, kTeamThreads);
  int before = inclusive - value;
  total = 0;
#pragma unroll
  for (int x = 0; x < kTeamWarps; ++x) {
    const int c = static_cast<int>(s.warp_sums[x]);
    before += x < warp ? c : 0;
    total += c;
  }
  NamedBarrierSync(barrier, kTeamThreads);  // warp_sums is rewritten by the next use
  return before;
}

// Writes the ids of words[0, count) (distinct positions below `length`) to out[0, count) in
// ascending position: a window of kBitmapPositions positions at a time is marked in `bitmap`, and
// each thread takes the set bits of its own stretch of the bitmap at its prefix count. A row of
// one window gathers its ids in `ids` (over the words, read by then) and writes them out in one
// coalesced pass; a longer row's windows read the words again, so its threads write directly.
__device__ __forceinline__ void WriteInPositionOrder(const uint64_t* words, int count, int64_t length,
                                                     int64_t first_id, int32_t* out, uint32_t* bitmap, int32_t* ids,
                                                     CandidateScratch& s, int t, int barrier) {
  const bool one_window = length <= kBitmapPositions;
  int32_t* dest = one_window ? ids : out;
  int written = 0;
  for (int64_t base = 0; base < length && written < count; base += kBitmapPositions) {
    const int64_t span = length - base < kBitmapPositions ? length - base : kBitmapPositions;
    const int bitmap_words = static_cast<int>((span + 31) / 32);
    for (int x = t; x < bitmap_words; x += kTeamThreads) bitmap[x] = 0u;
    NamedBarrierSync(barrier, kTeamThreads);
    for (int e = t; e < count; e += kTeamThreads) {
      const int64_t at = int64_t(RankWordPosition(words[e])) - base;
      if (at >= 0 && at < span) atomicOr(&bitmap[at / 32], 1u << (at % 32));
    }
    NamedBarrierSync(barrier, kTeamThreads);
    const int stretch = (bitmap_words + kTeamThreads - 1) / kTeamThreads;
    const int first = t * stretch, last = first + stretch < bitmap_words ? first + stretch : bitmap_words;
    int mine = 0;
    for (int x = first; x < last; ++x) mine += __popc(bitmap[x]);
    int total;
    int rank = written + TeamExclusiveSum(mine, s, t, barrier, total);  // ends with a barrier
    for (int x = first; x < last; ++x) {
      for (uint32_t bits = bitmap[x]; bits != 0u; bits &= bits - 1u) {
        dest[rank++] = static_cast<int32_t>(first_id + base + 32 * x + __ffs(bits) - 1);
      }
    }
    written += total;
    NamedBarrierSync(barrier, kTeamThreads);  // the bitmap is cleared for the next window
  }
  if (one_window) {
    for (int e = t; e < written; e += kTeamThreads) out[e] = ids[e];
  }
}

// Writes row q's output: its `topk` best words' ids (by position, or by rank word when
// `sorted_by_score`), then -1. `first_id` is added to each word's position (the row's start for
// absolute ids, else 0); `length` bounds the positions (the row's key count); `totals` are the
// rows' counts and largest keys (GatherTotals, after the last epoch).
__device__ __forceinline__ void EmitRow(RowRegion& row, int q, const RowTotals& totals, uint32_t counts, int topk,
                                        bool sorted_by_score, int64_t length, int64_t first_id, int32_t* out,
                                        CandidateScratch& s, int t, int barrier) {
  const int warp = t / 32;
  uint64_t* region = row.words + warp * kRegionWords;
  const int mine = static_cast<int>((counts >> (16 * q)) & 0xFFFFu);
  // The best words (all of them when they are no more than K), gathered at the buffer's front.
  const uint64_t cut =
      BestCut(region, mine, totals.count[q], topk, 0, row.threshold, totals.max_key[q], s, t, barrier);
  const int kept = CompactRow(row.words, region, mine, cut, true, s, t, barrier);
  uint64_t* buffer = row.words;
  if (!sorted_by_score) {
    WriteInPositionOrder(buffer, kept, length, first_id, out, reinterpret_cast<uint32_t*>(buffer + kMaxTopK),
                         reinterpret_cast<int32_t*>(buffer), s, t, barrier);
  } else {
    int n = 1;
    while (n < kept) n <<= 1;
    for (int e = kept + t; e < n; e += kTeamThreads) buffer[e] = 0;  // below every word
    NamedBarrierSync(barrier, kTeamThreads);
    SortDescending(buffer, n, t, barrier);
    for (int e = t; e < kept; e += kTeamThreads) out[e] = static_cast<int32_t>(first_id + RankWordPosition(buffer[e]));
  }
  for (int e = kept + t; e < topk; e += kTeamThreads) out[e] = -1;
}

}  // namespace ffi_dsa::sm90
