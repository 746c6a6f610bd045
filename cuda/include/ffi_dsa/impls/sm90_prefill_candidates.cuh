// The select of PrefillRowsKernel (sm90_prefill_rows.cuh), run while it scores: each query row keeps
// its candidates in shared memory, as rank words (rank_key.h: key, then the smaller position), and a
// rising threshold key. The team's warpgroups score their pages independently and meet once per
// epoch (a few pages each). Inside an epoch every lane stages its (query, token) pair's word in a
// slot of its own past the row's words, 0 unless its key beats the row's threshold: no vote, no
// atomic, no barrier per page. At the epoch's end the team compacts the staged words onto the rows'
// words, and cuts a buffer that could not take another epoch to its K best words, the threshold
// rising to the K-th best key. Cuts happen only between epochs, and every page of a later epoch lies
// past every page of an earlier one: a later key that only equals the threshold is rightly kept
// out, its position being larger than every kept word's (it loses their ties). The exact top K is
// thus always inside the buffer, whatever the data (plateaus, ties, NaN, scores rising along the
// row), and no score leaves the SM. The output order (by position, or by rank word) is made once,
// when the row is written.
//
// Everything here is run by the team that scores two query rows (two math warpgroups, 256 threads,
// sm90_prefill_rows.cuh), synchronised by the team's named barrier; the counts and thresholds are
// the same in every thread of it.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

// Words a row's buffer holds: at least K plus an epoch's words, and as many as the CTA's shared
// memory leaves beside the stage ring and the Q tiles: every word more spaces the cuts out. With 64
// heads PrefillSmem is then exactly the 227 KB a CTA may have, so a new shared field must take its
// bytes from here. Rows of random scores cut their buffer a few times per 64K keys (about
// K * ln(length / K) words beat a rising threshold).
constexpr int kCandidateCapacity = 4544;
// Query rows a team scores (both in one wgmma sequence per page): two, since their counts are
// packed 16 bits each into one word where the team sums them.
constexpr int kTeamRows = 2;
// The threads of a team: two warpgroups, each scoring every other page of the block.
constexpr int kTeamWarpgroups = 2;
constexpr int kTeamThreads = kTeamWarpgroups * kWarpgroupThreads;
constexpr int kTeamWarps = kTeamThreads / 32;
// Pages each warpgroup of a team scores between two meetings of the team: the warpgroups drift apart
// freely inside an epoch, so that one's products run while the other scores.
constexpr int kEpochPages = 4;
constexpr int kTeamEpochPages = kTeamWarpgroups * kEpochPages;
// A row is cut at an epoch's end when it holds more words than this: the next epoch could then
// overflow its buffer (every key of every page entering).
constexpr int kCutAbove = kCandidateCapacity - kTeamEpochPages * kPageTokens;
static_assert(kCutAbove >= kMaxTopK, "a cut buffer must take an epoch");
// Words each thread takes per round when a buffer is cut or a row written.
constexpr int kKeepPerThread = 4;
constexpr int kKeepRound = kTeamThreads * kKeepPerThread;
constexpr int kRadixBuckets = 256;
static_assert(kRadixBuckets == kTeamThreads, "BestCut clears its histogram with one store per thread");
// Positions a row's output pass orders at a time: the bitmap lies in its buffer behind the K kept
// words.
constexpr int kBitmapWords = (kCandidateCapacity - kMaxTopK) * 2;
constexpr int64_t kBitmapPositions = int64_t(kBitmapWords) * 32;

// One team's scratch.
struct CandidateScratch {
  uint32_t histogram[kRadixBuckets];
  uint32_t round_counts[kKeepPerThread][kTeamWarps];  // kept words per (round slot, warp); warp sums
  uint32_t kept[2];  // words an epoch's close kept, both rows (16 bits each), by epoch parity
  uint32_t pick[3];  // digit, words still needed, words in its bucket
};

// The rank word above which exactly `keep` of words[0, count) lie (>=): a radix select, eight bits
// per pass from the top, that stops as soon as the bucket holding the keep-th word is taken whole.
// Words are distinct (they hold positions), so it ends by the eighth pass. 0 when keep >= count.
__device__ __forceinline__ uint64_t BestCut(const uint64_t* words, int count, int keep, CandidateScratch& s, int t,
                                            int barrier) {
  if (keep >= count) return 0;
  uint64_t prefix = 0;
  int bits = 0;
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    s.histogram[t] = 0;
    NamedBarrierSync(barrier, kTeamThreads);
    for (int e = t; e < count; e += kTeamThreads) {
      const uint64_t w = words[e];
      if (pass == 0 || (w >> (shift + 8)) == prefix) atomicAdd(&s.histogram[(w >> shift) & 255], 1u);
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
      uint32_t inclusive = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xFFFFFFFFu, inclusive, o);
        if (t >= o) inclusive += v;
      }
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
    prefix = (prefix << 8) | s.pick[0];
    bits += 8;
    keep = static_cast<int>(s.pick[1]);
    if (s.pick[2] == s.pick[1]) break;  // uniform: every thread read the same pick
  }
  return bits == 64 ? prefix : prefix << (64 - bits);
}

// The words >= cut of words[0, count), in their order: sink(rank, word) for each, with rank its
// place among them. Returns how many. Each round reads all of its words before any sink runs, so
// the sink may write the buffer itself (ranks never pass the positions still to be read).
template <typename Sink>
__device__ __forceinline__ int KeepInOrder(const uint64_t* words, int count, uint64_t cut, CandidateScratch& s, int t,
                                           int barrier, Sink&& sink) {
  const int warp = t / 32, lane = t % 32;
  const uint32_t below = (1u << lane) - 1u;
  int kept = 0;
  for (int base = 0; base < count; base += kKeepRound) {
    uint64_t w[kKeepPerThread];
    uint32_t ballot[kKeepPerThread];
#pragma unroll
    for (int k = 0; k < kKeepPerThread; ++k) {
      const int e = base + k * kTeamThreads + t;
      w[k] = e < count ? words[e] : 0;
      ballot[k] = __ballot_sync(0xFFFFFFFFu, e < count && w[k] >= cut);
      if (lane == 0) s.round_counts[k][warp] = __popc(ballot[k]);
    }
    NamedBarrierSync(barrier, kTeamThreads);
#pragma unroll
    for (int k = 0; k < kKeepPerThread; ++k) {
      int before = 0, round = 0;
#pragma unroll
      for (int x = 0; x < kTeamWarps; ++x) {
        const int c = static_cast<int>(s.round_counts[k][x]);
        before += x < warp ? c : 0;
        round += c;
      }
      if ((ballot[k] >> lane) & 1u) sink(kept + before + __popc(ballot[k] & below), w[k]);
      kept += round;
    }
    NamedBarrierSync(barrier, kTeamThreads);  // round_counts is rewritten by the next round
  }
  return kept;
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

// One query row's buffer while its keys are scored: where its words are, how many the epochs before
// the current one kept, and the key a new word must beat. Every thread of the team holds the same
// values.
struct RowCandidates {
  uint64_t* words;
  int count;
  uint32_t threshold;  // kNotCandidate at first: every key of a valid token beats it

  // Cuts the buffer to its `keep` best words and raises the threshold to the key of the keep-th
  // best word's bucket (a lower bound of its key: a superset still enters).
  __device__ __forceinline__ void Cut(int keep, CandidateScratch& s, int t, int barrier) {
    const uint64_t cut = BestCut(words, count, keep, s, t, barrier);
    uint64_t* buffer = words;
    count = KeepInOrder(words, count, cut, s, t, barrier, [&](int rank, uint64_t w) { buffer[rank] = w; });
    const uint32_t cut_key = static_cast<uint32_t>(cut >> 32);
    if (cut_key > threshold) threshold = cut_key;
  }
};

// Where this lane stages its word of each page of an epoch: its query's row, past the row's words,
// its warp's 16 slots of the page, its token among them (+ kPageTokens per page of the epoch).
// Every lane writes one, 0 (below every word) when it does not enter, so that a page's candidates
// cost one store and no vote.
__device__ __forceinline__ uint64_t* StagingSlot(const RowCandidates (&rows)[kTeamRows], int query, int warp,
                                                 int warp_token) {
  const RowCandidates& row = query == 0 ? rows[0] : rows[1];
  return row.words + row.count + 16 * warp + warp_token;
}

// Moves the epoch's staged words of both rows (`staged` slots a row, from each row's count on) to
// the ends of the rows' words, dropping the zeros: each warp reserves room for its words with one
// atomic on the close's counter (`parity`: closes alternate between two, so that one is cleared
// while the other counts). Every staged word is read before any is written, so a word may land on
// any slot.
__device__ __forceinline__ void CompactStaged(RowCandidates (&rows)[kTeamRows], int staged, int parity,
                                              CandidateScratch& s, int t, int barrier) {
  constexpr int kRounds = kTeamEpochPages * kPageTokens / kTeamThreads;
  static_assert(kRounds * kTeamThreads == kTeamEpochPages * kPageTokens, "every staged slot is read");
  static_assert(kTeamEpochPages * kPageTokens < (1 << 16), "a row's count of an epoch fits 16 bits");
  const int lane = t % 32;
  const uint32_t below = (1u << lane) - 1u;
  uint64_t w[kTeamRows][kRounds];
  uint32_t ballot[kTeamRows][kRounds];
  uint32_t warp_words = 0;  // both rows', 16 bits each
#pragma unroll
  for (int k = 0; k < kRounds; ++k) {
    const int e = k * kTeamThreads + t;
#pragma unroll
    for (int q = 0; q < kTeamRows; ++q) {
      w[q][k] = e < staged ? rows[q].words[rows[q].count + e] : 0;
      ballot[q][k] = __ballot_sync(0xFFFFFFFFu, w[q][k] != 0);
      warp_words += static_cast<uint32_t>(__popc(ballot[q][k])) << (16 * q);
    }
  }
  NamedBarrierSync(barrier, kTeamThreads);  // every staged word is read
  uint32_t at = 0;
  if (lane == 0 && warp_words != 0u) at = atomicAdd(&s.kept[parity], warp_words);
  at = __shfl_sync(0xFFFFFFFFu, at, 0);
#pragma unroll
  for (int k = 0; k < kRounds; ++k) {
#pragma unroll
    for (int q = 0; q < kTeamRows; ++q) {
      if (w[q][k] != 0) {
        const int rank = static_cast<int>((at >> (16 * q)) & 0xFFFFu) + __popc(ballot[q][k] & below);
        rows[q].words[rows[q].count + rank] = w[q][k];
      }
      at += static_cast<uint32_t>(__popc(ballot[q][k])) << (16 * q);
    }
  }
  NamedBarrierSync(barrier, kTeamThreads);  // the words are in place and counted
  const uint32_t kept = s.kept[parity];
  rows[0].count += static_cast<int>(kept & 0xFFFFu);
  rows[1].count += static_cast<int>(kept >> 16);
  // The other counter: every thread read it in the previous close, before this close's first barrier.
  if (t == 0) s.kept[parity ^ 1] = 0u;
}

// The end of epoch `epoch`, which staged `staged` slots a row (every thread of the team, after its
// pages): the staged words join the rows' words, and a row that could not take another epoch is cut
// to its `topk` best.
__device__ __forceinline__ void CloseEpoch(RowCandidates (&rows)[kTeamRows], int staged, int epoch, int topk,
                                           CandidateScratch& s, int t, int barrier) {
  NamedBarrierSync(barrier, kTeamThreads);  // the epoch's words are staged
  CompactStaged(rows, staged, epoch & 1, s, t, barrier);
#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {
    if (rows[q].count > kCutAbove) rows[q].Cut(topk, s, t, barrier);  // ends with a barrier
  }
}

// The team's exclusive prefix sum of `value` over its threads (in thread order), and the total.
__device__ __forceinline__ int TeamExclusiveSum(int value, CandidateScratch& s, int t, int barrier, int& total) {
  const int warp = t / 32, lane = t % 32;
  int inclusive = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  if (lane == 31) s.round_counts[0][warp] = static_cast<uint32_t>(inclusive);
  NamedBarrierSync(barrier, kTeamThreads);
  int before = inclusive - value;
  total = 0;
#pragma unroll
  for (int x = 0; x < kTeamWarps; ++x) {
    const int c = static_cast<int>(s.round_counts[0][x]);
    before += x < warp ? c : 0;
    total += c;
  }
  NamedBarrierSync(barrier, kTeamThreads);  // round_counts is rewritten by the next use
  return before;
}

// Writes the ids of words[0, count) (distinct positions below `length`) to out[0, count) in
// ascending position: a window of kBitmapPositions positions at a time is marked in `bitmap`, and
// each thread writes the set bits of its own stretch of the bitmap at its prefix count.
__device__ __forceinline__ void WriteInPositionOrder(const uint64_t* words, int count, int64_t length,
                                                     int64_t first_id, int32_t* out, uint32_t* bitmap,
                                                     CandidateScratch& s, int t, int barrier) {
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
    int rank = written + TeamExclusiveSum(mine, s, t, barrier, total);
    for (int x = first; x < last; ++x) {
      for (uint32_t bits = bitmap[x]; bits != 0u; bits &= bits - 1u) {
        out[rank++] = static_cast<int32_t>(first_id + base + 32 * x + __ffs(bits) - 1);
      }
    }
    written += total;
    NamedBarrierSync(barrier, kTeamThreads);  // the bitmap is cleared for the next window
  }
}

// Writes a row's output: its `topk` best words' ids (by position, or by rank word when
// `sorted_by_score`), then -1. `first_id` is added to each word's position (the row's start for
// absolute ids, else 0); `length` bounds the positions (the row's key count).
__device__ __forceinline__ void EmitRow(RowCandidates& row, int topk, bool sorted_by_score, int64_t length,
                                        int64_t first_id, int32_t* out, CandidateScratch& s, int t, int barrier) {
  row.Cut(row.count < topk ? row.count : topk, s, t, barrier);  // the best words, at the buffer's front
  uint64_t* buffer = row.words;
  const int kept = row.count;
  if (!sorted_by_score) {
    WriteInPositionOrder(buffer, kept, length, first_id, out, reinterpret_cast<uint32_t*>(buffer + kMaxTopK), s, t,
                         barrier);
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
