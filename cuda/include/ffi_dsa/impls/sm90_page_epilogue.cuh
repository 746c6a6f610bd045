// One staged page scored for every query of its row: the tensor-core products and the epilogue
// that turns them into one rank key per (query, token). Shared by ScorePagesKernel
// (sm90_score_pages.cuh) and FusedRowsKernel (sm90_fused_rows.cuh).
//
// Products. The page's 64 tokens are M; the N side stacks the heads of as many of the row's
// queries as 128 columns hold (two of 64 heads, four of 32: their Q tiles lie back to back in
// shared memory, so they are one K-major operand). One wgmma sequence then serves a whole group
// of queries (the idea of DeepGEMM's paged MQA logits, which puts next_n x heads on N): a page
// costs one set of descriptors and one tensor-core round trip per group instead of per query.
//
// Epilogue. Each accumulator costs one relu (max.NaN, which keeps NaN) and one FFMA with its
// head weight; the token's scale is applied once, after the head sum, when it is a number in
// [0, 2^64) (docs/contract.md allows factoring a positive scale out of the relu); any other scale
// takes the exact form, relu(logit * scale), for that token. The quad of lanes that shares a
// token row then sums its partial scores with a reduce-scatter: every exchange halves the values
// a lane holds, so that each lane ends with whole scores of its own (query, token) pairs instead
// of every lane of the quad summing every score. The keys, masks and stores that follow run once
// per score, spread over the quad.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

// A query's Q tile: its heads x 128 bytes, a whole number of 1024-byte swizzle atoms.
template <int kHeads>
constexpr int kQTileBytes = kHeads * kHeadDim;

// Accumulator columns of one wgmma: 128 (64 registers per thread) at most, so that a group's
// accumulators and its head weights fit the math warpgroups' registers.
constexpr int kMaxMmaColumns = 128;

// How a row's kQueries queries are grouped for the tensor cores, and which scores each lane
// holds after the quad reduction.
//
// After the first exchange (lanes 1 apart) a lane holds, for each query of the group, the
// quad's sum for token row r0 + 8 * (lane & 1); after the second (lanes 2 apart) it holds "slots":
// slot s is query 2s + ((lane >> 1) & 1) of the group, or, when the group has an odd query
// left over, that query on both lanes of the pair (only the lane with bit 1 clear stores it).
// Example, 64 heads and N = 2: one group of two queries, one slot per lane: lane 0 holds query 0
// of token r0, lane 1 query 0 of token r0 + 8, lane 2 query 1 of token r0, lane 3 query 1 of r0 + 8.
template <int kHeads, int kQueries>
struct PageGroups {
  static constexpr int kMmaQueries = kMaxMmaColumns / kHeads;
  static constexpr int kCount = (kQueries + kMmaQueries - 1) / kMmaQueries;
  __host__ __device__ static constexpr int Queries(int g) { return kQueries - g * kMmaQueries < kMmaQueries ? kQueries - g * kMmaQueries : kMmaQueries; }
  __host__ __device__ static constexpr int Slots(int g) { return (Queries(g) + 1) / 2; }
  __host__ __device__ static constexpr int FirstSlot(int g) { return g == 0 ? 0 : FirstSlot(g - 1) + Slots(g - 1); }
  static constexpr int kSlots = FirstSlot(kCount);
  // The group of slot s, counted over all groups (s is a compile-time index after unrolling).
  __host__ __device__ static constexpr int GroupOfSlot(int s) {
    int g = 0;
    while (s >= Slots(g)) s -= Slots(g++);
    return g;
  }
};

// Calls f(std::integral_constant<int, g>) for g = 0 .. kCount - 1: the group index stays a
// compile-time constant in the body, so each group's accumulators are a register array of its own.
template <int kCount, int g = 0, typename F>
__device__ __forceinline__ void ForEachGroup(F&& f) {
  if constexpr (g < kCount) {
    f(std::integral_constant<int, g>{});
    ForEachGroup<kCount, g + 1>(f);
  }
}

// The query of this lane's slot (global slot index s) and whether this lane stores it.
template <int kHeads, int kQueries>
__device__ __forceinline__ int SlotQuery(int s, int lane, bool& owner) {
  using G = PageGroups<kHeads, kQueries>;
  const int g = G::GroupOfSlot(s);
  const int local = s - G::FirstSlot(g);
  const bool paired = 2 * local + 1 < G::Queries(g);
  owner = paired || (lane & 2) == 0;
  return g * G::kMmaQueries + 2 * local + (paired ? (lane >> 1) & 1 : 0);
}

// This lane's slots for a row (or segment), relative to the lane's token of a page: each slot's
// query, and the page offsets (first token of the page, page_t0) below which the lane's token is
// a key of the query (page_t0 < key_end: inside its length) and is stored (page_t0 < store_end:
// inside its length rounded up to a quad; never, where the other lane of the pair stores the
// slot). One compare each per page, no addition.
template <int kHeads, int kQueries>
struct LaneSlots {
  static constexpr int kCount = PageGroups<kHeads, kQueries>::kSlots;
  int query[kCount];
  int32_t key_end[kCount], store_end[kCount];

  __device__ __forceinline__ void Set(const int32_t (&lengths)[kQueries], const int32_t (&ends)[kQueries], int lane,
                                      int token) {
#pragma unroll
    for (int x = 0; x < kCount; ++x) {
      bool owner;
      query[x] = SlotQuery<kHeads, kQueries>(x, lane, owner);
      int32_t length = lengths[0], end = ends[0];
#pragma unroll
      for (int j = 1; j < kQueries; ++j) {  // compile-time indices only: the arrays stay in registers
        if (query[x] == j) {
          length = lengths[j];
          end = ends[j];
        }
      }
      key_end[x] = length - token;
      store_end[x] = owner ? end - token : INT32_MIN;
    }
  }
};

// Where each group's keys end on the row: the furthest end among its queries (uniform). A page at
// or past it has no key of the group to write.
template <int kHeads, int kQueries>
__device__ __forceinline__ void GroupEnds(const int32_t (&ends)[kQueries],
                                          int32_t (&group_end)[PageGroups<kHeads, kQueries>::kCount]) {
  using G = PageGroups<kHeads, kQueries>;
#pragma unroll
  for (int g = 0; g < G::kCount; ++g) {
    group_end[g] = 0;
#pragma unroll
    for (int j = g * G::kMmaQueries; j < g * G::kMmaQueries + G::Queries(g); ++j) group_end[g] = max(group_end[g], ends[j]);
  }
}

// Head weights of this thread's accumulator columns of one query (8j + 2 (lane % 4) + {0, 1}),
// scalar loads: a weights view need not be 8-byte aligned.
template <int kHeads>
__device__ __forceinline__ void LoadHeadWeights(const float* query_weights, int lane, float (&w)[kHeads / 4]) {
#pragma unroll
  for (int j = 0; j < kHeads / 8; ++j) {
    w[2 * j] = __ldg(query_weights + 8 * j + 2 * (lane % 4));
    w[2 * j + 1] = __ldg(query_weights + 8 * j + 2 * (lane % 4) + 1);
  }
}

// This thread's head weights of a row's N queries. Kept in registers when they fit beside the
// accumulators (N x H <= kMaxHeld: kMaxHeld / 4 registers), loaded once per row; otherwise read
// again for every page and query, from L1.
template <int kHeads, int kQueries, int kMaxHeld>
struct RowWeights {
  static constexpr bool kInRegisters = kQueries * kHeads <= kMaxHeld;
  static constexpr bool kStaged = false;
  float held[kInRegisters ? kQueries : 1][kHeads / 4];
  const float* row;  // [kQueries][kHeads] in global memory

  __device__ __forceinline__ void Load(const float* row_weights, int lane) {
    row = row_weights;
    if constexpr (kInRegisters) {
#pragma unroll
      for (int j = 0; j < kQueries; ++j) LoadHeadWeights<kHeads>(row + j * kHeads, lane, held[j]);
    }
  }
  // Query j's weights (j a compile-time index after unrolling).
  __device__ __forceinline__ void Get(int j, int lane, float (&w)[kHeads / 4]) const {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int x = 0; x < kHeads / 4; ++x) w[x] = held[j][x];
    } else {
      LoadHeadWeights<kHeads>(row + j * kHeads, lane, w);
    }
  }
};

// This thread's head weights of a row's N queries, staged per segment in a per-warpgroup copy
// in shared memory when they do not fit the registers beside a group's accumulators: a thread
// then reads its kHeads / 4 weights of a query as kHeads / 16 16-byte loads per page (the copy is
// laid out by quad lane, [query][lane % 4][kLaneFloats]) instead of holding them for the segment.
// Only the warpgroup's own 128 threads read its copy, so a named barrier of those threads, not a
// CTA barrier, orders the rewrite at each segment.
//
// Each quad lane's run is padded by 16 bytes. A 16-byte load is served 8 lanes at a time, and
// those 8 lanes read the 4 runs at the same offset: unpadded, 64 heads put the runs 64 bytes
// apart, so runs 0 and 2 (and 1 and 3) fall on the same banks and every load takes two passes.
// At N = 4 these loads move more shared-memory wavefronts a page than the wgmma operands, so the
// second pass is felt. Padded, the runs start 80 bytes apart: banks 0, 20, 8 and 28, one pass
// (32 heads: 48 bytes apart, banks 0, 12, 24 and 4).
template <int kHeads, int kQueries>
struct StagedWeights {
  static constexpr int kLaneFloats = kHeads / 4 + 4;          // one quad lane's run, padded
  static constexpr int kQueryFloats = 4 * kLaneFloats;        // one query's four runs
  static constexpr int kFloats = kQueries * kHeads;           // the weights of a warpgroup's copy
  static constexpr int kCopyFloats = kQueries * kQueryFloats;  // its size in shared memory
  static constexpr bool kStaged = true;
  float* copy;

  // Every thread of the warpgroup, at every segment; `barrier` is the warpgroup's named barrier.
  __device__ __forceinline__ void Load(const float* row_weights, float* warpgroup_copy, int wg_thread, int barrier) {
    copy = warpgroup_copy;
    float v[(kFloats + kWarpgroupThreads - 1) / kWarpgroupThreads];
#pragma unroll
    for (int k = 0; k < int(sizeof(v) / sizeof(float)); ++k) {
      const int x = wg_thread + k * kWarpgroupThreads;
      if (x < kFloats) v[k] = __ldg(row_weights + x);
    }
    NamedBarrierSync(barrier, kWarpgroupThreads);  // the previous segment's reads are done
#pragma unroll
    for (int k = 0; k < int(sizeof(v) / sizeof(float)); ++k) {
      const int x = wg_thread + k * kWarpgroupThreads;
      const int q = x / kHeads, h = x % kHeads;
      if (x < kFloats) copy[q * kQueryFloats + ((h % 8) / 2) * kLaneFloats + 2 * (h / 8) + h % 2] = v[k];
    }
    NamedBarrierSync(barrier, kWarpgroupThreads);
  }
  __device__ __forceinline__ void Get(int j, int lane, float (&w)[kHeads / 4]) const {
    const float4* src = reinterpret_cast<const float4*>(copy + j * kQueryFloats + (lane % 4) * kLaneFloats);
#pragma unroll
    for (int m = 0; m < kHeads / 16; ++m) {
      const float4 f = src[m];
      w[4 * m] = f.x;
      w[4 * m + 1] = f.y;
      w[4 * m + 2] = f.z;
      w[4 * m + 3] = f.w;
    }
  }
};

// Issues the [64 tokens x kCols] FP8 product of a staged page (desc_k) with Q tiles (desc_q) into
// `acc` as one committed wgmma group (4 x m64nCk32 along the head dim); the caller waits for it.
template <int kCols>
__device__ __forceinline__ void IssueProducts(float (&acc)[kCols / 2], uint32_t desc_k, uint32_t desc_q) {
  FenceOperand(acc);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 32; ++kk) {
    WgmmaE4M3<kCols>::Run(acc, SmemDesc(DescAdvance(desc_k, kk * 32)), SmemDesc(DescAdvance(desc_q, kk * 32)), kk > 0);
  }
  WgmmaCommit();
}

// A scale the epilogue may factor out of the relu: a number in [0, 2^64), so that
// relu(logit * scale) == scale * relu(logit) up to rounding (|logit| < 2^64).
__device__ __forceinline__ bool FactorableScale(float scale) { return scale >= 0.0f && scale < 1.8446744e19f; }
// Both scales factorable, as one unsigned compare of their bits (+0 up to the largest float below
// 2^64 = 0x5F800000): a slightly narrower test (-0 fails it) that implies FactorableScale for
// both, for the warp vote that picks the epilogue's form; each token's arithmetic does not depend
// on it (checked for every float on the CPU).
__device__ __forceinline__ bool BothFactorable(float scale0, float scale1) {
  return max(__float_as_uint(scale0), __float_as_uint(scale1)) < 0x5F800000u;
}

// rank_key.h's ScoreToKey, the same key for every float (checked over all 2^32 on the CPU), in
// five instructions instead of eight: adding +0 turns -0 into +0 and changes no other value (an
// add never fused into the multiply before it: __fadd_rn), so no zero test; the sign's mask then
// flips a negative's bits and sets a positive's sign bit in one LOP3.
__device__ __forceinline__ uint32_t ScoreKey(float score) {
  const uint32_t bits = __float_as_uint(__fadd_rn(score, 0.0f));
  const uint32_t key = bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
  return score != score ? kNaNKey : key;
}

// This thread's partial score of query q of the group for token row r0 + 8h: its kHeads / 4
// columns, each relu'd and weighted, in one chain of FFMAs (column order). The order of the adds
// is the same whatever the group's size, so a query scores the same bytes in a call of N queries
// as alone, and in PrefillRowsKernel as in decode (tests compare them). A group's 2 x N chains run
// side by side, so one chain per (query, row) costs no latency and saves the final add.
template <int kHeads, int kGroupQueries>
__device__ __forceinline__ float PartialScore(const float (&acc)[kGroupQueries * kHeads / 2], int q, int h,
                                              const float (&w)[kHeads / 4], bool factored, float scale) {
  float a = 0.0f;
  const int base = q * kHeads / 2 + 2 * h;
  if (factored) {
#pragma unroll
    for (int j = 0; j < kHeads / 8; ++j) {
      a = fmaf(w[2 * j], ReluNaN(acc[base + 4 * j]), a);
      a = fmaf(w[2 * j + 1], ReluNaN(acc[base + 4 * j + 1]), a);
    }
  } else {  // negative, huge, infinite or NaN scale: exactly as written
#pragma unroll
    for (int j = 0; j < kHeads / 8; ++j) {
      a = fmaf(w[2 * j], ReluNaN(acc[base + 4 * j] * scale), a);
      a = fmaf(w[2 * j + 1], ReluNaN(acc[base + 4 * j + 1] * scale), a);
    }
  }
  return a;
}

// The group's whole scores this lane holds (its slots, see PageGroups), for token row
// r0 + 8 * (lane & 1), scale applied. Every lane of the warp calls it (shuffles). `first` holds
// the weights of the group's first query (fetched by the caller, possibly before the products
// land); the others' are fetched just before their products are summed, so that at most one
// query's are live beside the accumulators.
// kAllFactored: the caller has checked that both scales are factorable (FactorableScale), so the
// exact form is not compiled.
template <int kHeads, int kQueries, int kGroup, typename Weights, bool kAllFactored = false>
__device__ __forceinline__ void GroupScores(const float (&acc)[PageGroups<kHeads, kQueries>::Queries(kGroup) * kHeads / 2],
                                            const Weights& weights, const float (&first)[kHeads / 4], float scale0,
                                            float scale1, int lane,
                                            float (&score)[PageGroups<kHeads, kQueries>::Slots(kGroup)]) {
  using G = PageGroups<kHeads, kQueries>;
  constexpr int kGroupQueries = G::Queries(kGroup);
  bool factored0 = true, factored1 = true;
  if constexpr (!kAllFactored) {
    factored0 = FactorableScale(scale0);
    factored1 = FactorableScale(scale1);
  }
  float part[kGroupQueries][2];
  part[0][0] = PartialScore<kHeads, kGroupQueries>(acc, 0, 0, first, factored0, scale0);
  part[0][1] = PartialScore<kHeads, kGroupQueries>(acc, 0, 1, first, factored1, scale1);
#pragma unroll
  for (int q = 1; q < kGroupQueries; ++q) {
    float w[kHeads / 4];
    weights.Get(kGroup * G::kMmaQueries + q, lane, w);
    part[q][0] = PartialScore<kHeads, kGroupQueries>(acc, q, 0, w, factored0, scale0);
    part[q][1] = PartialScore<kHeads, kGroupQueries>(acc, q, 1, w, factored1, scale1);
  }
  // Exchange 1 (lanes 1 apart): keep token row r0 + 8 * (lane & 1), send the other.
  const bool odd = lane & 1, upper = lane & 2;
  float row_sum[kGroupQueries];
#pragma unroll
  for (int q = 0; q < kGroupQueries; ++q) {
    const float send = odd ? part[q][0] : part[q][1];
    row_sum[q] = (odd ? part[q][1] : part[q][0]) + __shfl_xor_sync(0xFFFFFFFFu, send, 1);
  }
  // Exchange 2 (lanes 2 apart): keep query 2s + bit 1 of each pair; an odd query left over is
  // summed on both lanes.
  const float factor = odd ? (factored1 ? scale1 : 1.0f) : (factored0 ? scale0 : 1.0f);
#pragma unroll
  for (int s = 0; s < (kGroupQueries + 1) / 2; ++s) {
    float sum;
    if (2 * s + 1 < kGroupQueries) {
      const float send = upper ? row_sum[2 * s] : row_sum[2 * s + 1];
      sum = (upper ? row_sum[2 * s + 1] : row_sum[2 * s]) + __shfl_xor_sync(0xFFFFFFFFu, send, 2);
    } else {
      sum = row_sum[2 * s] + __shfl_xor_sync(0xFFFFFFFFu, row_sum[2 * s], 2);
    }
    score[s] = sum * factor;
  }
}
// The same, fetching the first query's weights itself.
template <int kHeads, int kQueries, int kGroup, typename Weights, bool kAllFactored = false>
__device__ __forceinline__ void GroupScores(const float (&acc)[PageGroups<kHeads, kQueries>::Queries(kGroup) * kHeads / 2],
                                            const Weights& weights, float scale0, float scale1, int lane,
                                            float (&score)[PageGroups<kHeads, kQueries>::Slots(kGroup)]) {
  float first[kHeads / 4];
  weights.Get(kGroup * PageGroups<kHeads, kQueries>::kMmaQueries, lane, first);
  GroupScores<kHeads, kQueries, kGroup, Weights, kAllFactored>(acc, weights, first, scale0, scale1, lane, score);
}

// One group's products and scores for a staged page: this lane's keys of the group's slots
// (ScoreKey of each score). The products are issued whatever the page: a stage whose page id was
// invalid holds stale bytes, whose keys the caller replaces by kNotCandidate, so that no branch
// waits on the page id before the tensor cores start. `release` runs once the tensor cores no
// longer read the stage.
template <int kHeads, int kQueries, int kGroup, typename Weights, typename Release>
__device__ __forceinline__ void ScoreGroup(uint32_t desc_k, uint32_t desc_q0, const float* page_scales, int r0,
                                           int lane, const Weights& weights, Release&& release,
                                           uint32_t (&keys)[PageGroups<kHeads, kQueries>::Slots(kGroup)]) {
  using G = PageGroups<kHeads, kQueries>;
  constexpr int kGroupQueries = G::Queries(kGroup);
  constexpr int kCols = kGroupQueries * kHeads;
  // This thread's two token scales (rows r0 and r0 + 8) and the first query's head weights
  // (shared-memory loads when staged), asked for before the products: the wgmma operand reads of
  // every warpgroup share the shared-memory pipe with them, and loads issued behind this group's
  // products came back after its wait (the epilogue's first FFMAs waited on them).
  const float scale0 = page_scales[r0], scale1 = page_scales[r0 + 8];
  float first[kHeads / 4];
  weights.Get(kGroup * G::kMmaQueries, lane, first);
  float acc[kCols / 2];
#pragma unroll
  for (int x = 0; x < kCols / 2; ++x) acc[x] = 0.0f;
  IssueProducts<kCols>(acc, desc_k, DescAdvance(desc_q0, kGroup * G::kMmaQueries * kQTileBytes<kHeads>));
  WgmmaWait<0>();
  FenceOperand(acc);
  release();
  // One warp vote instead of a test per (query, token row): when every scale of the warp's 16
  // tokens can be factored out (the usual case) the whole warp takes the form with no exact-scale
  // code; otherwise each lane tests its own two scales as before. The arithmetic of each token is
  // the same either way.
  float score[G::Slots(kGroup)];
  if (__all_sync(0xFFFFFFFFu, BothFactorable(scale0, scale1))) {
    GroupScores<kHeads, kQueries, kGroup, Weights, true>(acc, weights, first, scale0, scale1, lane, score);
  } else {
    GroupScores<kHeads, kQueries, kGroup, Weights>(acc, weights, first, scale0, scale1, lane, score);
  }
#pragma unroll
  for (int s = 0; s < G::Slots(kGroup); ++s) keys[s] = ScoreKey(score[s]);
}

}  // namespace ffi_dsa::sm90
