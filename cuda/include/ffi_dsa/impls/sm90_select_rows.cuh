// Kernel 2 of the Hopper path: the exact top-K of every row from the rank keys kernel 1 left in
// the workspace (L2-resident right after it). One cluster of `cluster_size` CTAs per row
// (sm90_cluster_topk.cuh); CTA r of the cluster owns the r-th slice of the row (whole pages).
// A slice of up to kTileKeys keys is loaded once into registers (16 consecutive keys per thread,
// 16-byte loads); longer slices (rows of more than 8 x 8K tokens) are walked tile by tile from
// L2 on every pass. Launched with programmatic stream serialization: its CTAs are placed while
// kernel 1 runs, read their inputs (lengths, page ids) and then wait for kernel 1's keys.
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_cluster_topk.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct SelectParams {
  const uint32_t* keys;  // [B, row_stride], written by ScorePagesKernel for t < seq_len
  const int32_t* seq_lens;
  const int32_t* block_table;
  int32_t* topk_indices;
  int64_t row_stride;
  int32_t max_pages;
  int32_t topk;
  bool sorted;
};

// Keys per thread and threads: the select is a chain of short dependent steps, so it wants many
// warps (512 threads with keys re-read from shared memory measured 13.4 cycles per issued
// instruction) and keys in registers; 1024 threads x 16 keys spilled at the 64-register cap,
// 512 x 16 fits in 123 registers.
constexpr int kSelectThreads = 512;
constexpr int kKeysPerThread = 16;
constexpr int kTileKeys = kSelectThreads * kKeysPerThread;  // 8192
constexpr int kTilePages = kTileKeys / kPageTokens;
// Portable cluster size. 16 (H100's non-portable maximum) was measured slower on a 128K row
// (56 vs 50 us): barrier and DSMEM costs grow with the cluster more than the second tile costs.
constexpr int kMaxSelectCluster = 8;

struct SelectSmem {
  ClusterSelectStorage<kSelectThreads> select;
  int32_t slice_pages[kTilePages];  // page ids of a one-tile slice: emitting a winner is a smem lookup
};

// Slice length per CTA: whole pages, so slices start on a page (and 16-byte aligned).
__host__ __device__ inline int64_t SliceLength(int64_t n, int cluster_size) {
  const int64_t per_cta = (n + cluster_size - 1) / cluster_size;
  return (per_cta + kPageTokens - 1) / kPageTokens * kPageTokens;
}

// Keys [base, base + 16) of the slice into registers; 0 (not a candidate) past the slice's end.
__device__ __forceinline__ void LoadRun(const uint32_t* slice_keys, uint32_t base, uint32_t m,
                                        uint32_t (&k)[kKeysPerThread]) {
  if (base + kKeysPerThread <= m) {
#pragma unroll
    for (int v = 0; v < kKeysPerThread / 4; ++v) {
      const uint4 q = __ldcg(reinterpret_cast<const uint4*>(slice_keys + base) + v);  // L2 only: written by kernel 1
      k[4 * v] = q.x;
      k[4 * v + 1] = q.y;
      k[4 * v + 2] = q.z;
      k[4 * v + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) k[j] = base + j < m ? __ldcg(slice_keys + base + j) : kNotCandidate;
  }
}

__global__ void __launch_bounds__(kSelectThreads, 1) SelectRowsKernel(const SelectParams p) {
  extern __shared__ __align__(16) uint8_t select_smem_raw[];
  SelectSmem& smem = *reinterpret_cast<SelectSmem*>(select_smem_raw);
  auto& s = smem.select;
  const int cluster_size = static_cast<int>(cg::this_cluster().num_blocks());
  const int cluster_rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t row = blockIdx.x / cluster_size;
  const int tid = threadIdx.x;
  const uint32_t topk = static_cast<uint32_t>(p.topk);

  ResetClusterSelect<kSelectThreads>(s);
  const int64_t n = ClampedLength(p.seq_lens, row, p.max_pages);  // inputs: readable before the wait
  const int64_t slice = SliceLength(n, cluster_size);
  const int64_t begin = min(n, cluster_rank * slice);
  const uint32_t m = static_cast<uint32_t>(min(n, begin + slice) - begin);
  const uint32_t tiles = (m + kTileKeys - 1) / kTileKeys;
  const uint32_t* slice_keys = p.keys + row * p.row_stride + begin;
  const int32_t* table = p.block_table + row * p.max_pages + begin / kPageTokens;
  if (tiles == 1) {
    for (uint32_t i = tid; i < (m + kPageTokens - 1) / kPageTokens; i += kSelectThreads) smem.slice_pages[i] = table[i];
  }
  WaitForPrecedingGrid();  // kernel 1's keys

  uint32_t k[kKeysPerThread];
  const uint32_t run = tid * kKeysPerThread;  // this thread's first position inside a tile
  if (tiles == 1) LoadRun(slice_keys, run, m, k);
  // f(first position of the run, keys of the run) for each tile this thread owns a run of.
  // Longer slices reuse the same registers tile after tile.
  auto for_each_run = [&](auto&& f) {
    if (tiles == 1) {
      f(run, k);
    } else {
      for (uint32_t t = 0; t < tiles; ++t) {
        LoadRun(slice_keys, t * kTileKeys + run, m, k);
        f(t * kTileKeys + run, k);
      }
    }
  };
  auto for_each_key = [&](auto&& f) {
    for_each_run([&](uint32_t, const uint32_t(&keys)[kKeysPerThread]) {
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) f(keys[j]);
    });
  };

  Threshold th = kTakeAll;
  if (n > int64_t(topk)) {  // otherwise every valid token wins: no statistics needed
    SliceStats stats = EmptyStats();
    for_each_key([&](uint32_t key) { AccumulateStats(stats, key); });
    const SliceStats row_stats = RowStats<kSelectThreads>(s, stats, cluster_size);
    th = ClusterThreshold<kSelectThreads>(s, topk, row_stats, cluster_size, for_each_key);
  } else {
    __syncthreads();  // slice_pages complete
  }

  // ---- emit: winners by ascending position --------------------------------------------------
  using Scan = cub::BlockScan<unsigned long long, kSelectThreads>;
  auto counts = [&](const uint32_t(&keys)[kKeysPerThread]) {
    uint32_t greater = 0, equal = 0;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      greater += Wins(keys[j], th);
      equal += Ties(keys[j], th);
    }
    return (static_cast<unsigned long long>(greater) << 32) | equal;
  };
  // Pass 1 (a no-op re-read for one-tile slices): this CTA's totals, then the lower CTAs' totals.
  unsigned long long before_in_tile = 0, cta_total = 0;
  for_each_run([&](uint32_t, const uint32_t(&keys)[kKeysPerThread]) {
    unsigned long long tile_total;
    Scan(s.scan64).ExclusiveSum(counts(keys), before_in_tile, tile_total);
    __syncthreads();
    cta_total += tile_total;
  });
  unsigned long long lower = 0, row_total = cta_total;  // neither half overflows: both count one row
  if (cluster_size > 1) {
    if (tid == 0) s.emit_totals = cta_total;
    ClusterBarrier();
    row_total = 0;
    for (int r = 0; r < cluster_size; ++r) {
      const unsigned long long t = *AtRank(&s.emit_totals, r);
      if (r < cluster_rank) lower += t;
      row_total += t;
    }
  }
  // min(.., topk): the threshold guarantees at most K winners; the clamp (and the slot guard in
  // emit) keep a logic error from ever writing past the row's K outputs or the sort buffer.
  const uint32_t selected =
      min(topk, static_cast<uint32_t>(row_total >> 32) + min(static_cast<uint32_t>(row_total), th.ties));

  int32_t* out = p.topk_indices + row * p.topk;
  unsigned long long* words = cluster_size > 1 ? AtRank(s.sorting.words, 0) : s.sorting.words;
  auto token_id = [&](uint32_t i) {  // global id of the slice's i-th token (slices start on a page)
    return GlobalTokenId(tiles == 1 ? smem.slice_pages : table, i);
  };
  // Pass 2: every winner's slot = winners before it in the row (ties: only the first th.ties).
  unsigned long long carry = lower;
  for_each_run([&](uint32_t first, const uint32_t(&keys)[kKeysPerThread]) {
    unsigned long long before = before_in_tile, tile_total = 0;
    if (tiles != 1) {
      Scan(s.scan64).ExclusiveSum(counts(keys), before, tile_total);
      __syncthreads();
    }
    before += carry;
    carry += tile_total;
    uint32_t greater = static_cast<uint32_t>(before >> 32);  // winners above T before this key
    uint32_t equal = static_cast<uint32_t>(before);           // keys equal to T before this key
    auto emit = [&](uint32_t slot, uint32_t j, uint32_t key) {
      if (slot >= topk) return;
      if (!p.sorted) {
        out[slot] = token_id(first + j);
      } else {
        words[slot] = RankWord(key, static_cast<uint32_t>(begin + first + j));
      }
    };
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const uint32_t key = keys[j];
      if (Wins(key, th)) {
        emit(greater + min(equal, th.ties), j, key);
        ++greater;
      } else if (Ties(key, th)) {
        if (equal < th.ties) emit(greater + equal, j, key);
        ++equal;
      }
    }
  });

  if (!p.sorted) {
    for (uint32_t i = selected + cluster_rank * kSelectThreads + tid; i < topk; i += cluster_size * kSelectThreads) {
      out[i] = -1;
    }
    if (cluster_size > 1) ClusterBarrier();  // the others may still read our emit totals
  } else {
    if (cluster_size > 1) ClusterBarrier();  // every CTA's winners are in rank 0's buffer
    if (cluster_rank == 0) {
      SortSelectedDescending<kSelectThreads>(s.sorting, selected);
      const int32_t* row_table = p.block_table + row * p.max_pages;
      for (uint32_t i = tid; i < topk; i += kSelectThreads) {
        out[i] = i < selected ? GlobalTokenId(row_table, RankWordPosition(s.sorting.words[i])) : -1;
      }
    }
  }
}

}  // namespace ffi_dsa::sm90
