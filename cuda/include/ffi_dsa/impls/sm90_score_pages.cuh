// ScorePagesKernel, the first kernel of the split path: score every page of every row that needs
// scores (sm90_rows.cuh: not the rows of at most K tokens in position order), spread evenly over
// the whole GPU; SelectRowsKernel (sm90_select_rows.cuh) then selects each query row.
//
// Balance: the batch's scored pages, row after row, form one flat sequence of P pages (P from seq_lens,
// read on the device, so the launch is shape-only and graph-safe). CTA c of G scores the flat
// range [P*c/G, P*(c+1)/G) (each end rounded as ShareStart does): a long row is shared by many
// CTAs and a CTA may cover the ends of several short rows ("segments"). Every SM streams the same number of bytes whatever the mix of
// lengths: one CTA's TMA unit moves pages far slower than HBM delivers them, so a long row left to
// one CTA would be slow, while every SM streaming together pulls at HBM speed. Example: one row of
// 128K tokens (2048 pages) on 132 CTAs gives each 15 or 16 pages; in 64 rows of 1K to 32K tokens
// a 32K row spans several CTAs' ranges and a range may end one row and start the next.
//
// Roles (one CTA, 640 threads):
//   warpgroups 0-3  math: page i of the CTA goes to warpgroup i % 4; for each of the row's N
//                   queries that sees the page, 4 x wgmma m64nHk32 (tokens = M, the query's H
//                   heads = N, both K-major FP8 in 128B-swizzled smem) -> scale, relu, head
//                   weights, head sum in registers -> one rank key (rank_key.h) per token, stored
//                   to the query row's workspace row [B * N, max_pages * 64] (4 bytes per token
//                   against the 132 read for it; SelectRowsKernel reads it back from L2).
//                   The page is read from memory once for all N queries (docs/contract.md §7).
//   warpgroup 4     producer: four warps, each issuing every 4th page (a single issuing thread
//                   caps the CTA's page rate below its TMA unit's), into a ring of kStages stages
//                   (full/empty mbarriers); warp 0 also loads each segment's Q (N x H heads) by
//                   TMA into one of two buffers. Invalid page ids are never loaded: their tokens
//                   get key 0. The CTA's page 0 and its first segment's Q are issued earlier, by
//                   the thread that finds the CTA's first row (IssueFirstLoads).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <cub/block/block_scan.cuh>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_page_epilogue.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/impls/sm90_score_stamps.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct ScoreParams {
  const uint8_t* k_cache;
  const float* weights;  // [B * N, H]
  const int32_t* seq_lens;
  const int32_t* block_table;
  uint32_t* keys;      // [B * N, row_stride]; written up to the query's length rounded up to 4 (pad: kNotCandidate)
  int64_t row_stride;  // max_pages * 64
  int64_t num_pages;
  int32_t batch;
  int32_t max_pages;
  int32_t topk;
  bool sorted;
  QueryShape qs;
  // launch/tuning.h: stamp_select (a benchmark's instrument: each CTA of the kernel's stamped
  // instance stamps its chain to the first page into this region, impls/sm90_score_stamps.cuh).
  unsigned long long* stamps;
  uint64_t share_mul;  // ceil(2^32 / gridDim.x) (ShareStart; 2^32 itself for one CTA)
};

constexpr int kScoreThreads = 640;
constexpr int kMathWarpgroups = 4;
constexpr int kMathThreads = kMathWarpgroups * kWarpgroupThreads;
// 4 pages being computed + 4 in flight: each warpgroup has its next page on the way while it
// computes one. Not more: with every SM streaming the kernel is HBM-bound, and more requests in
// flight per SM only queue longer. Not fewer: with 4 a warpgroup owns a single stage, so its next
// page's load starts only once it releases the current one, and little of it is hidden.
constexpr int kStages = 8;
constexpr int kScaleBytes = kPageTokens * 4;
constexpr int kIssuerWarps = 4;
// Page i uses stage i % kStages, is issued by producer warp i % 4 and consumed by warpgroup i % 4.
// The stage barriers are waited on by phase parity, which is sound only if each stage always
// belongs to the same producer warp and warpgroup. (With 10 stages, stage 2 would hold pages 2, 12,
// 22, ...: issued by warps 2, 0, 2, ... and consumed by warpgroups 2, 0, 2, ..., whose parity
// waits then see each other's phases.)
static_assert(kStages % kIssuerWarps == 0 && kStages % kMathWarpgroups == 0, "stage ownership");
constexpr int64_t kPrefetchTableBytes = int64_t(8) << 20;
// The prologue's scan of the rows' page counts. (cub's warp-scans form, one barrier fewer, made
// ptxas spill in the unstamped instances.)
using RowScan = cub::BlockScan<long long, kScoreThreads>;

// One stage of the page ring: everything about its page at one stride, so that each of the page
// loop's addresses is the stage's base plus a constant (one multiply per page, not a shift and
// a mask per array). The FP8 rows come first, 1024-aligned (TMA swizzle-128B atoms).
struct alignas(1024) PageStage {
  uint8_t k_tile[kPageFp8Bytes];
  float scales[kPageTokens];
  int32_t page;  // page id as read from the block table, written before the full arrive
  uint64_t full, empty;
};

// Kernels are compiled per head count and per N (kQueries): the query loops unroll to exactly N
// copies and the Q buffers hold N tiles.
template <int kHeads, int kQueries>
struct alignas(1024) ScoreSmem {
  PageStage stages[kStages];
  uint8_t q_tiles[2][kQueries * kQTileBytes<kHeads>];   // segment k uses buffer k % 2
  alignas(16) float weights[kMathWarpgroups][StagedWeights<kHeads, kQueries>::kCopyFloats];  // a copy per warpgroup
  uint64_t q_full[2];
  uint64_t q_empty[2];
  typename RowScan::TempStorage scan;
  long long first_row_start;
  long long range_begin, range_end;  // the CTA's flat page range (SegmentWalk)
  int32_t first_row;
  int32_t early;  // the first segment's Q and the CTA's page 0 already issued by the prologue
};

template <int kHeads, int kQueries>
inline constexpr size_t ScoreSmemBytes() { return 1024 /* alignment slack */ + sizeof(ScoreSmem<kHeads, kQueries>); }

// Walks the rows that intersect a CTA's flat page range, one segment (row, page range) at a time.
// Every role walks it on its own; the walk is deterministic, so all agree on segment k.
// The range's end is read from shared memory at each step (ScoreSmem::range_end) rather than
// kept: a 64-bit value live from the prologue's scan through both roles was spilled.
struct SegmentWalk {
  int64_t row;
  long long row_start;  // flat index of the row's first page
  long long next;       // the CTA's flat range still to cover: [next, end)
  // Current segment.
  int64_t seg_row;
  int32_t page_begin, page_end;

  template <int kQueries>
  __device__ bool Next(const ScoreParams& p, const long long& range_end) {
    const long long end = range_end;
    while (next < end) {
      const long long pages = RowScoredPages<kQueries>(p.seq_lens, row, p.qs, p.max_pages, p.topk, p.sorted);
      if (next >= row_start + pages) {  // past this row (also skips empty and unscored rows)
        row_start += pages;
        ++row;
        continue;
      }
      seg_row = row;
      page_begin = static_cast<int32_t>(next - row_start);
      page_end = static_cast<int32_t>(min(pages, end - row_start));
      next = row_start + page_end;
      return true;
    }
    return false;
  }
};

// Producer warp 0's leader: segment `segment`'s Q (the row's N queries x kHeads heads) by TMA into
// buffer segment % 2, once the math threads released its previous use.
template <int kHeads, int kQueries>
__device__ __forceinline__ void LoadSegmentQ(ScoreSmem<kHeads, kQueries>& s, const CUtensorMap& q_map, int64_t row,
                                             int segment) {
  const int qb = segment & 1;
  if (segment >= 2) MbarWait(&s.q_empty[qb], ((segment >> 1) - 1) & 1);
  MbarArriveExpectTx(&s.q_full[qb], kQueries * kQTileBytes<kHeads>);
  TmaLoad2d(s.q_tiles[qb], &q_map, 0, static_cast<int32_t>(row * kQueries * kHeads), &s.q_full[qb]);
}

// Registers per thread after the role split (setmaxnreg): the math warpgroups hold a group's 64
// accumulators and up to 32 head weights; the producer needs few. 512 x 112 + 128 x 32 is the
// launch allocation, 640 x 96 (__launch_bounds__(640, 1)).
constexpr uint32_t kMathRegisters = 112;
constexpr uint32_t kProducerRegisters = 32;
static_assert(kMathThreads * kMathRegisters + (kScoreThreads - kMathThreads) * kProducerRegisters <= kScoreThreads * 96,
              "the register split must fit the launch allocation");
// Head weights kept in registers (RowWeights) up to one query of 64 heads or two of 32; beyond,
// beside a group's 64 accumulators, they are staged in shared memory (StagedWeights).
constexpr int kHeldWeights = 64;
template <int kHeads, int kQueries>
using ScoreWeights = std::conditional_t<kQueries * kHeads <= kHeldWeights, RowWeights<kHeads, kQueries, kHeldWeights>,
                                        StagedWeights<kHeads, kQueries>>;

// First local page index >= i0 that belongs to `lane_of_four` (pages go round-robin by i % 4).
__device__ __forceinline__ int FirstOwned(int i0, int lane_of_four) { return i0 + ((lane_of_four - i0 % 4) + 4) % 4; }
__device__ __forceinline__ uint32_t FirstOwned(uint32_t i0, uint32_t lane_of_four) { return i0 + ((lane_of_four - i0) & 3u); }

// One page into its stage, by one thread: its id first (published by the arrive, a release), then
// its FP8 rows by TMA and its scales by a bulk copy; an invalid id is never loaded (the consumers
// see it and give its tokens key 0).
__device__ __forceinline__ void IssuePage(PageStage& stage, const CUtensorMap& k_map, const ScoreParams& p,
                                          int32_t page, uint64_t policy) {
  stage.page = page;
  if (page >= 0 && page < p.num_pages) {
    MbarArriveExpectTx(&stage.full, kPageFp8Bytes + kScaleBytes);
    TmaLoad3d(stage.k_tile, &k_map, 0, 0, page, &stage.full, policy);
    BulkLoad(stage.scales, p.k_cache + int64_t(page) * kPageBytes + kPageFp8Bytes, kScaleBytes, &stage.full, policy);
  } else {
    MbarArrive(&stage.full);
  }
}

// The producer warpgroup: its four warps issue every 4th page each into the stage ring, and warp 0
// loads each segment's Q (but what the prologue issued: ScoreSmem::early).
template <int kHeads, int kQueries, bool kStamped>
__device__ __forceinline__ void ProducePages(ScoreSmem<kHeads, kQueries>& s, const CUtensorMap& k_map,
                                             const CUtensorMap& q_map, const ScoreParams& p, SegmentWalk walk,
                                             int tid) {
  static_assert(kScoreThreads - kMathThreads == 32 * kIssuerWarps, "every producer warp issues pages");
  // Whole warps run the loops and stay converged (lane 0 issues); their lanes fetch 32 page
  // ids at once, so no issue waits on a block-table load of its own.
  const int pw = (tid - kMathThreads) / 32, lane = tid % 32;
  const bool leader = lane == 0;
  const uint64_t streamed = EvictFirstPolicy();  // the pages: read once (sm90_ptx.cuh)
  int segment = 0, i0 = 0;
  while (walk.Next<kQueries>(p, s.range_end)) {
    const int np = walk.page_end - walk.page_begin;
    if (pw == 0 && leader && !(segment == 0 && s.early)) {
      LoadSegmentQ(s, q_map, walk.seg_row, segment);
      if (kStamped && segment == 0) StampScoreAt(ScoreStampSlot(p.stamps, blockIdx.x), kScoreQIssuedCycles);
    }
    __syncwarp();
    // table[i - i0] is the page id of the CTA's local page i.
    const int32_t* table = p.block_table + walk.seg_row * p.max_pages + walk.page_begin;
    for (int base = FirstOwned(i0, pw); base < i0 + np; base += 32 * kIssuerWarps) {
      const int mine = base + lane * kIssuerWarps;
      const int32_t my_page = mine < i0 + np ? table[mine - i0] : -1;
      const int count = min(32, (i0 + np - base + kIssuerWarps - 1) / kIssuerWarps);
      for (int u = 0; u < count; ++u) {
        const int i = base + u * kIssuerWarps;
        const int32_t page = __shfl_sync(0xFFFFFFFFu, my_page, u);
        if (kStamped && i == 0 && leader && !s.early) {
          StampScoreOnceLoaded(ScoreStampSlot(p.stamps, blockIdx.x), kScoreIdsCycles, page);
        }
        const int st = i % kStages;
        PageStage& stage = s.stages[st];
        if (i >= kStages) MbarWait(&stage.empty, ((i / kStages) - 1) & 1);
        if (leader && !(i == 0 && s.early)) {
          IssuePage(stage, k_map, p, page, streamed);
          if (kStamped && i == 0) StampScoreAt(ScoreStampSlot(p.stamps, blockIdx.x), kScoreIssuedCycles);
        }
        __syncwarp();
      }
    }
    i0 += np;
    ++segment;
  }
}

// What a math thread holds for one segment (a row's page range): where its keys go and what it
// scores with, and the page body (Page) that the warpgroup's page loop runs.
template <int kHeads, int kQueries>
struct SegmentScorer {
  using Groups = PageGroups<kHeads, kQueries>;
  static constexpr int kSlots = Groups::kSlots;
  ScoreSmem<kHeads, kQueries>& s;
  int r0, lane;
  uint32_t page_bound;  // page ids below it are valid
  uint32_t i0;          // the CTA's local index of the segment's first page
  int32_t page_begin;   // the row's page at i0
  uint32_t desc_q;
  LaneSlots<kHeads, kQueries> slots;  // this lane's slots (sm90_page_epilogue.cuh)
  int32_t group_end[Groups::kCount];  // where each group's keys end (uniform)
  uint32_t* slot_keys[kSlots];        // the slots' keys at this lane's token of the row's page page_begin
  ScoreWeights<kHeads, kQueries> weights;

  // Everything but the Q tiles, read before the caller waits for them: on a cold call seq_lens,
  // the weights and Q are all memory round trips, and this way they overlap.
  __device__ __forceinline__ void Begin(const ScoreParams& p, int64_t row, uint32_t wg, int tid, int token) {
    // Each query's keys end at its length rounded up to a quad (the select reads whole quads;
    // the pad gets kNotCandidate); 0 for a query that needs no scores.
    int32_t length[kQueries], written[kQueries];
#pragma unroll
    for (int j = 0; j < kQueries; ++j) {
      length[j] = QueryLength(p.seq_lens, row, j, p.qs, p.max_pages);
      written[j] = ScoresNeeded(length[j], p.topk, p.sorted) ? static_cast<int32_t>((int64_t(length[j]) + 3) / 4 * 4) : 0;
    }
    slots.Set(length, written, lane, token);
    GroupEnds<kHeads, kQueries>(written, group_end);
#pragma unroll
    for (int g = 0; g < Groups::kCount; ++g) group_end[g] = WarpUniform(group_end[g]);
#pragma unroll
    for (int x = 0; x < kSlots; ++x) {
      slot_keys[x] = OpaquePointer(p.keys + (row * kQueries + slots.query[x]) * p.row_stride + page_begin * kPageTokens + token);
    }
    const float* row_weights = p.weights + row * kQueries * kHeads;
    if constexpr (decltype(weights)::kStaged) {
      weights.Load(row_weights, s.weights[wg], tid % kWarpgroupThreads, /*barrier=*/1 + wg);
    } else {
      weights.Load(row_weights, lane);
    }
  }

  // Page i of the CTA, staged in `stage` (descriptor desc_k), loaded in phase `phase`: every group
  // of the row's queries, one key per (query, token) to the query rows' workspace rows.
  __device__ __forceinline__ void Page(uint32_t i, PageStage& stage, uint32_t desc_k, uint32_t phase) {
    MbarWait(&stage.full, phase);
    // The page id is read now and used only after the products: no branch on it (an invalid
    // page's stage holds stale bytes; its keys are kNotCandidate). One unsigned compare: a
    // negative id is above any bound.
    const bool valid = static_cast<uint32_t>(stage.page) < page_bound;
    const int32_t seg_t0 = static_cast<int32_t>(i - i0) * kPageTokens;  // the page's first token in the segment
    const int32_t page_t0 = page_begin * kPageTokens + seg_t0;            // and in the row
    ForEachGroup<Groups::kCount>([&](auto group) {
      constexpr int g = decltype(group)::value;
      constexpr bool kLast = g == Groups::kCount - 1;  // the stage is released after its products
      // With one group, the row's longest query (the loop's end) sees every page; with more, a
      // group whose queries all end before this page skips its products (uniform).
      if (Groups::kCount > 1 && page_t0 >= group_end[g]) {
        if (kLast) MbarArrive(&stage.empty);
        return;
      }
      uint32_t keys[Groups::Slots(g)];
      ScoreGroup<kHeads, kQueries, g>(desc_k, desc_q, stage.scales, r0, lane, weights, [&] {
        if (kLast) MbarArrive(&stage.empty);  // this thread no longer reads the stage
      }, keys);
      // Every byte the select reads is written (compute-sanitizer initcheck), nothing past it.
#pragma unroll
      for (int x = 0; x < Groups::Slots(g); ++x) {
        const int slot = Groups::FirstSlot(g) + x;
        const uint32_t key = valid && page_t0 < slots.key_end[slot] ? keys[x] : kNotCandidate;
        if (page_t0 < slots.store_end[slot]) StoreGlobal(slot_keys[slot] + static_cast<uint32_t>(seg_t0), key);
      }
    });
  }
};

// The stamps' first arrivals, by math warp 0 before its segment loop (the whole warp waits, so that
// it stays converged for the wgmma after): the first segment's Q (buffer 0, phase 0) and the CTA's page 0 (stage 0,
// phase 0: a CTA with pages has at least one in its first segment), which the loop then finds
// complete.
template <int kHeads, int kQueries>
__device__ __forceinline__ void StampFirstArrivals(ScoreSmem<kHeads, kQueries>& s, const ScoreParams& p, int lane) {
  unsigned long long* words = ScoreStampSlot(p.stamps, blockIdx.x);
  MbarWait(&s.q_full[0], 0);
  if (lane == 0) StampScoreAt(words, kScoreQReadyCycles);
  MbarWait(&s.stages[0].full, 0);
  if (lane == 0) StampScoreAt(words, kScoreFirstPageCycles);
}

// A math warpgroup: pages i = wg (mod 4) of the CTA's range, segment by segment.
template <int kHeads, int kQueries, bool kStamped>
__device__ __forceinline__ void ScoreStagedPages(ScoreSmem<kHeads, kQueries>& s, const ScoreParams& p,
                                                 SegmentWalk walk, int tid) {
  // The warp's index, and below each segment's page range, read through WarpUniform: ptxas then
  // keeps the page loop's counter, stage, phase, barrier addresses and descriptors in uniform
  // registers, off the vector pipe and with no R2UR before each wgmma. Every lane walks the same
  // segments: the shuffles only tell ptxas so.
  const uint32_t cta_warp = WarpUniform(static_cast<uint32_t>(tid) / 32);
  const uint32_t wg = cta_warp / 4;
  const int warp = static_cast<int>(cta_warp % 4), lane = tid % 32;
  // Accumulator layout of wgmma m64nN: thread holds rows r0 and r0 + 8, columns
  // 8j + 2 * (lane % 4) + {0, 1}; after the quad reduction a lane's scores are of token r0 + 8 * (lane & 1).
  const int r0 = 16 * warp + lane / 4;
  const int token = r0 + 8 * (lane & 1);
  SegmentScorer<kHeads, kQueries> seg{s, r0, lane};
  seg.page_bound = p.num_pages > INT32_MAX ? 0x80000000u : static_cast<uint32_t>(p.num_pages);
  if (kStamped && cta_warp == 0) StampFirstArrivals(s, p, lane);
  uint32_t segment = 0, i0 = 0;
  while (WarpUniform(walk.Next<kQueries>(p, s.range_end))) {
    seg.i0 = i0;
    seg.page_begin = WarpUniform(walk.page_begin);
    const uint32_t i_end = i0 + static_cast<uint32_t>(WarpUniform(walk.page_end) - seg.page_begin);
    const uint32_t qb = segment & 1;
    seg.Begin(p, walk.seg_row, wg, tid, token);
    // The segment's Q descriptor and this warpgroup's first stage's (its other stage lies at a
    // fixed offset, DescAdvance), through WarpUniform, which ptxas cannot recompute: it keeps
    // them in uniform registers instead of rebuilding them from the shared window's base per page.
    seg.desc_q = WarpUniform(SmemDescLow(s.q_tiles[qb]));
    const uint32_t desc_own = WarpUniform(SmemDescLow(s.stages[wg].k_tile));
    // Every math thread waits for the segment's Q, pages or not: its q_empty arrival below must
    // not run ahead into the next phase of the buffer (a warpgroup with no page in several
    // one-page segments would otherwise arrive for segment k + 2 before others did for k).
    MbarWait(&s.q_full[qb], (segment >> 1) & 1);
    // Page i of the CTA uses stage i % 8, in phase (i / 8) & 1.
    const uint32_t first = FirstOwned(i0, wg);
    if constexpr (PageGroups<kHeads, kQueries>::kCount == 1) {
      // Page 8t + wg uses stage wg and page 8t + wg + 4 stage wg + 4, both in phase t & 1
      // (kStages = 2 x 4 warpgroups): walking turn t's pair, each page's stage is this warpgroup's
      // first stage plus a constant, and its barriers, page id, scales and descriptor need no
      // stage arithmetic. (With two groups per page the second copy of the page costs more
      // registers than the arithmetic it saves: spills.)
      static_assert(kStages == 2 * kMathWarpgroups, "a warpgroup's pages alternate between two stages");
      PageStage* const own = &s.stages[wg];
      const uint32_t desc_other = DescAdvance(desc_own, kMathWarpgroups * sizeof(PageStage));
      uint32_t i = first;
      if (i < i_end && i % kStages != wg) {  // the segment starts on the turn's second page
        seg.Page(i, own[kMathWarpgroups], desc_other, (i / kStages) & 1);
        i += kMathWarpgroups;
      }
      for (; i < i_end; i += kStages) {
        const uint32_t phase = (i / kStages) & 1;
        seg.Page(i, own[0], desc_own, phase);
        if (i + kMathWarpgroups < i_end) seg.Page(i + kMathWarpgroups, own[kMathWarpgroups], desc_other, phase);
      }
    } else {
      const uint32_t desc_k0 = WarpUniform(SmemDescLow(s.stages[0].k_tile));
      for (uint32_t i = first; i < i_end; i += kMathWarpgroups) {
        const uint32_t st = i % kStages;
        seg.Page(i, s.stages[st], DescAdvance(desc_k0, st * sizeof(PageStage)), (i / kStages) & 1);
      }
    }
    MbarArrive(&s.q_empty[qb]);  // done with this segment's Q (every math thread, pages or not)
    i0 = i_end;
    ++segment;
  }
  if (kStamped && warp == 0 && lane == 0) StampScoreEnd(ScoreStampSlot(p.stamps, blockIdx.x));
}

// The CTA's first loads, by the thread whose row holds its first page, as soon as it knows so: the
// page id first, the row's Q into buffer 0 while the id is on its way, then page 0 into stage 0
// (ScoreSmem::early), ahead of the barrier after which the producer warps would otherwise start
// (the chain to the first page is most of a one-page CTA's time). The two mbarriers were
// initialized by warp 0 (InitBarriers), and made visible to this thread by a barrier or __syncwarp.
template <int kHeads, int kQueries, bool kStamped>
__device__ __forceinline__ void IssueFirstLoads(ScoreSmem<kHeads, kQueries>& s, const CUtensorMap& k_map,
                                                const CUtensorMap& q_map, const ScoreParams& p, int64_t row,
                                                long long page_in_row) {
  unsigned long long* words = kStamped ? ScoreStampSlot(p.stamps, blockIdx.x) : nullptr;
  const int32_t page = p.block_table[row * p.max_pages + page_in_row];
  LoadSegmentQ(s, q_map, row, 0);
  if (kStamped) StampScoreAt(words, kScoreQIssuedCycles);
  if (kStamped) StampScoreOnceLoaded(words, kScoreIdsCycles, page);
  IssuePage(s.stages[0], k_map, p, page, EvictFirstPolicy());
  if (kStamped) StampScoreAt(words, kScoreIssuedCycles);
  s.early = 1;
}

// The mbarriers, spread over the warps (one thread's inits are serialized, and each is on the chain
// of whatever that thread does next): warp 0, whose lanes hold the first rows, inits only the two
// its early loads use (stage 0's full, Q buffer 0's full); lane 0 of warps 1.. the rest.
template <int kHeads, int kQueries>
__device__ __forceinline__ void InitBarriers(ScoreSmem<kHeads, kQueries>& s, int tid) {
  constexpr int kOthers = 2 * kStages + 2;  // all but the two warp 0 inits
  constexpr int kWarps = kScoreThreads / 32;
  static_assert(kOthers <= kWarps - 1, "one barrier a warp");
  if (tid % 32 != 0) return;
  const int warp = tid / 32;
  if (warp == 0) {
    MbarInit(&s.stages[0].full, 1);
    MbarInit(&s.q_full[0], 1);
    s.early = 0;
  } else if (warp <= kOthers) {
    const int b = warp - 1;  // stages 1.. full, every stage's empty, Q buffer 1's full, both Q empties
    if (b < kStages - 1) {
      MbarInit(&s.stages[b + 1].full, 1);
    } else if (b < 2 * kStages - 1) {
      MbarInit(&s.stages[b - (kStages - 1)].empty, kWarpgroupThreads);
    } else if (b == 2 * kStages - 1) {
      MbarInit(&s.q_full[1], 1);
    } else {
      MbarInit(&s.q_empty[b - 2 * kStages], kMathThreads);
    }
  } else {
    return;
  }
  FenceBarrierInit();
}

// The first flat page of CTA c of G: floor(total x c x m / 2^32) with m = ceil(2^32 / G)
// (ScoreParams::share_mul, from the host), a multiply where a division is ~25 dependent
// instructions on the chain. With G x m = 2^32 + e, 0 <= e < G, and total x G < 2^32, it is
// total x c / G plus less than one: exact at c = 0 and c = G, non-decreasing in c, and within a
// page of the even split. Larger totals divide in 64 bits.
__device__ __forceinline__ long long ShareStart(long long total, uint32_t c, const ScoreParams& p) {
  // (A launch without the multiplier divides: slower, never a wrong split.)
  if (total * gridDim.x <= static_cast<long long>(UINT32_MAX) && p.share_mul != 0) {
    return static_cast<long long>((static_cast<uint64_t>(static_cast<uint32_t>(total) * c) * p.share_mul) >> 32);
  }
  return total * c / gridDim.x;
}

// Batches of at most 32 rows (a lane a row): warp 0 alone scans their page counts by shuffles,
// finds the CTA's range and first row, and issues the first loads; no block scan or barrier comes
// before the first page's TMA. The range is published to shared memory for the other warps.
template <int kHeads, int kQueries, bool kStamped>
__device__ __forceinline__ void RangeOfFewRows(ScoreSmem<kHeads, kQueries>& s, const CUtensorMap& k_map,
                                               const CUtensorMap& q_map, const ScoreParams& p, int lane) {
  const int pages = lane < p.batch ? RowScoredPages<kQueries>(p.seq_lens, lane, p.qs, p.max_pages, p.topk, p.sorted) : 0;
  if (kStamped && lane == 0) StampScoreOnceLoaded(ScoreStampSlot(p.stamps, blockIdx.x), kScoreLensCycles, pages);
  long long through = pages;  // inclusive
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const long long below = __shfl_up_sync(0xFFFFFFFFu, through, d);
    if (lane >= d) through += below;
  }
  const long long total = __shfl_sync(0xFFFFFFFFu, through, 31);
  if (kStamped && lane == 0) StampScoreOnceLoaded(ScoreStampSlot(p.stamps, blockIdx.x), kScoreScannedCycles, total);
  const long long begin = ShareStart(total, blockIdx.x, p), end = ShareStart(total, blockIdx.x + 1, p);
  const long long before = through - pages;
  if (lane == 0) {
    s.range_begin = begin;
    s.range_end = end;
  }
  __syncwarp();  // lane 0's mbarrier inits, before another lane's arrive on them
  if (begin < end && pages > 0 && before <= begin && begin < through) {
    s.first_row = lane;
    s.first_row_start = before;
    IssueFirstLoads<kHeads, kQueries, kStamped>(s, k_map, q_map, p, lane, begin - before);
  }
}

// Larger batches: the rows' page counts scanned 640 at a time by the whole CTA, the range found
// from the total, then the first row by a second pass (which reuses the first tile's scan); the
// first row's thread issues the first loads when that row is in the first tile. Returns the range
// (every thread: the barrier inside the scan publishes it), [begin, end) empty for a CTA with no
// pages; s.first_row and s.first_row_start are read after the caller's barrier.
template <int kHeads, int kQueries, bool kStamped>
__device__ __forceinline__ void RangeOfManyRows(ScoreSmem<kHeads, kQueries>& s, const CUtensorMap& k_map,
                                                const CUtensorMap& q_map, const ScoreParams& p, int tid,
                                                long long& begin, long long& end) {
  using Scan = RowScan;
  long long total = 0;
  int first_tile_pages = 0;
  long long first_tile_before = 0, first_tile_total = 0;
  for (int64_t base = 0; base < p.batch; base += kScoreThreads) {
    const int64_t r = base + tid;
    const int pages = r < p.batch ? RowScoredPages<kQueries>(p.seq_lens, r, p.qs, p.max_pages, p.topk, p.sorted) : 0;
    long long before, tile_total;
    if (kStamped && tid == 0 && base == 0) StampScoreOnceLoaded(ScoreStampSlot(p.stamps, blockIdx.x), kScoreLensCycles, pages);
    Scan(s.scan).ExclusiveSum(static_cast<long long>(pages), before, tile_total);
    if (kStamped && tid == 0 && base == 0) StampScoreOnceLoaded(ScoreStampSlot(p.stamps, blockIdx.x), kScoreScannedCycles, tile_total);
    if (base == 0) {
      first_tile_pages = pages;
      first_tile_before = before;
      first_tile_total = tile_total;
    }
    total += tile_total;
    if (p.batch > kScoreThreads) __syncthreads();  // the scan's storage is used again
  }
  begin = ShareStart(total, blockIdx.x, p);
  end = ShareStart(total, blockIdx.x + 1, p);
  if (begin >= end) return;
  if (tid == 0) {  // read after the caller's barrier
    s.range_begin = begin;
    s.range_end = end;
  }
  // The row holding the range's first page. (Scanning the first tile again would put a block scan
  // and its barrier on every CTA's critical path.)
  long long carry = 0;
  for (int64_t base = 0; base < p.batch && carry <= begin; base += kScoreThreads) {
    const int64_t r = base + tid;
    int pages = first_tile_pages;
    long long before = first_tile_before, tile_total = first_tile_total;
    if (base > 0) {
      pages = r < p.batch ? RowScoredPages<kQueries>(p.seq_lens, r, p.qs, p.max_pages, p.topk, p.sorted) : 0;
      Scan(s.scan).ExclusiveSum(static_cast<long long>(pages), before, tile_total);
    }
    before += carry;
    if (pages > 0 && before <= begin && begin < before + pages) {
      s.first_row = static_cast<int32_t>(r);
      s.first_row_start = before;
      // Warp 0's inits of the barriers it arrives on are ordered before this thread by the
      // __syncthreads inside the scan above (cub's raking scan has one at 640 threads).
      if (base == 0) IssueFirstLoads<kHeads, kQueries, kStamped>(s, k_map, q_map, p, r, begin - before);
    }
    carry += tile_total;
    if (base + kScoreThreads < p.batch && carry <= begin) __syncthreads();  // the next tile's scan
  }
}

// kStamped: the instance of the stamp_select instrument (impls/sm90_score_stamps.cuh), so that the
// stamps cost the unstamped kernel not even a branch (a runtime test changed ptxas's schedule of
// the page loop).
template <int kHeads, int kQueries, bool kStamped = false>
__global__ void __launch_bounds__(kScoreThreads, 1)
    ScorePagesKernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap q_map,
                     const ScoreParams p) {
  extern __shared__ uint8_t smem_raw[];
  ScoreSmem<kHeads, kQueries>& s = *reinterpret_cast<ScoreSmem<kHeads, kQueries>*>(AlignedSmem<1024>(smem_raw));
  const int tid = threadIdx.x;
  if (kStamped && tid == 0) StampScoreStart(ScoreStampSlot(p.stamps, blockIdx.x));
  // The block table into L2 while seq_lens is read and scanned: a CTA learns which rows it scores
  // only after the scan, and its first page id read was then a second HBM round trip before the
  // first page's TMA. The CTAs split the table's lines (each line asked for once); tables past
  // kPrefetchTableBytes (B x pages far beyond a decode step's) are left alone.
  {
    const int64_t table_bytes = int64_t(p.batch) * p.max_pages * int64_t(sizeof(int32_t));
    if (table_bytes <= kPrefetchTableBytes) {
      const char* table = reinterpret_cast<const char*>(p.block_table);
      for (int64_t line = int64_t(blockIdx.x) * kScoreThreads + tid; line * 128 < table_bytes;
           line += int64_t(gridDim.x) * kScoreThreads) {
        PrefetchL2(table + line * 128);
      }
    }
  }
  // The TMA descriptors too: the first page's TMA would otherwise fetch its descriptor first.
  if (tid == kMathThreads) {
    if (p.num_pages > 0) PrefetchTensorMap(&k_map);  // with no pages the map is left unencoded
    PrefetchTensorMap(&q_map);
  }
  InitBarriers(s, tid);
  // Launched with programmatic stream serialization (unless launch/tuning.h turns it off), this grid may be
  // resident while the stream's previous kernel still runs; everything above touches only
  // parameters, shared memory and L2 hints, everything below reads inputs that kernel may write.
  WaitForPrecedingGrid();
  if (kStamped && tid == 0) StampScoreAt(ScoreStampSlot(p.stamps, blockIdx.x), kScoreWaitedCycles);
  // SelectRowsKernel's CTAs may be placed now; they wait for this grid before reading keys. Not
  // before the wait above: the select reads seq_lens and the block table as soon as it starts.
  AllowDependentLaunch();

  // ---- this CTA's flat page range and first row ------------------------------------------------
  if (p.batch <= 32) {
    if (tid < 32) RangeOfFewRows<kHeads, kQueries, kStamped>(s, k_map, q_map, p, tid);
    __syncthreads();
    if (s.range_begin >= s.range_end) return;  // fewer pages than CTAs: the whole CTA leaves together
  } else {
    long long begin, end;
    RangeOfManyRows<kHeads, kQueries, kStamped>(s, k_map, q_map, p, tid, begin, end);
    if (begin >= end) return;
    __syncthreads();
  }
  SegmentWalk walk{s.first_row, s.first_row_start, s.range_begin, 0, 0, 0};
  if (kStamped && tid == 0) StampScoreAt(ScoreStampSlot(p.stamps, blockIdx.x), kScoreRangedCycles);
  // A math warp with no part in the first page (warpgroup 1's page comes later, if at all).
  if (kStamped && tid == kWarpgroupThreads) StampScoreL2Hit(ScoreStampSlot(p.stamps, blockIdx.x), p.seq_lens);
  // One branch per role, so that each warpgroup's setmaxnreg is the first thing its branch does.
  if (tid >= kMathThreads) {
    ShrinkRegisters<kProducerRegisters>();
    ProducePages<kHeads, kQueries, kStamped>(s, k_map, q_map, p, walk, tid);
  } else {
    GrowRegisters<kMathRegisters>();
    ScoreStagedPages<kHeads, kQueries, kStamped>(s, p, walk, tid);
  }
}

}  // namespace ffi_dsa::sm90
