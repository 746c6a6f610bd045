// Block-wide exact top-K selection on rank keys (rank_key.h), shared by the chunk kernel (keys in
// shared memory) and the merge kernel (candidates in global memory).
//
// 1. FindThreshold: an MSB-first radix select (11 + 11 + 10 bits) over a shared-memory
//    histogram finds the key T of the K-th best candidate and how many keys equal to T are
//    taken. Scores of one row crowd into few bins (they share exponents), so increments are
//    aggregated per warp (match_any) instead of serializing on one address.
// 2. EmitOrdered: every thread owns a contiguous range of positions; one block scan of
//    (greater-than-T, equal-to-T) counts gives each thread its output offset, so winners come
//    out by ascending position, and ties at T go to the smallest positions, deterministically.
// 3. SortSelected: for sorted=True, a block radix sort of (key, ~position) words.
#pragma once
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

constexpr int kHistBins = 2048;   // 11-bit digits
constexpr int kDigitGroups = 256; // threads that own a run of bins when searching the digit

// Winners are keys > key, plus the first `ties` keys == key in position order.
struct Threshold {
  uint32_t key;
  uint32_t ties;
};
// Every candidate wins (the caller knows there are at most K of them).
constexpr Threshold kTakeAll{1u, UINT_MAX};

constexpr uint32_t kNoBin = 0xFFFFFFFFu;

// One shared-memory atomic per distinct bin in the warp. Every lane of the warp must call it;
// lanes with nothing to count pass kNoBin.
__device__ __forceinline__ void WarpAggregatedIncrement(uint32_t* hist, uint32_t bin) {
  const uint32_t peers = __match_any_sync(0xFFFFFFFFu, bin);
  if (bin != kNoBin && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

template <int kThreads>
struct SelectStorage {
  static_assert(kThreads >= kDigitGroups, "digit search needs one thread per bin group");
  uint32_t hist[kHistBins];
  union {
    typename cub::BlockScan<uint32_t, kThreads>::TempStorage scan32;
    typename cub::BlockScan<unsigned long long, kThreads>::TempStorage scan64;
  };
  uint32_t digit, above, total;
};

template <int kThreads>
__device__ __forceinline__ void ClearHistogram(SelectStorage<kThreads>& s) {
  for (int i = threadIdx.x; i < kHistBins; i += kThreads) s.hist[i] = 0;
}

// `for_each_key(f)` calls f(key) for every key this thread owns (any split of the keys among
// threads) with a trip count that is the same for all lanes of a warp; lanes past the end pass
// kNotCandidate. Ends with a barrier; s.hist is free afterwards.
template <int kThreads, typename ForEachKey>
__device__ Threshold FindThreshold(SelectStorage<kThreads>& s, uint32_t topk, ForEachKey&& for_each_key) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, prefix_mask = 0, remaining = topk;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t bins = pass == 2 ? 1024u : 2048u;
    ClearHistogram(s);
    __syncthreads();
    for_each_key([&](uint32_t key) {
      const bool counted = key != kNotCandidate && (key & prefix_mask) == prefix;
      WarpAggregatedIncrement(s.hist, counted ? (key >> shift) & (bins - 1) : kNoBin);
    });
    __syncthreads();
    // Scan bin groups from the top: thread g owns the g-th highest group of bins.
    const uint32_t per_group = bins / kDigitGroups;
    const int group = kDigitGroups - 1 - tid;
    uint32_t group_sum = 0;
    if (tid < kDigitGroups) {
      for (uint32_t i = 0; i < per_group; ++i) group_sum += s.hist[group * per_group + i];
    }
    uint32_t above, aggregate;
    cub::BlockScan<uint32_t, kThreads>(s.scan32).ExclusiveSum(group_sum, above, aggregate);
    if (pass == 0 && aggregate <= topk) {  // every candidate wins: no threshold to find
      __syncthreads();
      return kTakeAll;
    }
    if (tid < kDigitGroups && above < remaining && above + group_sum >= remaining) {
      uint32_t acc = above;
      for (int i = static_cast<int>(per_group) - 1; i >= 0; --i) {
        const uint32_t bin = group * per_group + i, count = s.hist[bin];
        if (acc + count >= remaining) {
          s.digit = bin;
          s.above = acc;
          break;
        }
        acc += count;
      }
    }
    __syncthreads();
    remaining -= s.above;
    prefix |= s.digit << shift;
    prefix_mask |= (bins - 1) << shift;
    __syncthreads();  // s.digit / s.above / the scan storage are reused by the next pass
  }
  return Threshold{prefix, remaining};
}

// `visit(begin, end, f)` calls f(index, key) for the items [begin, end) of the ordered
// sequence, in order. `emit(slot, index, key)` receives each winner and its output slot.
// Returns the number of winners (to every thread).
template <int kThreads, typename Visit, typename Emit>
__device__ uint32_t EmitOrdered(SelectStorage<kThreads>& s, uint32_t n, const Threshold& th, Visit&& visit,
                            Emit&& emit) {
  const uint32_t per_thread = (n + kThreads - 1) / kThreads;
  const uint32_t begin = min(n, threadIdx.x * per_thread), end = min(n, begin + per_thread);
  uint32_t greater = 0, equal = 0;
  visit(begin, end, [&](uint32_t, uint32_t key) {
    greater += key > th.key;
    equal += key == th.key;
  });
  const unsigned long long packed = (static_cast<unsigned long long>(greater) << 32) | equal;
  unsigned long long before, totals;
  cub::BlockScan<unsigned long long, kThreads>(s.scan64).ExclusiveSum(packed, before, totals);
  const uint32_t greater_before = static_cast<uint32_t>(before >> 32);
  uint32_t tie_rank = static_cast<uint32_t>(before & 0xFFFFFFFFull);
  uint32_t slot = greater_before + min(tie_rank, th.ties);
  visit(begin, end, [&](uint32_t position, uint32_t key) {
    if (key > th.key) {
      emit(slot++, position, key);
    } else if (key == th.key) {
      if (tie_rank < th.ties) emit(slot++, position, key);
      ++tie_rank;
    }
  });
  __syncthreads();
  const uint32_t equal_total = static_cast<uint32_t>(totals & 0xFFFFFFFFull);
  return static_cast<uint32_t>(totals >> 32) + min(equal_total, th.ties);
}

// Sorted output: words[0, selected) hold RankWord(key, position) of the winners; the rest of
// the capacity is padded with 0 (sorts last). Afterwards words[r] is the r-th best.
template <int kThreads>
struct SortStorage {
  static constexpr int kItems = (kMaxTopK + kThreads - 1) / kThreads;
  static constexpr int kCapacity = kItems * kThreads;
  using Sort = cub::BlockRadixSort<unsigned long long, kThreads, kItems>;
  unsigned long long words[kCapacity];
  typename Sort::TempStorage temp;
};

template <int kThreads>
__device__ void SortSelectedDescending(SortStorage<kThreads>& s, uint32_t selected) {
  using Storage = SortStorage<kThreads>;
  for (int i = selected + threadIdx.x; i < Storage::kCapacity; i += kThreads) s.words[i] = 0ull;
  __syncthreads();
  unsigned long long items[Storage::kItems];
#pragma unroll
  for (int i = 0; i < Storage::kItems; ++i) items[i] = s.words[threadIdx.x * Storage::kItems + i];
  __syncthreads();
  typename Storage::Sort(s.temp).SortDescending(items);
#pragma unroll
  for (int i = 0; i < Storage::kItems; ++i) s.words[threadIdx.x * Storage::kItems + i] = items[i];
  __syncthreads();
}

}  // namespace ffi_dsa::sm90
