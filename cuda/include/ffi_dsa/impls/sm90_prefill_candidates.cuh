// The select of PrefillRowsKernel (sm90_prefill_rows.cuh), run while it scores: each query row keeps
// its candidates in shared memory, as rank words (rank_key.h: key, then the smaller position) in
// position order, and a rising threshold key. A page adds the (query, token) pairs whose key beats
// the row's threshold; when a row's buffer could not take another page, the buffer is cut to its K
// best words and the threshold rises to the K-th best key. A later key that only equals the
// threshold never enters: its position is larger than every kept word's, so it loses their ties.
// The exact top K is thus always inside the buffer, whatever the data (plateaus, ties, NaN,
// scores rising along the row), and no score leaves the SM.
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

// Words a row's buffer holds. At least K plus a page's tokens; at 4096, rows of random scores cut
// their buffer a few times per 64K keys (about K * ln(length / K) words beat a rising threshold).
constexpr int kCandidateCapacity = 4096;
static_assert(kCandidateCapacity >= kMaxTopK + kPageTokens, "a cut buffer must take a page");
// The threads of a team: two warpgroups, each scoring one page of every exchange.
constexpr int kTeamWarpgroups = 2;
constexpr int kTeamThreads = kTeamWarpgroups * kWarpgroupThreads;
constexpr int kTeamWarps = kTeamThreads / 32;
// Words each thread takes per round when a buffer is cut or emitted in order.
constexpr int kKeepPerThread = 4;
constexpr int kKeepRound = kTeamThreads * kKeepPerThread;
// Pages whose candidates one exchange adds (AppendTeamPages): one per warpgroup of the team.
constexpr int kPagesPerExchange = kTeamWarpgroups;
constexpr int kRadixBuckets = 256;
static_assert(kRadixBuckets == kTeamThreads, "BestCut clears its histogram with one store per thread");

// One team's scratch.
struct alignas(16) CandidateScratch {  // 16-aligned: the warp counts are read as uint4
  uint32_t histogram[kRadixBuckets];
  uint32_t round_counts[kKeepPerThread][kTeamWarps];  // kept words per (round slot, warp)
  uint32_t warp_counts[2][kPagesPerExchange * 4];    // per (page, warp of its warpgroup), by exchange parity
  uint32_t pick[3];                                   // digit, words still needed, words in its bucket
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

// One query row's buffer while its keys are scored: where its words are, how many, and the key a
// new word must beat. Every thread of the team holds the same values.
struct RowCandidates {
  uint64_t* words;
  int count;
  uint32_t threshold;  // kNotCandidate at first: every key of a valid token beats it

  // Cuts the buffer to its `keep` best words, in order, and raises the threshold to the key of
  // the keep-th best word's bucket (a lower bound of its key: a superset still enters).
  __device__ __forceinline__ void Cut(int keep, CandidateScratch& s, int t, int barrier) {
    NamedBarrierSync(barrier, kTeamThreads);  // the page's words are stored
    const uint64_t cut = BestCut(words, count, keep, s, t, barrier);
    uint64_t* buffer = words;
    count = KeepInOrder(words, count, cut, s, t, barrier, [&](int rank, uint64_t w) { buffer[rank] = w; });
    const uint32_t cut_key = static_cast<uint32_t>(cut >> 32);
    if (cut_key > threshold) threshold = cut_key;
  }
};

// Adds the candidates of the team's two pages (page `page` of the exchange is scored by warpgroup
// `page` of the team: page 0 holds the smaller positions) for its two query rows. This lane holds
// the key of query `query` (0 or 1) for token `warp_token` of its warp's 16 (row r0 + 8 * (lane &
// 1)) of its warpgroup's page; `enters` says whether it beats that row's threshold. The words are
// stored in position order: each warp ORs its lanes' flags into one mask (bit 16 * query + token
// within the warp's 16) and publishes its two rows' counts packed in one word (at most 16 each, so
// sums of the eight warps' words never carry between the halves); a word's place is the packed sum
// of the warps before its own plus its rank in its own warp's mask. One barrier per exchange.
__device__ __forceinline__ void AppendTeamPages(RowCandidates (&rows)[2], bool enters, uint64_t word, int page,
                                                int query, int warp_token, CandidateScratch& s, int warp, int lane,
                                                int parity, int barrier) {
  constexpr int kWarpsPerExchange = kPagesPerExchange * 4;
  const uint32_t mine = __reduce_or_sync(0xFFFFFFFFu, enters ? 1u << (16 * query + warp_token) : 0u);
  if (lane == 0) s.warp_counts[parity][page * 4 + warp] = __popc(mine & 0xFFFFu) | (__popc(mine >> 16) << 16);
  NamedBarrierSync(barrier, kTeamThreads);
  uint32_t counts[kWarpsPerExchange];
#pragma unroll
  for (int x = 0; x < kWarpsPerExchange; x += 4) {
    const uint4 c = *reinterpret_cast<const uint4*>(&s.warp_counts[parity][x]);
    counts[x] = c.x;
    counts[x + 1] = c.y;
    counts[x + 2] = c.z;
    counts[x + 3] = c.w;
  }
  const int me = page * 4 + warp;  // warp-uniform
  uint32_t total = 0, before = 0;
#pragma unroll
  for (int x = 0; x < kWarpsPerExchange; ++x) {
    total += counts[x];
    before += x < me ? counts[x] : 0u;
  }
  if (total == 0u) return;
  if (enters) {
    const int shift = 16 * query;
    const int rank = static_cast<int>((before >> shift) & 0xFFFFu) +
                     __popc((mine >> shift) & ((1u << warp_token) - 1u));
    uint64_t* end = query == 0 ? rows[0].words + rows[0].count : rows[1].words + rows[1].count;
    end[rank] = word;
  }
  rows[0].count += static_cast<int>(total & 0xFFFFu);
  rows[1].count += static_cast<int>(total >> 16);
}

// Writes a row's output: its `topk` best words' ids (by position, or by rank word when
// `sorted_by_score`), then -1. `first_id` is added to each word's position (the row's start for
// absolute ids, else 0).
__device__ __forceinline__ void EmitRow(RowCandidates& row, int topk, bool sorted_by_score, int64_t first_id,
                                        int32_t* out, CandidateScratch& s, int t, int barrier) {
  NamedBarrierSync(barrier, kTeamThreads);  // the last page's words are stored
  const int take = row.count < topk ? row.count : topk;
  const uint64_t cut = BestCut(row.words, row.count, take, s, t, barrier);
  auto id_of = [&](uint64_t w) { return static_cast<int32_t>(first_id + RankWordPosition(w)); };
  int written;
  if (!sorted_by_score) {
    auto to_output = [&](int rank, uint64_t w) { out[rank] = id_of(w); };
    written = KeepInOrder(row.words, row.count, cut, s, t, barrier, to_output);
  } else {
    uint64_t* buffer = row.words;
    written = KeepInOrder(row.words, row.count, cut, s, t, barrier, [&](int rank, uint64_t w) { buffer[rank] = w; });
    int n = 1;
    while (n < written) n <<= 1;
    for (int e = written + t; e < n; e += kTeamThreads) buffer[e] = 0;  // below every word
    NamedBarrierSync(barrier, kTeamThreads);
    SortDescending(buffer, n, t, barrier);
    for (int e = t; e < written; e += kTeamThreads) out[e] = id_of(buffer[e]);
  }
  for (int e = written + t; e < topk; e += kTeamThreads) out[e] = -1;
}

}  // namespace ffi_dsa::sm90
