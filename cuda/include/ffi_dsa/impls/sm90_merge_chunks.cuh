// Kernel 2 of the Hopper path: rows that span several chunks get their final top-K here, from
// the chunks' winners (each chunk's list is in position order, and chunks are position ranges,
// so the concatenation is ordered by position). One CTA per row. The candidates' keys are
// copied once from the workspace (L2-resident right after kernel 1) into shared memory with
// many loads in flight; every radix pass then runs on shared memory. Positions are read from
// the workspace only for the K winners.
#pragma once
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_block_select.cuh"
#include "ffi_dsa/impls/sm90_score_chunk.cuh"

namespace ffi_dsa::sm90 {

constexpr int kMergeThreads = 512;
constexpr int kMergeSmemKeys = 28 * 1024;  // the schedule keeps rows up to ~210K tokens within this

struct MergeSmem {
  SelectStorage<kMergeThreads> select;
  SortStorage<kMergeThreads> sorting;
  uint32_t winners[kMaxTopK];  // flat candidate index of each output slot
  typename cub::BlockScan<int32_t, kMergeThreads>::TempStorage offsets_scan;
};

// Dynamic smem after MergeSmem: offsets [chunks_per_row + 1], then up to kMergeSmemKeys keys.
// Rows with more candidates (longer than ~1M tokens) read the keys from the workspace instead.
__host__ __device__ inline size_t MergeSmemBytes(int chunks_per_row, int cand_stride) {
  const size_t keys = size_t(chunks_per_row) * cand_stride;
  return sizeof(MergeSmem) + (size_t(chunks_per_row + 1) * 4 + 15) / 16 * 16 +
         (keys <= size_t(kMergeSmemKeys) ? keys * 4 : 0);
}

__global__ void __launch_bounds__(kMergeThreads, 1) MergeChunksKernel(const ChunkParams p) {
  extern __shared__ __align__(16) uint8_t merge_smem_raw[];
  MergeSmem& s = *reinterpret_cast<MergeSmem*>(merge_smem_raw);
  int32_t* offsets = reinterpret_cast<int32_t*>(&s + 1);

  const int b = blockIdx.x, tid = threadIdx.x;
  const int64_t n = ClampedLength(p.seq_lens, b, p.max_pages);
  const int pages_total = static_cast<int>((n + kPageTokens - 1) / kPageTokens);
  const int active_chunks = (pages_total + p.chunk_pages - 1) / p.chunk_pages;
  if (active_chunks <= 1) return;  // kernel 1 wrote this row's answer

  const int64_t row_slot0 = int64_t(b) * p.chunks_per_row * p.cand_stride;
  const int32_t* counts = p.cand_count + int64_t(b) * p.chunks_per_row;
  int32_t carry = 0;
  for (int base = 0; base < active_chunks; base += kMergeThreads) {
    const int c = base + tid;
    const int32_t count = c < active_chunks ? counts[c] : 0;
    int32_t before, aggregate;
    cub::BlockScan<int32_t, kMergeThreads>(s.offsets_scan).ExclusiveSum(count, before, aggregate);
    if (c < active_chunks) offsets[c] = carry + before;
    carry += aggregate;
    __syncthreads();
  }
  if (tid == 0) offsets[active_chunks] = carry;
  __syncthreads();
  const uint32_t total = static_cast<uint32_t>(carry);

  // Flat index i of the concatenation -> (chunk, slot) in the workspace.
  auto workspace_slot = [&](uint32_t i) {
    int lo = 0, hi = active_chunks - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (uint32_t(offsets[mid]) <= i) lo = mid; else hi = mid - 1;
    }
    return row_slot0 + int64_t(lo) * p.cand_stride + (i - offsets[lo]);
  };
  const bool keys_in_smem = size_t(p.chunks_per_row) * p.cand_stride <= size_t(kMergeSmemKeys);
  uint32_t* smem_keys = reinterpret_cast<uint32_t*>(offsets + (p.chunks_per_row + 1 + 3) / 4 * 4);
  if (keys_in_smem) {
    // A warp per chunk, coalesced, through the read-only path, eight loads in flight per lane
    // before any store (a binary search per element made every load wait on the one before).
    const int warp = tid / 32, lane = tid % 32;
    for (int c = warp; c < active_chunks; c += kMergeThreads / 32) {
      const uint32_t* src = p.cand_keys + row_slot0 + int64_t(c) * p.cand_stride;
      const int32_t begin = offsets[c], count = offsets[c + 1] - begin;
      for (int j0 = 0; j0 < count; j0 += 8 * 32) {
        uint32_t v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = j0 + u * 32 + lane;
          v[u] = j < count ? __ldg(src + j) : 0u;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = j0 + u * 32 + lane;
          if (j < count) smem_keys[begin + j] = v[u];
        }
      }
    }
    __syncthreads();
  }
  auto key_at = [&](uint32_t i) { return keys_in_smem ? smem_keys[i] : p.cand_keys[workspace_slot(i)]; };

  const Threshold th =
      total <= uint32_t(p.topk) ? kTakeAll : FindThreshold<kMergeThreads>(s.select, uint32_t(p.topk), [&](auto&& f) {
        for (uint32_t i = tid; i < total; i += kMergeThreads) f(key_at(i));
      });
  auto visit = [&](uint32_t begin, uint32_t end, auto&& f) {
    for (uint32_t i = begin; i < end; ++i) f(i, key_at(i));
  };
  // Winners are first recorded as flat candidate indices (in position order: the flat order),
  // then resolved to token ids by all threads at once, so the dependent workspace and block
  // table loads of different winners overlap instead of queuing per thread.
  uint32_t selected;
  if (!p.sorted) {
    selected = EmitOrdered<kMergeThreads>(s.select, total, th, visit,
                                          [&](uint32_t slot, uint32_t i, uint32_t) { s.winners[slot] = i; });
  } else {
    // Ties by flat index are ties by position: the concatenation is in position order.
    selected = EmitOrdered<kMergeThreads>(s.select, total, th, visit, [&](uint32_t slot, uint32_t i, uint32_t key) {
      s.sorting.words[slot] = RankWord(key, i);
    });
    SortSelectedDescending<kMergeThreads>(s.sorting, selected);
    for (uint32_t r = tid; r < selected; r += kMergeThreads) s.winners[r] = RankWordPosition(s.sorting.words[r]);
    __syncthreads();
  }
  const int32_t* table = p.block_table + int64_t(b) * p.max_pages;
  int32_t* out = p.topk_indices + int64_t(b) * p.topk;
  // All of a thread's slots first read their positions, then their page ids: the loads of
  // different slots overlap instead of each slot waiting on two L2 round trips in turn.
  constexpr int kSlotsPerThread = kMaxTopK / kMergeThreads;
  uint32_t position[kSlotsPerThread];
#pragma unroll
  for (int u = 0; u < kSlotsPerThread; ++u) {
    const int r = tid + u * kMergeThreads;
    position[u] = r < int(selected) ? uint32_t(__ldg(p.cand_pos + workspace_slot(s.winners[r]))) : 0u;
  }
#pragma unroll
  for (int u = 0; u < kSlotsPerThread; ++u) {
    const int r = tid + u * kMergeThreads;
    if (r >= p.topk) break;
    const uint32_t t = position[u];
    out[r] = r < int(selected)
                 ? static_cast<int32_t>(int64_t(__ldg(table + t / kPageTokens)) * kPageTokens + t % kPageTokens)
                 : -1;
  }
}

}  // namespace ffi_dsa::sm90
