// FusedRowsKernel, the fused path for big batches of short rows (B >= kFusedMinSmShare x SMs, and
// N x the table's width <= kFusedMaxRowKeys keys, which fit the CTA's shared memory: the
// large-batch decode step): one CTA per row scores the whole row straight into shared memory and
// selects it from there (sm90_bin_select.cuh, on the page ring's memory). Against the split path
// (ScorePagesKernel scores everything into a workspace, then SelectRowsKernel selects) it saves a
// launch, the workspace round trip through L2, and the wait for the whole scoring grid before any
// select starts: a CTA whose row is done selects while the others still stream. With this many
// rows every SM streams anyway, so a single CTA per row costs no bandwidth (sm90_schedule.h:
// kFusedMinSmShare). Small batches keep the split path: a cluster of CTAs per row here would stream
// each row on its cluster's SMs only and select it over short slices, whose cluster barriers and
// DSMEM reads cost more than the launch this path saves. Example on 132 SMs: 128 rows of 8K tokens
// take 128 CTAs of 128 pages and 8K keys each; 8 rows of 64K (too wide anyway) or 16 rows of 8K
// take the split path.
//
// With N queries per row (docs/contract.md §7) the CTA scores each page for every query that sees
// it and keeps N rows of keys; the N selects then run side by side, each on its own group of
// 512 / N threads (rounded down to a warpgroup) with a named barrier of its own, so that one
// query's barrier waits and single-warp phases overlap the others' work. Sorted output selects the
// queries one after the other on all 512 threads (the block sort synchronizes the whole CTA).
//
// Roles (512 threads): four math warpgroups, each its own producer. Page i of the row goes to
// warpgroup i % 4 and stage i % kFusedStages; the warpgroup's first thread issues the page's TMA
// kFusedStages pages ahead, once its own 128 threads have released the stage (empty mbarrier). No
// producer warpgroup: the select that follows wants all 512 threads, and one issuing thread per
// warpgroup keeps the SM's TMA unit busy (with two or more issuers the TMA unit, not the issuing,
// bounds the page rate).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_bin_select.cuh"
#include "ffi_dsa/impls/sm90_page_epilogue.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/impls/sm90_score_pages.cuh"
#include "ffi_dsa/impls/sm90_select_params.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct FusedParams {
  const uint8_t* k_cache;
  const float* weights;   // [B * N, H]
  uint32_t key_stride;    // keys of one query in shared memory: FusedKeyStride of the table's width
  SelectParams select;    // keys and staged_capacity unused: the row's keys never leave shared memory
};

// Every thread scores, then selects.
constexpr int kFusedThreads = kMathWarpgroups * kWarpgroupThreads;
// Two stages per warpgroup: one page computed while the next is in flight.
constexpr int kFusedStages = 2 * kMathWarpgroups;
// Most keys a CTA scores and stages, over its row's N queries (64 KB).
constexpr uint32_t kFusedMaxRowKeys = 16384;
constexpr int kFusedMaxRowPages = kFusedMaxRowKeys / kPageTokens;
// Head weights held in registers (RowWeights): 512 threads may use 128 registers each.
constexpr int kFusedHeldWeights = 128;

// The side-by-side selects: a group of threads per query (N = 3 leaves the fourth group idle).
template <int kQueries>
constexpr int kFusedSelectGroups = kQueries == 1 ? 1 : (kQueries == 2 ? 2 : 4);
template <int kQueries>
constexpr int kFusedGroupThreads = kFusedThreads / kFusedSelectGroups<kQueries>;
static_assert(kMaxQueries <= 4 && kFusedThreads / 4 == kWarpgroupThreads, "a group is at least a warpgroup");

// A query's keys in shared memory start on a whole tile of the widest select group: the select
// reads whole tiles, and a query's last tile must not reach into the next query's keys.
constexpr uint32_t kFusedKeyAlign = topk::Shape<kFusedThreads>::kTileKeys;
__host__ __device__ constexpr uint32_t FusedKeyStride(uint32_t table_tokens) {
  return (table_tokens + kFusedKeyAlign - 1) / kFusedKeyAlign * kFusedKeyAlign;
}

template <int kHeads, int kQueries>
struct alignas(1024) FusedRing {
  uint8_t k_tiles[kFusedStages][kPageFp8Bytes];  // each 1024-aligned: TMA swizzle-128B atoms
  uint8_t q_tiles[kQueries * kQTileBytes<kHeads>];  // query j at j x kHeads rows (whole swizzle atoms)
  float scales[kFusedStages][kPageTokens];
  uint64_t full[kFusedStages];
  uint64_t empty[kFusedStages];
  uint64_t q_full;
};
// The select's storage, on the page ring's memory once the last page is scored.
template <int kQueries>
union FusedSelect {
  struct {
    topk::Storage<kFusedThreads> storage;
    topk::SortStorage<kFusedThreads> sort;
  } serial;  // one query at a time on every thread (N = 1, or sorted output)
  topk::Storage<kFusedGroupThreads<kQueries>> groups[kFusedSelectGroups<kQueries>];  // side by side
};
// Each query's histogram, beside the ring: the page loop counts each key as it stores it, so that
// a select starts from a whole histogram instead of a pass over its keys. Only the bins, two to a
// word: the rest of a select's storage is needed after the loop alone and takes the ring's memory
// (FusedSelect).
template <int kQueries>
struct LoopBins {
  alignas(16) uint32_t pairs[kQueries][topk::kPairedBinWords];
};
// FusedFits keeps a row's N queries within kFusedMaxRowKeys keys, so a bin's count fits its half.
static_assert(kFusedMaxRowKeys <= 0xFFFFu, "a query's keys fit a paired bin's 16-bit count");
// WriteWholeRow's buffers for one query: a query's own, so that the unscored rows need not wait
// for the selects that read the row's page ids.
struct WholeRowScratch {
  int32_t pages[32];
  uint32_t offsets[32];
  uint32_t count;
};
template <int kHeads, int kQueries>
struct FusedSmem {
  union {
    FusedRing<kHeads, kQueries> ring;
    FusedSelect<kQueries> select;
  };
  int32_t row_pages[kFusedMaxRowPages];  // the row's page ids (-1: invalid)
  // The queries' lengths, for the tail: a read of seq_lens there would put an L2 round trip before
  // the first select and another before the unscored rows, on the row's critical path.
  int32_t query_lengths[kMaxQueries];
  WholeRowScratch whole_rows[kQueries];
  LoopBins<kQueries> loop_bins;
};
// Dynamic shared memory: FusedSmem, then kQueries x FusedKeyStride(table tokens) keys.
template <int kHeads, int kQueries>
__host__ __device__ constexpr size_t FusedKeysOffset() { return (sizeof(FusedSmem<kHeads, kQueries>) + 127) / 128 * 128; }
template <int kHeads, int kQueries>
__host__ __device__ constexpr size_t FusedSmemBytes(uint32_t table_tokens) {
  return 1024 /* alignment slack */ + FusedKeysOffset<kHeads, kQueries>() +
         size_t(kQueries) * FusedKeyStride(table_tokens) * sizeof(uint32_t);
}

// A row none of whose queries needs scores: each query's tokens in position order (WriteWholeRow),
// by the whole CTA.
template <int kHeads, int kQueries>
__device__ __forceinline__ void WriteUnscoredRow(const SelectParams& p, int64_t row, FusedSmem<kHeads, kQueries>& smem) {
#pragma unroll 1
  for (int j = 0; j < kQueries; ++j) {
    WholeRowScratch& w = smem.whole_rows[j];
    WriteWholeRow<kFusedThreads>(p, row * kQueries + j, row, QueryLength(p.seq_lens, row, j, p.qs, p.max_pages),
                                 w.pages, w.offsets, w.count, threadIdx.x);
  }
}

// One query's select on a group of kThreads threads (thread `tid` of the group, barrier kBarrier):
// its keys in shared memory, written by the page loop up to the length rounded up to a quad
// (kNotCandidate past the length) and counted by it into `bins` (its LoopBins), are padded with
// kNotCandidate to whole tiles and selected. Sorted output needs kBarrier 0 and `sort`
// (topk::SelectRow).
template <int kThreads, int kBarrier>
__device__ __forceinline__ void SelectQuery(topk::Storage<kThreads>& s, topk::SortStorage<kThreads>* sort,
                                            uint32_t* keys, const uint32_t* bins, int32_t length,
                                            const topk::RowOutput& o, uint32_t topk, unsigned long long* stamps,
                                            int tid) {
  const topk::SliceKeys slice{keys, nullptr, static_cast<uint32_t>(length)};
  const uint32_t tiles = topk::Tiles<kThreads>(slice);
  const uint32_t written = (static_cast<uint32_t>(length) + 3) / 4 * 4;
  topk::ResetFromPairedBins(s, bins, tid);
#pragma unroll 1
  for (uint32_t i = written + tid; i < tiles * topk::Shape<kThreads>::kTileKeys; i += kThreads) {
    keys[i] = kNotCandidate;
  }
  topk::GroupSync<kThreads, kBarrier>();  // the bins, the pad
  const bool stamped = stamps != nullptr;
  if (stamped && tid == 0) {
    s.stamps = stamps;
    StampAt(stamps, kStampBinnedCycles);
  }
  topk::SelectRow<kThreads, kBarrier>(s, sort, slice, o, topk, /*ranks=*/1, /*rank=*/0, stamped, tid);
}

// The row's queries after its last page: each query that needs scores selected from row_keys
// (query j at j x key_stride), each that needs none written in position order (WriteWholeRow, into
// buffers of its own), by the whole CTA one query after the other or side by side by the query's
// group. The queries' lengths come from shared memory (the page loop's registers are all taken).
// Ends with a barrier.
template <int kHeads, int kQueries>
__device__ __forceinline__ void SelectRowQueries(const FusedParams& fp, FusedSmem<kHeads, kQueries>& smem,
                                                 uint32_t* row_keys, int64_t row) {
  const SelectParams& p = fp.select;
  const int tid = threadIdx.x;
  auto length = [&](int j) { return smem.query_lengths[j]; };
  const uint32_t topk = static_cast<uint32_t>(p.topk);
  auto output = [&](int j, unsigned long long* words) {
    topk::RowOutput o;
    o.out = p.topk_indices + (row * kQueries + j) * p.topk;
    o.pages = smem.row_pages;
    o.row_table = p.block_table + row * p.max_pages;
    o.words = words;
    o.begin = 0;
    o.positions = p.positions;
    o.sorted = p.sorted;
    return o;
  };
  FusedSelect<kQueries>& sel = smem.select;
  if (kQueries == 1 || p.sorted) {
    bool first = true;
#pragma unroll 1
    for (int j = 0; j < kQueries; ++j) {
      const int32_t n = length(j);
      if (!ScoresNeeded(n, p.topk, p.sorted)) {
        WholeRowScratch& w = smem.whole_rows[j];
        WriteWholeRow<kFusedThreads>(p, row * kQueries + j, row, n, w.pages, w.offsets, w.count, tid);
        continue;
      }
      if (!first) __syncthreads();  // the previous select's reads of the storage are done
      first = false;
      SelectQuery<kFusedThreads, 0>(sel.serial.storage, &sel.serial.sort, row_keys + j * fp.key_stride,
                                    smem.loop_bins.pairs[j], n, output(j, sel.serial.sort.words), topk,
                                    StampSlot(p.stamps, row * kQueries + j), tid);
    }
  } else {
    constexpr int kGroupThreads = kFusedGroupThreads<kQueries>;
    const int group = tid / kGroupThreads;
    ForEachGroup<kFusedSelectGroups<kQueries>>([&](auto g) {
      constexpr int j = decltype(g)::value;
      if constexpr (j < kQueries) {
        if (group == j) {
          const int32_t n = length(j);
          if (ScoresNeeded(n, p.topk, p.sorted)) {
            SelectQuery<kGroupThreads, 1 + j>(sel.groups[j], nullptr, row_keys + j * fp.key_stride,
                                              smem.loop_bins.pairs[j], n, output(j, nullptr), topk,
                                              StampSlot(p.stamps, row * kQueries + j), tid % kGroupThreads);
          } else {
            // In the group, not after the CTA's barrier: the groups pass different numbers of
            // their own barriers, and compute-sanitizer's racecheck then takes shared memory
            // written before a CTA barrier and read after it for a race.
            WholeRowScratch& w = smem.whole_rows[j];
            WriteWholeRow<kGroupThreads, 1 + j>(p, row * kQueries + j, row, n, w.pages, w.offsets, w.count,
                                                tid % kGroupThreads);
          }
        }
      }
    });
  }
  __syncthreads();
}

extern __shared__ uint8_t fused_smem_raw[];

// Everything after the last page: the selects and the rows that need no scores. Not inlined: the
// page loop uses every register the launch allows, and the select's code inlined beside it made
// ptxas spill inside the loop; this way nothing of the tail is live there. The shared memory is
// found from the kernel's own symbol (shared-memory accesses, not generic ones) and the parameters
// are read in place (__grid_constant__).
template <int kHeads, int kQueries>
__device__ __noinline__ void FusedTail(const FusedParams& fp) {
  uint8_t* base = AlignedSmem<1024>(fused_smem_raw);
  FusedSmem<kHeads, kQueries>& smem = *reinterpret_cast<FusedSmem<kHeads, kQueries>*>(base);
  uint32_t* row_keys = reinterpret_cast<uint32_t*>(base + FusedKeysOffset<kHeads, kQueries>());
  const int64_t row = blockIdx.x;
  SelectRowQueries(fp, smem, row_keys, row);
}

template <int kHeads, int kQueries>
__global__ void __launch_bounds__(kFusedThreads, 1)
    FusedRowsKernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap q_map,
                    const __grid_constant__ FusedParams fp) {
  uint8_t* base = AlignedSmem<1024>(fused_smem_raw);
  FusedSmem<kHeads, kQueries>& smem = *reinterpret_cast<FusedSmem<kHeads, kQueries>*>(base);
  FusedRing<kHeads, kQueries>& ring = smem.ring;
  const SelectParams& p = fp.select;
  constexpr int queries = kQueries;  // p.qs.queries
  uint8_t* q_tiles = ring.q_tiles;
  uint32_t* row_keys = reinterpret_cast<uint32_t*>(base + FusedKeysOffset<kHeads, kQueries>());
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  // Programmatic dependent launch both ways (sm90_score_pages.cuh): the next call's first kernel may
  // be placed as our CTAs leave (no workspace here); ours may be placed while the stream's previous
  // kernel ends.
  if (p.let_next_in) AllowDependentLaunch();
  WaitForPrecedingGrid();
  if (p.stamps != nullptr && tid == 0) {  // the row's pages start now (the previous grid is done)
#pragma unroll 1
    for (int j = 0; j < kQueries; ++j) StampScore(StampSlot(p.stamps, row * kQueries + j));
  }

  // Each query's length, and where its keys end (its length rounded up to a quad: the select reads
  // whole quads; 0 for a query that needs no scores).
  int32_t length[kQueries], written[kQueries];
  uint32_t scored = 0;  // the queries that need scores (and a select)
  int pages = 0;
#pragma unroll
  for (int j = 0; j < kQueries; ++j) {
    length[j] = QueryLength(p.seq_lens, row, j, p.qs, p.max_pages);
    const bool needed = ScoresNeeded(length[j], p.topk, p.sorted);
    scored |= uint32_t(needed) << j;
    written[j] = needed ? static_cast<int32_t>((int64_t(length[j]) + 3) / 4 * 4) : 0;
    pages = max(pages, (written[j] + kPageTokens - 1) / kPageTokens);  // <= key_stride / 64 (host: table width)
  }
  if (scored == 0) {
    WriteUnscoredRow(p, row, smem);
    return;
  }
  const int32_t* table = p.block_table + row * p.max_pages;
  int32_t* row_pages = smem.row_pages;
  // The warp's index and the page count read through a shuffle: ptxas then knows they are
  // warp-uniform, and keeps the page loop's counter, stage, phase, barrier addresses and
  // descriptors in uniform registers (sm90_score_pages.cuh). The shuffles change no value.
  const uint32_t cta_warp = WarpUniform(static_cast<uint32_t>(tid) / 32);
  const uint32_t wg = cta_warp / 4;
  const uint32_t row_pages_count = WarpUniform(static_cast<uint32_t>(pages));
  const bool issuer = tid % kWarpgroupThreads == 0;
  if (tid == 0) {
#pragma unroll
    for (int j = 0; j < kQueries; ++j) smem.query_lengths[j] = length[j];
    for (int st = 0; st < kFusedStages; ++st) {
      MbarInit(&ring.full[st], 1);
      MbarInit(&ring.empty[st], kWarpgroupThreads);
    }
    MbarInit(&ring.q_full, 1);
    FenceBarrierInit();
    if (pages > 0) {
      if (p.num_pages > 0) PrefetchTensorMap(&k_map);  // with no pages the map is left unencoded
      MbarArriveExpectTx(&ring.q_full, queries * kQTileBytes<kHeads>);
      TmaLoad2d(q_tiles, &q_map, 0, static_cast<int32_t>(row * queries * kHeads), &ring.q_full);
    }
  }
  for (int i = tid; i < pages; i += kFusedThreads) {
    const int32_t page = table[i];
    row_pages[i] = page >= 0 && page < p.num_pages ? page : -1;  // -1: not a page, its tokens are not candidates
  }
  {
    uint4* bins = reinterpret_cast<uint4*>(smem.loop_bins.pairs);
#pragma unroll
    for (int i = tid; i < kQueries * topk::kPairedBinWords / 4; i += kFusedThreads) bins[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();  // barrier init, row_pages, query_lengths, the loop's bins

  auto issue = [&](int i) {
    const int st = i % kFusedStages;
    const int32_t page = row_pages[i];
    if (page >= 0) {
      MbarArriveExpectTx(&ring.full[st], kPageFp8Bytes + kScaleBytes);
      const uint64_t streamed = EvictFirstPolicy();  // the pages: read once (sm90_ptx.cuh)
      TmaLoad3d(ring.k_tiles[st], &k_map, 0, 0, page, &ring.full[st], streamed);
      BulkLoad(ring.scales[st], fp.k_cache + int64_t(page) * kPageBytes + kPageFp8Bytes, kScaleBytes, &ring.full[st],
               streamed);
    } else {
      MbarArrive(&ring.full[st]);  // nothing to load: the consumers see the invalid id themselves
    }
  };
  if (issuer) {
    for (int i = static_cast<int>(wg); i < pages && i < kFusedStages; i += kMathWarpgroups) issue(i);
  }
  __syncwarp();

  // ---- score the row's queries into shared memory -------------------------------------------
  using Groups = PageGroups<kHeads, kQueries>;
  const int warp = static_cast<int>(cta_warp % 4), lane = tid % 32;
  // wgmma m64nN accumulator rows r0 and r0 + 8; after the quad reduction a lane's scores are of
  // token r0 + 8 * (lane & 1).
  const int r0 = 16 * warp + lane / 4;
  const int token = r0 + 8 * (lane & 1);
  // This lane's slots (sm90_page_epilogue.cuh), where its groups' keys end, and its keys at this
  // lane's token of page 0.
  LaneSlots<kHeads, kQueries> slots;
  slots.Set(length, written, lane, token);
  int32_t group_end[Groups::kCount];
  GroupEnds<kHeads, kQueries>(written, group_end);
#pragma unroll
  for (int g = 0; g < Groups::kCount; ++g) group_end[g] = WarpUniform(group_end[g]);
  uint32_t* slot_keys[Groups::kSlots];
  uint32_t* slot_bins[Groups::kSlots];  // the histogram of the slot's query
#pragma unroll
  for (int x = 0; x < Groups::kSlots; ++x) {
    slot_keys[x] = row_keys + slots.query[x] * fp.key_stride + token;
    slot_bins[x] = smem.loop_bins.pairs[slots.query[x]];
  }
  RowWeights<kHeads, kQueries, kFusedHeldWeights> weights;
  if (wg < row_pages_count) {
    weights.Load(fp.weights + row * queries * kHeads, lane);
    MbarWait(&ring.q_full, 0);
  }
  // Descriptors of Q and of the first stage; the other stages lie at fixed offsets (DescAdvance).
  // Through WarpUniform, which ptxas cannot recompute: it keeps them in uniform registers instead
  // of rebuilding them from the shared window's base on every page.
  const uint32_t desc_q = WarpUniform(SmemDescLow(q_tiles)), desc_k0 = WarpUniform(SmemDescLow(ring.k_tiles[0]));
  // Page i of the row, in stage st (loaded in phase `phase`).
  auto score_page = [&](uint32_t i, uint32_t st, uint32_t phase) {
    MbarWait(&ring.full[st], phase);
    // Read now, used only after the products: no branch on it (an invalid page's stage holds
    // stale bytes; its keys are kNotCandidate).
    const bool valid = row_pages[i] >= 0;
    const int32_t page_t0 = static_cast<int32_t>(i) * kPageTokens;
    auto release = [&] {
      MbarArrive(&ring.empty[st]);  // this thread no longer reads the stage
      // The warpgroup's first warp refills the stage (a uniform branch: the other warps skip it
      // whole); its first lane waits for every thread's release and issues the load.
      if (warp == 0 && i + kFusedStages < row_pages_count) {
        if (issuer) {
          MbarWait(&ring.empty[st], phase);
          issue(static_cast<int>(i) + kFusedStages);
        }
        __syncwarp();  // converged again for the shuffles below and the next wgmma (.aligned)
      }
    };
    const uint32_t desc_k = DescAdvance(desc_k0, st * kPageFp8Bytes);
    ForEachGroup<Groups::kCount>([&](auto group) {
      constexpr int g = decltype(group)::value;
      constexpr bool kLast = g == Groups::kCount - 1;  // the stage is released after its products
      // With one group, the row's longest query (the loop's end) sees every page; with more, a
      // group whose queries all end before this page skips its products (uniform).
      if (Groups::kCount > 1 && page_t0 >= group_end[g]) {
        if (kLast) release();
        return;
      }
      uint32_t keys[Groups::Slots(g)];
      ScoreGroup<kHeads, kQueries, g>(desc_k, desc_q, ring.scales[st], r0, lane, weights, [&] {
        if (kLast) release();
      }, keys);
      // Every key the select reads is written, nothing past it.
#pragma unroll
      for (int x = 0; x < Groups::Slots(g); ++x) {
        const int slot = Groups::FirstSlot(g) + x;
        const uint32_t key = valid && page_t0 < slots.key_end[slot] ? keys[x] : kNotCandidate;
        if (page_t0 < slots.store_end[slot]) {
          slot_keys[slot][page_t0] = key;
          topk::CountKeyPaired(slot_bins[slot], key);  // one owner a key
        }
      }
    });
  };
  // Page 8t + wg uses stage wg and page 8t + wg + 4 stage wg + 4, both in phase t & 1: walking
  // turn t's pair, each page's stage is known up to the warpgroup (no stage arithmetic).
  static_assert(kFusedStages == 2 * kMathWarpgroups, "a warpgroup's pages alternate between two stages");
  for (uint32_t i = wg; i < row_pages_count; i += kFusedStages) {
    const uint32_t phase = (i / kFusedStages) & 1;
    score_page(i, wg, phase);
    if (i + kMathWarpgroups < row_pages_count) score_page(i + kMathWarpgroups, wg + kMathWarpgroups, phase);
  }
  __syncthreads();  // the row's keys are in shared memory, the ring is idle
  if (p.stamps != nullptr && tid == 0) {  // every select of the row may start now (from shared memory:
#pragma unroll                             // nothing of it stays live through the page loop)
    for (int j = 0; j < kQueries; ++j) {
      if (ScoresNeeded(smem.query_lengths[j], p.topk, p.sorted)) StampStart(StampSlot(p.stamps, row * kQueries + j));
    }
  }
  // The select's storage takes the ring's memory: its mbarriers are retired first.
  if (tid < kFusedStages) {
    MbarInval(&ring.full[tid]);
    MbarInval(&ring.empty[tid]);
  }
  if (tid == 0) MbarInval(&ring.q_full);
  __syncthreads();
  FusedTail<kHeads, kQueries>(fp);
}

}  // namespace ffi_dsa::sm90
