// The four-pass select (SelectSlice: stats, a histogram linear in the score, the K-th bucket's keys
// gathered and ranked, the emit) over one CTA of kSelectThreads or a cluster: FusedRowsKernel's
// tail after its last page, and PassSelectRowsKernel, the split path's select while the bin select
// (sm90_bin_select.cuh, SelectRowsKernel in sm90_select_rows.cuh) is tuned to beat it. This file
// goes once the bin select serves both.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_cluster_topk.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/impls/sm90_select_params.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/rank_key.h"
#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

struct SelectSmem {
  ClusterSelectStorage select;
  int32_t slice_pages[kMaxStagedPages];  // page ids of a staged slice: emitting a winner is a smem lookup
  uint64_t keys_landed;                  // mbarrier of PassSelectRowsKernel's staging copy
};
// PassSelectRowsKernel's dynamic shared memory: SelectSmem, then the staged keys.
__host__ __device__ constexpr size_t PassSelectStagedKeysOffset() { return (sizeof(SelectSmem) + 127) / 128 * 128; }
__host__ __device__ constexpr size_t PassSelectSmemBytes(uint32_t staged_capacity) {
  return PassSelectStagedKeysOffset() + size_t(staged_capacity) * sizeof(uint32_t);
}

// Emit works on chunks of up to 16 tiles (32K keys, a whole staged slice): the (tile, warp)
// counts of a chunk fit one table entry per thread, and each half of a packed count stays below
// 2^16.
constexpr uint32_t kChunkTiles = 16;
static_assert(kChunkTiles % kBatchTiles == 0, "a batch never spans two chunks");
static_assert(kChunkTiles * kSelectWarps <= kSelectThreads, "one table entry per thread");
static_assert(kChunkTiles * kTileKeys < 65536, "packed (greater, equal) counts of a chunk");
static_assert(kCountedTiles == kChunkTiles, "a counted slice is one chunk");

// The exact top-K of query row `query_row` (n tokens of block-table row `row`), from this CTA's
// slice of it: keys [begin, begin + m) of the query in `keys`, the slice's page ids in `pages`.
// Every CTA of the row's cluster calls it with its own slice. `thread_stats`: this thread's share
// of the slice's stats (the shares of a CTA's threads disjoint, together the whole slice); they are
// combined before waiting on `landed` (the mbarrier of the keys' copy into shared memory, or null).
__device__ __forceinline__ void SelectSlice(const SelectParams& p, SelectSmem& smem, int64_t query_row, int64_t row,
                                            int64_t n, int64_t begin,
                                            const KeySpan& keys, const SliceStats& thread_stats, const int32_t* pages,
                                            uint64_t* landed, int cluster_size, int cluster_rank) {
  auto& s = smem.select;
  const int tid = threadIdx.x;
  const uint32_t topk = static_cast<uint32_t>(p.topk);
  const uint32_t tiles = Tiles(keys);

  // Otherwise (sorted and at most K tokens) every valid token wins: no statistics needed.
  const bool select = ThresholdNeeded(n, p.topk);
  SliceStats row_stats;
  if (select) row_stats = RowStats(s, thread_stats, cluster_size);
  if (landed != nullptr) MbarWait(landed, 0);
  // A staged slice's last workspace reads are behind us: every thread's stats loads were consumed
  // before RowStats' barriers, and the copy has landed. A slice read from L2 lets the next kernel
  // in only by exiting.
  if (p.let_next_in && keys.staged != nullptr) AllowDependentLaunch();
  bool counted = false;  // the emit's count table is (nearly) ready: BucketThreshold
  const Threshold th = select ? ClusterThreshold(s, keys, topk, row_stats, cluster_size, counted) : kTakeAll;

  // ---- emit: winners by ascending position --------------------------------------------------
  // (greater-than-T, equal-to-T) counts of a quad, packed in one word.
  auto counts = [&](const uint4& q) {
    auto one = [&](uint32_t key) { return (uint32_t(Wins(key, th)) << 16) + uint32_t(Ties(key, th)); };
    return one(q.x) + one(q.y) + one(q.z) + one(q.w);
  };
  // The exclusive prefix of a chunk's (tile, warp) counts in chunk_offsets, in place; returns the
  // chunk's total. Ends with a barrier.
  const int warp = tid / 32, lane = tid % 32;
  auto prefix_table = [&](uint32_t chunk_tiles) {
    uint32_t chunk_total;
    const uint32_t offset =
        BlockExclusiveSum(s, tid < chunk_tiles * kSelectWarps ? s.chunk_offsets[tid] : 0u, chunk_total);
    s.chunk_offsets[tid] = offset;  // each thread its own entry: read above by this thread only
    __syncthreads();
    return chunk_total;
  };
  // The (tile, warp) counts of a chunk and their exclusive prefix, in chunk_offsets; returns the
  // chunk's total. Ends with a barrier.
  auto chunk_table = [&](uint32_t chunk) {
    const uint32_t chunk_tiles = min(kChunkTiles, tiles - chunk);
#pragma unroll 1
    for (uint32_t t = 0; t < chunk_tiles; t += kBatchTiles) {
      uint4 q[kBatchTiles];
      uint32_t x[kBatchTiles];
      LoadBatch(keys, chunk + t, q);
#pragma unroll
      for (uint32_t u = 0; u < kBatchTiles; ++u) x[u] = WarpSum(counts(q[u]));
#pragma unroll
      for (uint32_t u = 0; u < kBatchTiles; ++u) {
        if (lane == 0 && t + u < chunk_tiles) s.chunk_offsets[(t + u) * kSelectWarps + warp] = x[u];
      }
    }
    __syncthreads();
    return prefix_table(chunk_tiles);
  };
  // Pass 1: this CTA's totals (a slice of one chunk: its table, kept for the emit), then the lower
  // CTAs' totals.
  const bool one_chunk = tiles <= kChunkTiles;
  uint32_t first_chunk_total = 0;
  unsigned long long cta_total;  // (greater << 32) | equal
  if (one_chunk) {
    if (counted) {  // the gather pass counted everything but the K-th bucket's keys
      AddGatheredCounts(s, th);
      first_chunk_total = prefix_table(tiles);
    } else {
      first_chunk_total = chunk_table(0);
    }
    cta_total = (static_cast<unsigned long long>(first_chunk_total >> 16) << 32) | (first_chunk_total & 0xFFFFu);
  } else {
    unsigned long long mine = 0;
    ForEachQuad(keys, [&](uint32_t, const uint4& q) {
      const uint32_t x = counts(q);
      mine += (static_cast<unsigned long long>(x >> 16) << 32) | (x & 0xFFFFu);
    });
    cta_total = BlockSum64(s, mine);
  }
  unsigned long long lower = 0, row_total = cta_total;  // neither half overflows: both count one row
  if (cluster_size > 1) {
    if (tid == 0) s.emit_totals = cta_total;
    ClusterBarrier();
    if (tid < cluster_size) s.rank_totals[tid] = *AtRank(&s.emit_totals, tid);
    __syncthreads();
    row_total = 0;
#pragma unroll 1
    for (int r = 0; r < cluster_size; ++r) {
      const unsigned long long t = s.rank_totals[r];
      if (r < cluster_rank) lower += t;
      row_total += t;
    }
  }
  // min(.., topk): the threshold guarantees at most K winners; the clamp (and the slot guard in
  // emit) keep a logic error from ever writing past the row's K outputs or the sort buffer.
  const uint32_t selected =
      min(topk, static_cast<uint32_t>(row_total >> 32) + min(static_cast<uint32_t>(row_total), th.ties));

  int32_t* out = p.topk_indices + query_row * p.topk;
  unsigned long long* words = cluster_size > 1 ? AtRank(s.sorting.words, 0) : s.sorting.words;
  // Pass 2, chunk by chunk: the chunk's (tile, warp) counts and their prefix, then every winner's
  // slot = winners before it in the row (ties: only the first th.ties).
  uint32_t greater_carry = static_cast<uint32_t>(lower >> 32), equal_carry = static_cast<uint32_t>(lower);
  // Every key equal to T wins (the common case: T's copies are not split by K): a key's slot is
  // the count of keys >= T before it, so the tie counts need not be ranked key by key. The warp's
  // offsets come from four ballots per tile instead of a packed-count scan, and a quad's 4 keys
  // share one page lookup.
  const bool every_tie_wins = th.ties == UINT_MAX;
  const uint32_t lanes_below = (1u << lane) - 1u;
#pragma unroll 1
  for (uint32_t chunk = 0; chunk < tiles; chunk += kChunkTiles) {
    const uint32_t chunk_tiles = min(kChunkTiles, tiles - chunk);
    const uint32_t chunk_total = one_chunk ? first_chunk_total : chunk_table(chunk);
    if (every_tie_wins) {
#pragma unroll 1
      for (uint32_t t = 0; t < chunk_tiles; t += kBatchTiles) {
        uint4 q[kBatchTiles];
        LoadBatch(keys, chunk + t, q);
#pragma unroll
        for (uint32_t u = 0; u < kBatchTiles; ++u) {
          if (t + u >= chunk_tiles) break;  // empty quads past the chunk: nothing to emit
          const uint32_t pos = QuadPosition(chunk + t + u);
          const uint32_t quad[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
          bool wins[4];
          uint32_t slot = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            wins[i] = Wins(quad[i], th) || Ties(quad[i], th);
            slot += __popc(__ballot_sync(0xFFFFFFFFu, wins[i]) & lanes_below);
          }
          const uint32_t before = s.chunk_offsets[(t + u) * kSelectWarps + warp];
          slot += greater_carry + equal_carry + (before >> 16) + (before & 0xFFFFu);
          if (wins[0] || wins[1] || wins[2] || wins[3]) {  // (pos is inside the slice: its page exists)
            // The quad shares a page.
            const int32_t first_id =
                p.sorted ? 0 : (p.positions ? static_cast<int32_t>(begin + pos) : GlobalTokenId(pages, pos));
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (wins[i] && slot < topk) {
                if (!p.sorted) {
                  out[slot] = first_id + i;
                } else {
                  words[slot] = RankWord(quad[i], static_cast<uint32_t>(begin + pos + i));
                }
              }
              slot += wins[i];
            }
          }
        }
      }
    } else {
#pragma unroll 1
      for (uint32_t t = 0; t < chunk_tiles; t += kBatchTiles) {
        uint4 q[kBatchTiles];
        uint32_t x[kBatchTiles], incl[kBatchTiles];
        LoadBatch(keys, chunk + t, q);
#pragma unroll
        for (uint32_t u = 0; u < kBatchTiles; ++u) incl[u] = x[u] = counts(q[u]);
        // WarpInclusiveSum of each incl[u], interleaved over the batch
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
#pragma unroll
          for (uint32_t u = 0; u < kBatchTiles; ++u) {
            const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, incl[u], o);
            if (lane >= o) incl[u] += y;
          }
        }
#pragma unroll
        for (uint32_t u = 0; u < kBatchTiles; ++u) {
          if (t + u >= chunk_tiles) break;  // empty quads past the chunk: nothing to emit
          const uint32_t pos = QuadPosition(chunk + t + u);
          const uint32_t before = s.chunk_offsets[(t + u) * kSelectWarps + warp] + incl[u] - x[u];
          uint32_t greater = greater_carry + (before >> 16);  // winners above T before this key
          uint32_t equal = equal_carry + (before & 0xFFFFu);  // keys equal to T before this key
          const uint32_t quad[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t key = quad[i];
            const bool wins = Wins(key, th), ties = Ties(key, th);
            const uint32_t slot = wins ? greater + min(equal, th.ties) : greater + equal;
            if ((wins || (ties && equal < th.ties)) && slot < topk) {
              if (!p.sorted) {
                out[slot] = p.positions ? static_cast<int32_t>(begin + pos + i) : GlobalTokenId(pages, pos + i);
              } else {
                words[slot] = RankWord(key, static_cast<uint32_t>(begin + pos + i));
              }
            }
            greater += wins;
            equal += ties;
          }
        }
      }
    }
    greater_carry += chunk_total >> 16;
    equal_carry += chunk_total & 0xFFFFu;
    __syncthreads();  // chunk_offsets is rewritten by the next chunk
  }

  if (!p.sorted) {
#pragma unroll 1
    for (uint32_t i = selected + cluster_rank * kSelectThreads + tid; i < topk; i += cluster_size * kSelectThreads) {
      out[i] = -1;
    }
    if (cluster_size > 1) ClusterBarrier();  // the others may still read our emit totals
  } else {
    if (cluster_size > 1) ClusterBarrier();  // every CTA's winners are in rank 0's buffer
    if (cluster_rank == 0) {
      SortSelectedDescending(s.sorting, selected);
      const int32_t* row_table = p.block_table + row * p.max_pages;
#pragma unroll 1
      for (uint32_t i = tid; i < topk; i += kSelectThreads) {
        int32_t id = -1;
        if (i < selected) {
          const uint32_t t = RankWordPosition(s.sorting.words[i]);
          id = p.positions ? static_cast<int32_t>(t) : GlobalTokenId(row_table, t);
        }
        out[i] = id;
      }
    }
  }
}

// The split path's select as it was before the bin select (the default while the bin select is
// tuned: launch/tuning.h, bin_select): a cluster per query row of kSelectThreads CTAs, each
// staging its slice by one bulk copy and selecting it with SelectSlice.
__global__ void __launch_bounds__(kSelectThreads, 1) PassSelectRowsKernel(const SelectParams p) {
  extern __shared__ __align__(128) uint8_t select_smem_raw[];
  SelectSmem& smem = *reinterpret_cast<SelectSmem*>(select_smem_raw);
  uint32_t* staged_keys = reinterpret_cast<uint32_t*>(select_smem_raw + PassSelectStagedKeysOffset());
  auto& s = smem.select;
  const int cluster_size = static_cast<int>(cg::this_cluster().num_blocks());
  const int cluster_rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t query_row = blockIdx.x / cluster_size;
  // The block-table row (32-bit, and no division for one query: divisions sit on the path to the
  // first read).
  const int64_t row = p.qs.queries == 1 ? query_row
                                        : static_cast<uint32_t>(query_row) / static_cast<uint32_t>(p.qs.queries);
  const int query = static_cast<int>(static_cast<uint32_t>(query_row) - static_cast<uint32_t>(row) * p.qs.queries);
  const int tid = threadIdx.x;
  // The next call's first kernel may be placed on the SMs this grid leaves free (it waits for our
  // completion before reading anything), as soon as this CTA is done with the workspace: at once
  // with no workspace or for a row that needs no scores (then possibly while ScorePagesKernel still
  // runs: a successor waits before touching any memory the call uses), after staging, or at exit.
  if (p.let_next_in && p.keys == nullptr) AllowDependentLaunch();
  if (p.wait_before_inputs) WaitForPrecedingGrid();

  // Inputs: readable before ScorePagesKernel's end, since it let this grid launch only after its own
  // wait for the stream's previous kernel. This grid's own wait does not order these reads, so
  // they go to L2 (ld.global.cg), the point where the writer's stores became visible, never L1.
  const int64_t n = QueryLengthOf(__ldcg(QueryLengthEntry(p.seq_lens, row, query, p.qs)), query, p.qs, p.max_pages);
  if (!ScoresNeeded(n, p.topk, p.sorted)) {  // the same branch for every CTA of the cluster
    if (p.let_next_in) AllowDependentLaunch();  // this CTA reads no keys
    if (cluster_rank == 0) {
      WriteWholeRow<kSelectThreads>(p, query_row, row, n, smem.slice_pages, s.chunk_offsets, s.result_count, tid);
    }
    // ScorePagesKernel had nothing to do for this row, but this grid must not finish before it:
    // stream order promises later work both kernels' completion.
    WaitForPrecedingGrid();
    return;
  }
  // A row one CTA selects best alone is the first CTA's, whatever the cluster size.
  const bool alone = n <= kSliceKeys;
  if (alone && cluster_rank != 0) {
    if (p.let_next_in) AllowDependentLaunch();  // reads no keys; the first CTA waits for ScorePagesKernel
    return;
  }
  const int ctas = alone ? 1 : cluster_size, rank = alone ? 0 : cluster_rank;
  ResetClusterSelect(s);
  const int64_t slice = SliceLength(n, ctas);
  const int64_t begin = min(n, rank * slice);
  const uint32_t m = static_cast<uint32_t>(min(n, begin + slice) - begin);
  const bool staged = m <= p.staged_capacity;
  const uint32_t* slice_keys = p.keys + query_row * p.row_stride + begin;
  const int32_t* table = p.block_table + row * p.max_pages + begin / kPageTokens;
  if (staged) {
#pragma unroll 1
    for (uint32_t i = tid; i < (m + kPageTokens - 1) / kPageTokens; i += kSelectThreads) smem.slice_pages[i] = __ldcg(table + i);
    if (tid == 0) {
      MbarInit(&smem.keys_landed, 1);
      FenceBarrierInit();
    }
  }
  __syncthreads();  // the barrier's init, slice_pages and the histogram's reset
  WaitForPrecedingGrid();  // ScorePagesKernel's keys

  // Whole 16-byte units: up to 3 keys past the slice, inside the row's last page of the
  // workspace (ScorePagesKernel writes them as kNotCandidate; the passes mask them anyway).
  if (staged && m > 0 && tid == 0) {
    const uint32_t bytes = (m + 3) / 4 * 16;
    MbarArriveExpectTx(&smem.keys_landed, bytes);
    BulkLoad(staged_keys, slice_keys, bytes, &smem.keys_landed);
  }
  // This thread's share of the stats, read from L2 while the copy lands: the load latency hides
  // behind it. A row of at most K tokens is only sorted: no stats, no extra pass over its keys.
  SliceStats thread_stats = EmptyStats();
  if (ThresholdNeeded(n, p.topk)) {
    ForEachKey(KeySpan{nullptr, slice_keys, m}, [&](uint32_t key) { AddKey(thread_stats, key); });
  }
  SelectSlice(p, smem, query_row, row, n, begin, KeySpan{staged ? staged_keys : nullptr, slice_keys, m}, thread_stats,
              staged ? smem.slice_pages : table, staged && m > 0 ? &smem.keys_landed : nullptr, ctas, rank);
}

}  // namespace ffi_dsa::sm90
