// Block-wide exact top-K selection on rank keys (rank_key.h), shared by the chunk kernel (keys in
// shared memory) and the merge kernel (candidates in global memory).
//
// 1. FindThreshold finds the key T of the K-th best candidate and how many keys equal to T are
//    taken. Fast path, three passes over the keys: the score range (min/max), a 2048-bucket
//    histogram linear in score value (the top tail spreads over many buckets, so shared-memory
//    atomics rarely collide), then the keys of the K-th key's bucket are gathered and ranked
//    exactly. A radix histogram on the key's bits (the obvious choice) crowds a row's scores
//    into a few bins, because they share exponent bits, and serializes on a few addresses;
//    measured 5-10x slower on H100. Degenerate ranges (all equal, infinities, a bucket too
//    full) fall back to RadixThreshold: MSB-first 4-bit digits counted in per-thread columns.
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

// Winners are keys > key, plus the first `ties` keys == key in position order.
struct Threshold {
  uint32_t key;
  uint32_t ties;
};
// Every candidate wins (the caller knows there are at most K of them).
constexpr Threshold kTakeAll{1u, UINT_MAX};

constexpr int kDigitBits = 4;
constexpr int kBins = 1 << kDigitBits;

constexpr int kBuckets = 2048;
constexpr int kGatherCapacity = 2048;
constexpr int kRankAllPairsMax = 512;  // gathered keys ranked by all-pairs counting up to this

template <int kThreads>
struct SelectStorage {
  static_assert(kThreads % 32 == 0 && kThreads / 32 >= kBins, "one warp per bin reduces the counters");
  union {
    uint32_t counters[kBins][kThreads];  // radix: [bin][thread], bank = thread % 32, no conflicts
    uint32_t hist[kBuckets];             // value buckets
  };
  uint32_t gathered[kGatherCapacity];    // keys of the K-th key's bucket (radix may run over them)
  uint32_t bin_total[kBins];
  float warp_lo[kThreads / 32], warp_hi[kThreads / 32];
  uint32_t warp_numbers[kThreads / 32], warp_nans[kThreads / 32];
  uint32_t gathered_count, result_key, result_ties;
  union {
    typename cub::BlockScan<uint32_t, kThreads>::TempStorage scan32;
    typename cub::BlockScan<unsigned long long, kThreads>::TempStorage scan64;
  };
  uint32_t digit, above, take_all;
};

// `for_each_key(f)` calls f(key) for every key this thread owns (any split of the keys among
// threads). Ends with a barrier.
// With `take_all_ok` false the search runs even when there are no more than `topk` keys.
template <int kThreads, typename ForEachKey>
__device__ Threshold RadixThreshold(SelectStorage<kThreads>& s, uint32_t topk, ForEachKey&& for_each_key,
                                    bool take_all_ok = true) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint32_t prefix = 0, prefix_mask = 0, remaining = topk;
#pragma unroll 1
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
#pragma unroll
    for (int bin = 0; bin < kBins; ++bin) s.counters[bin][tid] = 0;  // own column: no barrier needed
    for_each_key([&](uint32_t key) {
      if (key != kNotCandidate && (key & prefix_mask) == prefix) ++s.counters[(key >> shift) & (kBins - 1)][tid];
    });
    __syncthreads();
    if (warp < kBins) {
      uint32_t total = 0;
      for (int t = lane; t < kThreads; t += 32) total += s.counters[warp][t];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
      if (lane == 0) s.bin_total[warp] = total;
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t total = 0, above = 0, digit = 0;
      for (int bin = 0; bin < kBins; ++bin) total += s.bin_total[bin];
      for (int bin = kBins - 1; bin >= 0; --bin) {
        digit = bin;
        if (above + s.bin_total[bin] >= remaining) break;
        above += s.bin_total[bin];
      }
      s.take_all = take_all_ok && shift == 32 - kDigitBits && total <= topk;  // at most K candidates: all win
      s.digit = digit;
      s.above = above;
    }
    __syncthreads();
    if (s.take_all) {
      __syncthreads();
      return kTakeAll;
    }
    remaining -= s.above;
    prefix |= s.digit << shift;
    prefix_mask |= uint32_t(kBins - 1) << shift;
    const bool whole_bin = s.bin_total[s.digit] == remaining;
    __syncthreads();  // s.digit / s.bin_total are rewritten by the next pass
    // Every key with this prefix wins: the lowest key of the prefix, with unlimited ties.
    if (whole_bin) return Threshold{prefix, UINT_MAX};
  }
  return Threshold{prefix, remaining};
}

__device__ __forceinline__ float KeyToScore(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Same contract as RadixThreshold.
template <int kThreads, typename ForEachKey>
__device__ Threshold FindThreshold(SelectStorage<kThreads>& s, uint32_t topk, ForEachKey&& for_each_key) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kGroups = 256, kPerGroup = kBuckets / kGroups;
  static_assert(kThreads >= kGroups, "bucket search needs one thread per bucket group");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Pass 1: range and count of the numbers (keys above kNaNKey), count of NaNs.
  float lo = __int_as_float(0x7F800000), hi = -lo;
  uint32_t numbers = 0, nans = 0;
  for_each_key([&](uint32_t key) {
    if (key > kNaNKey) {
      const float v = KeyToScore(key);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
      ++numbers;
    }
    nans += key == kNaNKey;
  });
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    lo = fminf(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, o));
    numbers += __shfl_xor_sync(0xFFFFFFFFu, numbers, o);
    nans += __shfl_xor_sync(0xFFFFFFFFu, nans, o);
  }
  if (lane == 0) {
    s.warp_lo[warp] = lo;
    s.warp_hi[warp] = hi;
    s.warp_numbers[warp] = numbers;
    s.warp_nans[warp] = nans;
  }
  for (int i = tid; i < kBuckets; i += kThreads) s.hist[i] = 0;
  if (tid == 0) s.gathered_count = 0;
  __syncthreads();
  numbers = nans = 0;
  for (int w = 0; w < kWarps; ++w) {
    lo = fminf(lo, s.warp_lo[w]);
    hi = fmaxf(hi, s.warp_hi[w]);
    numbers += s.warp_numbers[w];
    nans += s.warp_nans[w];
  }
  if (numbers + nans <= topk) {
    __syncthreads();
    return kTakeAll;
  }
  if (numbers < topk) {  // every number wins, and the first NaNs by position
    __syncthreads();
    return Threshold{kNaNKey, topk - numbers};
  }
  const float range = hi - lo;
  if (!(range > 0.0f && range < __int_as_float(0x7F800000))) {  // all equal, or infinities
    __syncthreads();
    return RadixThreshold<kThreads>(s, topk, for_each_key);
  }
  // Monotone in the score, so monotone in the key: bucket order is rank order.
  const float per_unit = static_cast<float>(kBuckets) / range;
  auto bucket_of = [&](uint32_t key) { return min(kBuckets - 1, static_cast<int>((KeyToScore(key) - lo) * per_unit)); };

  // Pass 2: value histogram of the numbers.
  for_each_key([&](uint32_t key) {
    if (key > kNaNKey) atomicAdd(&s.hist[bucket_of(key)], 1u);
  });
  __syncthreads();
  {  // the bucket of the K-th number, scanning bucket groups from the top
    const int group = kGroups - 1 - tid;
    uint32_t sum = 0;
    if (tid < kGroups) {
#pragma unroll
      for (int i = 0; i < kPerGroup; ++i) sum += s.hist[group * kPerGroup + i];
    }
    uint32_t above;
    cub::BlockScan<uint32_t, kThreads>(s.scan32).ExclusiveSum(sum, above);
    if (tid < kGroups && above < topk && above + sum >= topk) {
      for (int i = kPerGroup - 1; i >= 0; --i) {
        const uint32_t c = s.hist[group * kPerGroup + i];
        if (above + c >= topk) {
          s.result_key = group * kPerGroup + i;
          s.result_ties = above;
          break;
        }
        above += c;
      }
    }
  }
  __syncthreads();
  const int kth_bucket = static_cast<int>(s.result_key);
  const uint32_t rank = topk - s.result_ties;  // the K-th number is the rank-th best of its bucket
  const uint32_t in_bucket = s.hist[kth_bucket];
  if (in_bucket > kGatherCapacity) {  // too concentrated for the fast path
    __syncthreads();
    return RadixThreshold<kThreads>(s, topk, for_each_key);
  }
  // Pass 3: gather the bucket (any order: only the rank-th key and its multiplicity matter).
  for_each_key([&](uint32_t key) {
    if (key > kNaNKey && bucket_of(key) == kth_bucket) s.gathered[atomicAdd(&s.gathered_count, 1u)] = key;
  });
  __syncthreads();
  Threshold th;
  if (in_bucket <= kRankAllPairsMax) {
    for (uint32_t i = tid; i < in_bucket; i += kThreads) {
      const uint32_t e = s.gathered[i];
      uint32_t greater = 0, not_less = 0;
      for (uint32_t j = 0; j < in_bucket; ++j) {
        const uint32_t x = s.gathered[j];
        greater += x > e;
        not_less += x >= e;
      }
      if (greater < rank && rank <= not_less) {  // every copy of the key agrees
        s.result_key = e;
        s.result_ties = rank - greater;
      }
    }
    __syncthreads();
    th = Threshold{s.result_key, s.result_ties};
  } else {
    // Every key equal to the K-th lies in this bucket, so ties found among the gathered keys are
    // the ties of the row.
    th = RadixThreshold<kThreads>(
        s, rank, [&](auto&& f) { for (uint32_t i = tid; i < in_bucket; i += kThreads) f(s.gathered[i]); },
        /*take_all_ok=*/false);
  }
  __syncthreads();
  return th;
}

// `visit(begin, end, f)` calls f(index, key) for the items [begin, end) of the ordered
// sequence, in order. `emit(slot, index, key)` receives each winner and its output slot.
// Returns the number of winners (to every thread).
template <int kThreads, typename Visit, typename Emit>
__device__ uint32_t EmitOrdered(SelectStorage<kThreads>& s, uint32_t n, const Threshold& th, Visit&& visit,
                            Emit&& emit) {
  // Odd run lengths: with an even one (16 keys of 4 bytes) every lane of a warp would read the
  // same banks, a 16-way conflict on each load (measured: the largest cost of the merge).
  const uint32_t per_thread = ((n + kThreads - 1) / kThreads) | 1u;
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
