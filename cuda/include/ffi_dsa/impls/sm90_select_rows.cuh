// SelectRowsKernel, the second kernel of the split path: the exact top-K of every query row (query
// j of row b, b * N + j) from the rank keys ScorePagesKernel left in the workspace (L2-resident
// right after it: the pages streamed past them at evict-first priority, sm90_ptx.cuh). One cluster
// of `cluster_size` CTAs per query row; CTA r of the cluster owns the r-th slice of the query's
// prefix of the row (whole pages). Each thread copies its quads of the slice from L2 into shared
// memory and counts them into the slice's histogram on the way (sm90_bin_select.cuh: the bins need
// no range, so nothing waits for a stats pass); the select then reads shared memory only. Slices
// longer than `staged_capacity` (rows of more than 16 x 32K tokens) are binned the same way and
// read from L2 on every pass. A row of at most 8K keys on one CTA, unsorted, stages nothing: its
// keys stay in registers (sm90_select_small.cuh).
//
// 1024 threads at <= 64 registers: the select is a chain of short phases of a few instructions per
// key each, so it wants as many warps per scheduler as the SM holds (8), to issue while others wait.
// A launch of more single-CTA query rows than SMs instead takes CTAs of 512 threads, two an SM
// (kPairedSelectThreads): the same warps an SM, from two rows, so every row of a batch of up to
// 2 x SMs query rows (N = 4's) starts at once instead of in a second wave behind the first.
//
// Launched with programmatic stream serialization: its CTAs are placed while ScorePagesKernel runs,
// read their inputs (lengths, page ids) and then wait for its keys. Rows that need no scores (at
// most K tokens, position order) are written without keys; when no row needs scores this kernel
// runs alone (no workspace). A row of at most kSliceKeys tokens is the cluster's first CTA's alone
// (the others leave at once), so a cluster sized for the block table's width costs short rows no
// cluster work.
#pragma once
#include <cooperative_groups.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_bin_select.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/impls/sm90_select_params.cuh"
#include "ffi_dsa/impls/sm90_select_small.cuh"
#include "ffi_dsa/impls/sm90_warp.cuh"
#include "ffi_dsa/rank_key.h"
#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

// Keys one CTA selects alone; a longer row gets a cluster of ceil(n / kSliceKeys) CTAs. Not
// smaller slices: every cluster phase waits for the slowest CTA and pays a DSMEM round trip, which
// below ~8K keys per CTA costs more than the keys it splits.
constexpr int kSliceKeys = 8192;
static_assert(kSliceKeys <= topk::kSmallRowKeys, "a row on one CTA alone fits SelectSmallRow");
static_assert(kMaxSelectCluster <= topk::kMaxRanks, "the cluster exchanges");
// Keys one CTA stages in shared memory (128 KB): a 512K-token row over a cluster of 16.
constexpr uint32_t kMaxStagedKeys = 32768;
constexpr int kMaxStagedPages = kMaxStagedKeys / kPageTokens;

static_assert(kMaxStagedKeys % topk::Shape<kSelectRowsThreads>::kTileKeys == 0, "staged slices are whole tiles");

template <int kThreads>
struct SelectRowsSmem {
  topk::Storage<kThreads> select;
  int32_t slice_pages[kMaxStagedPages];  // page ids of a staged slice: emitting a winner is a smem lookup
  uint32_t page_offsets[32];             // WriteWholeRow
  uint32_t whole_row_count;
  uint32_t query_row;  // longest first: the query row of this CTA's rank
  // SelectSmallRow's winning members (1024-thread CTAs only: the paired ones keep the memory for keys)
  uint32_t win_bits[kThreads == kSelectRowsThreads ? topk::SmallShape<kThreads>::kBitWords : 1];
};
// Dynamic shared memory of a launch: SelectRowsSmem, the staged keys (whole tiles), then, for
// sorted output only, the sort storage (the cluster's first CTA's receives every winner): an
// unsorted launch leaves its 32 KB to the keys, or to a second CTA on the SM.
template <int kThreads>
__host__ __device__ constexpr size_t StagedKeysOffset() {
  return (sizeof(SelectRowsSmem<kThreads>) + 127) / 128 * 128;
}
template <int kThreads>
__host__ __device__ constexpr size_t SortStorageOffset(uint32_t staged_capacity) {
  return StagedKeysOffset<kThreads>() + size_t(staged_capacity) * sizeof(uint32_t);
}
template <int kThreads>
__host__ __device__ constexpr size_t SelectSmemBytes(uint32_t staged_capacity, bool sorted) {
  return SortStorageOffset<kThreads>(staged_capacity) + (sorted ? sizeof(topk::SortStorage<kThreads>) : 0);
}
// Staged keys the launch asks for: whole tiles, at most `limit` (itself whole tiles).
template <int kThreads>
__host__ __device__ constexpr uint32_t StagedCapacity(int64_t keys, uint32_t limit = kMaxStagedKeys) {
  const int64_t tile = topk::Shape<kThreads>::kTileKeys;
  const int64_t whole = (keys + tile - 1) / tile * tile;
  return static_cast<uint32_t>(whole < int64_t(limit) ? whole : int64_t(limit));
}

// Slice length per CTA: whole pages, so slices start on a page (and 16-byte aligned).
__host__ __device__ inline int64_t SliceLength(int64_t n, int cluster_size) {
  const int64_t per_cta = (n + cluster_size - 1) / cluster_size;
  return (per_cta + kPageTokens - 1) / kPageTokens * kPageTokens;
}
// The same for a row's length as the kernels read it (32-bit: a 64-bit division is a ~70-
// instruction call on every CTA's path to its first read).
__device__ __forceinline__ uint32_t SliceLength32(uint32_t n, uint32_t cluster_size) {
  const uint32_t per_cta = (n + cluster_size - 1) / cluster_size;
  return (per_cta + kPageTokens - 1) / kPageTokens * kPageTokens;
}

// The index of this CTA's cluster in the grid (a special register: no division by the size).
__device__ __forceinline__ uint32_t ClusterIndex() {
  uint32_t id;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(id));
  return id;
}
// The grid's clusters (the query rows of a SelectRowsKernel launch).
__device__ __forceinline__ uint32_t ClusterCount() {
  uint32_t n;
  asm("mov.u32 %0, %%nclusterid.x;" : "=r"(n));
  return n;
}

// The block-table row of a query row (32-bit, and no division for one query: divisions sit on the
// path to the first read).
__device__ __forceinline__ int64_t BlockRowOf(const SelectParams& p, int64_t query_row) {
  return p.qs.queries == 1 ? query_row : static_cast<uint32_t>(query_row) / static_cast<uint32_t>(p.qs.queries);
}
// The tokens a query row sees. Readable before ScorePagesKernel's end, since it let this grid
// launch only after its own wait for the stream's previous kernel. This grid's own wait does not
// order the read, so it goes to L2 (ld.global.cg), the point where the writer's stores became
// visible, never L1.
__device__ __forceinline__ int64_t SelectQueryLength(const SelectParams& p, int64_t query_row) {
  const int64_t row = BlockRowOf(p, query_row);
  const int query = static_cast<int>(static_cast<uint32_t>(query_row) - static_cast<uint32_t>(row) * p.qs.queries);
  return QueryLengthOf(__ldcg(QueryLengthEntry(p.seq_lens, row, query, p.qs)), query, p.qs, p.max_pages);
}

// Longest first (sm90_schedule.h): the query row whose length ranks this CTA's index among the
// launch's rows, longest first, the earlier row first among equal lengths. A row's (length, row)
// packs into one word, distinct for every row, so the ranks are a bijection: every row is exactly
// one CTA's. Each warp ranks its rows against every word, the lanes splitting the words. `words`:
// shared memory for kLongestFirstMaxRows words (the staged keys', before staging); `chosen`: a
// shared word. Waits first where the kernel's inputs may still be written (p.wait_before_inputs).
template <int kThreads>
__device__ __forceinline__ uint32_t LongestFirstQueryRow(const SelectParams& p, uint32_t* words, uint32_t& chosen) {
  static_assert(kThreads >= kLongestFirstMaxRows, "a word a thread");
  static_assert(topk::Shape<kThreads>::kTileKeys >= kLongestFirstMaxRows, "the words fit the staged keys' first tile");
  constexpr uint32_t kLengthBits = 23, kSlots = kLongestFirstMaxRows / 32;
  const uint32_t tid = threadIdx.x, lane = tid % 32, rows = ClusterCount(), rank = ClusterIndex();  // one CTA a row
  if (p.wait_before_inputs) WaitForPrecedingGrid();
  if (tid < kLongestFirstMaxRows) {
    uint32_t word = 0;  // no row: below every row's word
    if (tid < rows) {
      // Lengths past 2^23 - 1 tokens rank as equal: still one word a row, in row order.
      const uint32_t n = static_cast<uint32_t>(min(SelectQueryLength(p, tid), int64_t(1u << kLengthBits) - 1));
      word = n << 9 | (511u - tid);
    }
    words[tid] = word;
  }
  __syncthreads();
  uint32_t others[kSlots];
#pragma unroll
  for (uint32_t i = 0; i < kSlots; ++i) others[i] = words[lane + 32 * i];
#pragma unroll 1
  for (uint32_t r = tid / 32; r < rows; r += kThreads / 32) {
    const uint32_t mine = words[r];
    uint32_t longer = 0;
#pragma unroll
    for (uint32_t i = 0; i < kSlots; ++i) longer += others[i] > mine;
    if (__reduce_add_sync(0xFFFFFFFFu, longer) == rank && lane == 0) chosen = r;
  }
  __syncthreads();
  return chosen;
}

// A row that needs no scores (sm90_rows.cuh: ScoresNeeded), by one CTA of kThreads: every token on
// a valid page, in position order, then -1. At most K tokens, so at most 32 pages: one warp scans
// them. `query_row` names the output row, `row` the block-table row; `pages` and `offsets` are
// 32-entry shared buffers. kThreads threads run it, thread `tid` of them, meeting at kBarrier
// (topk::GroupSync: 0 the whole CTA).
static_assert(kMaxTopK <= 32 * kPageTokens, "one warp holds the pages of a row of <= K tokens");
template <int kThreads, int kBarrier = 0>
__device__ void WriteWholeRow(const SelectParams& p, int64_t query_row, int64_t row, int64_t n, int32_t* pages,
                              uint32_t* offsets, uint32_t& count, int tid) {
  const int lane = tid % 32;
  const int32_t* table = p.block_table + row * p.max_pages;
  const int npages = static_cast<int>((n + kPageTokens - 1) / kPageTokens);
  if (tid < 32) {
    int32_t page = lane < npages ? __ldcg(table + lane) : -1;  // L2: behind ScorePagesKernel, read before the wait
    if (page >= p.num_pages) page = -1;  // -1 (or any negative id): not a page, its tokens are not candidates
    const uint32_t tokens = page >= 0 ? static_cast<uint32_t>(min(int64_t(kPageTokens), n - int64_t(lane) * kPageTokens)) : 0u;
    const uint32_t incl = WarpInclusiveSum(tokens);
    offsets[lane] = incl - tokens;  // first output slot of the page's tokens
    pages[lane] = page;
    if (lane == 31) count = incl;
  }
  topk::GroupSync<kThreads, kBarrier>();
  int32_t* out = p.topk_indices + query_row * p.topk;
  const uint32_t total = count;
#pragma unroll 1
  for (int64_t t = tid; t < n; t += kThreads) {
    const int i = static_cast<int>(t / kPageTokens);
    const int32_t page = pages[i];
    if (page >= 0) out[offsets[i] + t % kPageTokens] = p.positions ? static_cast<int32_t>(t) : page * kPageTokens + t % kPageTokens;
  }
#pragma unroll 1
  for (uint32_t i = total + tid; i < static_cast<uint32_t>(p.topk); i += kThreads) out[i] = -1;
}

// Copies this thread's quads of the slice from L2 into `staged` (null: not staged) and counts them
// into the histogram. Keys past the slice's end (to whole tiles) are staged as kNotCandidate.
template <int kThreads>
__device__ __forceinline__ void StageAndCount(topk::Storage<kThreads>& s, uint32_t* global, uint32_t m,
                                              uint32_t* staged, int tid) {
  const topk::SliceKeys from{nullptr, global, m};
  topk::ForEachQuad<kThreads>(from, 0, topk::Tiles<kThreads>(from), tid, [&](uint32_t, uint32_t pos, const uint4& q) {
    if (staged != nullptr) *reinterpret_cast<uint4*>(staged + pos) = q;
    topk::CountQuad(s, q);
  });
}

// kThreads: kSelectRowsThreads or kPairedSelectThreads (the host's choice, sm90_schedule.h), at
// most 64 registers either way: the SM's 64K registers hold 1024 threads. kLongestFirst: one CTA a
// query row, CTA c selecting the row of the c-th longest length (LongestFirstQueryRow); a kernel
// of its own, so that the others' code stays as it was.
template <int kThreads, bool kLongestFirst = false>
__global__ void __launch_bounds__(kThreads, kSelectRowsThreads / kThreads) SelectRowsKernel(const SelectParams p) {
  static_assert(kThreads == kSelectRowsThreads || kThreads == kPairedSelectThreads, "the two CTA sizes");
  static_assert(!kLongestFirst || kThreads == kSelectRowsThreads, "longest first: rows two waves deep, 1024 threads");
  extern __shared__ __align__(128) uint8_t select_smem_raw[];
  auto& smem = *reinterpret_cast<SelectRowsSmem<kThreads>*>(select_smem_raw);
  uint32_t* staged_keys = reinterpret_cast<uint32_t*>(select_smem_raw + StagedKeysOffset<kThreads>());
  auto& s = smem.select;
  const int cluster_size = static_cast<int>(cooperative_groups::this_cluster().num_blocks());
  const int cluster_rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  // Longest first: the row of this CTA's rank (which waits for the inputs first where it must).
  const int64_t query_row =
      kLongestFirst ? LongestFirstQueryRow<kThreads>(p, staged_keys, smem.query_row) : ClusterIndex();
  const int64_t row = BlockRowOf(p, query_row);
  const int tid = threadIdx.x;
  // The next call's first kernel may be placed on the SMs this grid leaves free (it waits for our
  // completion before reading anything), as soon as this CTA is done with the workspace: at once
  // with no workspace or for a row that needs no scores, after staging, or at exit.
  if (p.let_next_in && p.keys == nullptr) AllowDependentLaunch();
  if (p.wait_before_inputs) WaitForPrecedingGrid();

  const int64_t n = SelectQueryLength(p, query_row);
  if (!ScoresNeeded(n, p.topk, p.sorted)) {  // the same branch for every CTA of the cluster
    if (p.let_next_in) AllowDependentLaunch();  // this CTA reads no keys
    if (cluster_rank == 0) {
      WriteWholeRow<kThreads>(p, query_row, row, n, smem.slice_pages, smem.page_offsets, smem.whole_row_count, tid);
    }
    // ScorePagesKernel had nothing to do for this row, but this grid must not finish before it:
    // stream order promises later work both kernels' completion.
    WaitForPrecedingGrid();
    return;
  }
  const bool alone = n <= kSliceKeys;
  if (alone && cluster_rank != 0) {
    if (p.let_next_in) AllowDependentLaunch();  // reads no keys; the first CTA waits for ScorePagesKernel
    return;
  }
  const int ctas = alone ? 1 : cluster_size, rank = alone ? 0 : cluster_rank;
  topk::Reset(s, tid);
  const uint32_t length = static_cast<uint32_t>(n);
  const uint32_t slice = SliceLength32(length, static_cast<uint32_t>(ctas));
  const uint32_t begin = min(length, static_cast<uint32_t>(rank) * slice);
  const uint32_t m = min(length, begin + slice) - begin;
  const bool staged = m <= p.staged_capacity;
  uint32_t* slice_keys = p.keys + query_row * p.row_stride + begin;
  const int32_t* table = p.block_table + row * p.max_pages + begin / kPageTokens;
  if (staged) {
#pragma unroll 1
    for (uint32_t i = tid; i < (m + kPageTokens - 1) / kPageTokens; i += kThreads) {
      smem.slice_pages[i] = __ldcg(table + i);
    }
  }
  // One CTA of 1024 threads, unsorted, at most kSmallRowKeys keys: the select from registers.
  const bool small = kThreads == kSelectRowsThreads && ctas == 1 && m <= topk::kSmallRowKeys && !p.sorted &&
                     !p.stop_after_staging;
  if (small) {
#pragma unroll 1
    for (uint32_t i = tid; i < topk::SmallShape<kThreads>::kBitWords; i += kThreads) smem.win_bits[i] = 0;
  }
  const bool stamped = p.stamps != nullptr;
  if (stamped && tid == 0) s.stamps = StampSlot(p.stamps, int64_t(cluster_rank) * ClusterCount() + query_row);
  __syncthreads();  // the histogram's reset, slice_pages, win_bits
  WaitForPrecedingGrid();  // ScorePagesKernel's keys
  if (stamped && tid == 0) StampStart(s.stamps);
  // Built where they are used: held across the staging pass, they cost the 512-thread select spills.
  auto sort_storage = [&]() {
    return p.sorted ? reinterpret_cast<topk::SortStorage<kThreads>*>(select_smem_raw +
                                                                     SortStorageOffset<kThreads>(p.staged_capacity))
                    : nullptr;
  };
  auto row_output = [&]() {
    auto* sorting = sort_storage();
    topk::RowOutput o;
    o.out = p.topk_indices + query_row * p.topk;
    o.pages = staged ? smem.slice_pages : table;
    o.row_table = p.block_table + row * p.max_pages;
    o.words = sorting == nullptr ? nullptr : ctas > 1 ? topk::AtRank(sorting->words, 0) : sorting->words;
    o.begin = begin;
    o.positions = p.positions;
    o.sorted = p.sorted;
    return o;
  };
  if constexpr (kThreads == kSelectRowsThreads) {
    if (small) {
      topk::SelectSmallRow<kThreads>(s, smem.win_bits, slice_keys, m, row_output(),
                                     static_cast<uint32_t>(p.topk), p.let_next_in, stamped, tid);
      return;
    }
  }

  StageAndCount<kThreads>(s, slice_keys, m, staged ? staged_keys : nullptr, tid);
  __syncthreads();
  if (stamped && tid == 0) StampAt(s.stamps, kStampBinnedCycles);
  // A staged slice's workspace reads are behind us; a slice read from L2 lets the next kernel in
  // only by exiting.
  if (p.let_next_in && staged) AllowDependentLaunch();
  if (p.stop_after_staging) return;  // no cluster barrier passed yet: every CTA leaves alike

  const topk::SliceKeys keys{staged ? staged_keys : nullptr, slice_keys, m};
  topk::SelectRow<kThreads, 0>(s, sort_storage(), keys, row_output(), static_cast<uint32_t>(p.topk), ctas, rank, stamped, tid);
}

}  // namespace ffi_dsa::sm90
