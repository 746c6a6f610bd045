// PrefillRowsKernel: the prefill op (docs/contract.md §8) in one kernel. Each CTA takes a block of
// four consecutive query rows, streams the keys any of them sees once, scores them on the tensor
// cores and selects while it scores (sm90_prefill_candidates.cuh): the [M, N] scores never leave
// the SM, and the call needs no workspace.
//
// Roles (one CTA, 384 threads):
//   warpgroups 0-1  math: warpgroup w scores rows 2w and 2w + 1 of the block against every key
//                   page (64 keys) of the block's range: one wgmma m64nCk32 sequence per page with
//                   both rows' heads on N (C = 2 x H columns, the layout of DeepGEMM's fp8_mqa_logits
//                   and of the decode kernels, sm90_page_epilogue.cuh), then the scores (relu, head
//                   weights, head sum, key scale) and the ones that beat its rows' thresholds added
//                   to their candidates. The two warpgroups share the tensor cores: one's products
//                   run while the other computes its scores. At the end each row of the warpgroup
//                   is selected from its candidates and written.
//   warpgroup 2     producer, one thread: the block's Q (4 rows x H heads) once, then every key
//                   page into a ring of kPrefillStages stages (keys and their scales by TMA; keys
//                   and scales past N are zero-filled by the TMA unit and masked by the math
//                   threads). It sleeps between polls of a busy stage (MbarWaitBackoff): its
//                   scheduler also issues for math warps.
// Both warpgroups consume every page of the block's range, so a page is read from L2 once for four
// rows. Blocks are taken longest-first (the last block of a causal chunk sees the most keys), so
// the hardware's in-order CTA dispatch ends the grid on short blocks.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_page_epilogue.cuh"
#include "ffi_dsa/impls/sm90_prefill_candidates.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct PrefillParams {
  const float* weights;  // [M, H]
  const int32_t* ks;     // [M]
  const int32_t* ke;     // [M]
  int32_t* topk_indices;  // [M, K]
  int64_t rows, num_keys;
  int32_t topk;
  bool sorted;
  bool absolute_ids;
};

constexpr int kPrefillRowsPerWarpgroup = 2;
constexpr int kPrefillMathWarpgroups = 2;
constexpr int kPrefillBlockRows = kPrefillRowsPerWarpgroup * kPrefillMathWarpgroups;
constexpr int kPrefillMathThreads = kPrefillMathWarpgroups * kWarpgroupThreads;
constexpr int kPrefillThreads = kPrefillMathThreads + kWarpgroupThreads;
// Registers per thread after the role split (setmaxnreg; the launch gives 384 x 168): the math
// warpgroups hold two pages' accumulators, both rows' head weights and the candidate state; the
// producer warpgroup (one issuing thread) needs few.
constexpr uint32_t kPrefillMathRegisters = 216;
constexpr uint32_t kPrefillProducerRegisters = 40;
static_assert(kPrefillMathThreads * kPrefillMathRegisters + kWarpgroupThreads * kPrefillProducerRegisters <=
                  65536, "the register split must fit the register file");
// Pages in flight: a page is consumed in about the tensor-core time of its four rows' products,
// and six of those cover an L2 round trip of the TMA unit several times over.
constexpr int kPrefillStages = 6;
constexpr int kKeyScaleBytes = kPageTokens * 4;
// Pages a math warpgroup scores per step (their products issued together, one candidate exchange).
constexpr int kPrefillPagesPerStep = 2;
static_assert(kPrefillPagesPerStep <= kMaxPagesPerExchange, "one exchange per step");
static_assert(kCandidateCapacity >= kMaxTopK + kPrefillPagesPerStep * kPageTokens, "a cut buffer must take a step");

template <int kHeads>
struct alignas(1024) PrefillSmem {
  uint8_t k_tiles[kPrefillStages][kPageFp8Bytes];  // 1024-aligned: TMA swizzle-128B atoms
  uint8_t q_tiles[kPrefillBlockRows * kQTileBytes<kHeads>];
  uint64_t words[kPrefillBlockRows][kCandidateCapacity];
  float scales[kPrefillStages][kPageTokens];
  CandidateScratch scratch[kPrefillMathWarpgroups];
  uint64_t full[kPrefillStages];
  uint64_t empty[kPrefillStages];
  uint64_t q_full;
};

template <int kHeads>
inline constexpr size_t PrefillSmemBytes() { return 1024 /* alignment slack */ + sizeof(PrefillSmem<kHeads>); }

// A row's keys after the contract's clamps: [begin, end), empty when end <= begin; rows past M
// are empty.
struct KeyRange {
  int64_t begin = 0, end = 0;
};
__device__ __forceinline__ KeyRange RowKeys(const PrefillParams& p, int64_t row) {
  KeyRange r;
  if (row < p.rows) {
    r.begin = PrefillKeyBegin(p.ks[row]);
    r.end = r.begin + PrefillKeyCount(p.ks[row], p.ke[row], p.num_keys);
  }
  return r;
}

// The block's pages: every 64-key page that holds a key some row of the block sees.
struct BlockPages {
  int64_t first = 0;
  int count = 0;
};
__device__ __forceinline__ BlockPages PagesOfBlock(const PrefillParams& p, int64_t row0) {
  int64_t lo = INT64_MAX, hi = 0;
#pragma unroll
  for (int r = 0; r < kPrefillBlockRows; ++r) {
    const KeyRange k = RowKeys(p, row0 + r);
    if (k.end > k.begin) {
      const int64_t first = k.begin / kPageTokens, end = (k.end + kPageTokens - 1) / kPageTokens;
      lo = first < lo ? first : lo;
      hi = end > hi ? end : hi;
    }
  }
  BlockPages b;
  if (hi > 0) {
    b.first = lo;
    b.count = static_cast<int>(hi - lo);
  }
  return b;
}

// The producer warp's lane 0: the block's Q, then its pages into the stage ring.
template <int kHeads>
__device__ __forceinline__ void ProduceBlock(PrefillSmem<kHeads>& s, const CUtensorMap& k_map,
                                             const CUtensorMap& scale_map, const CUtensorMap& q_map, int64_t row0,
                                             BlockPages pages) {
  MbarArriveExpectTx(&s.q_full, kPrefillBlockRows * kQTileBytes<kHeads>);
  TmaLoad2d(s.q_tiles, &q_map, 0, static_cast<int32_t>(row0 * kHeads), &s.q_full);
  int stage = 0;
  uint32_t phase = 0;  // of the stage's current use; its previous use (to wait out) has the other
  for (int i = 0; i < pages.count; ++i) {
    if (i >= kPrefillStages) MbarWaitBackoff(&s.empty[stage], phase ^ 1);
    const int32_t key0 = static_cast<int32_t>((pages.first + i) * kPageTokens);
    MbarArriveExpectTx(&s.full[stage], kPageFp8Bytes + kKeyScaleBytes);
    TmaLoad2d(s.k_tiles[stage], &k_map, 0, key0, &s.full[stage]);
    TmaLoad2d(s.scales[stage], &scale_map, key0, 0, &s.full[stage]);
    if (++stage == kPrefillStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

// Issues the products of the page in `stage` (once its load of phase `phase` has landed) with the
// warpgroup's two Q tiles into `acc`; the caller waits for them.
template <int kHeads>
__device__ __forceinline__ void IssuePage(PrefillSmem<kHeads>& s, float (&acc)[kHeads], uint32_t desc_q, int stage,
                                          uint32_t phase) {
  MbarWait(&s.full[stage], phase);
  IssueProducts<kPrefillRowsPerWarpgroup * kHeads>(acc, SmemDescLow(s.k_tiles[stage]), desc_q);
  FenceOperand(acc);
}

// This lane's score of one page (its query, its token) from the products, as GroupScores computes
// it. When every token scale of the warp's rows can be factored out of the relu (the usual case: a
// number in [0, 2^64)), a warp-uniform branch takes the form with no per-element scale test.
template <int kHeads, typename Weights>
__device__ __forceinline__ float PageScore(const float (&acc)[kHeads], const Weights& weights, float scale0,
                                           float scale1, int lane) {
  float score[1];
  if (__all_sync(0xFFFFFFFFu, FactorableScale(scale0) && FactorableScale(scale1))) {
    GroupScores<kHeads, kPrefillRowsPerWarpgroup, 0, Weights, true>(acc, weights, scale0, scale1, lane, score);
  } else {
    GroupScores<kHeads, kPrefillRowsPerWarpgroup, 0>(acc, weights, scale0, scale1, lane, score);
  }
  return score[0];
}

// A math warpgroup: its two rows of the block, scored page after page and selected.
template <int kHeads>
__device__ __forceinline__ void ScoreAndSelectRows(PrefillSmem<kHeads>& s, const PrefillParams& p, int64_t row0,
                                                   BlockPages pages, int tid) {
  using Weights = RowWeights<kHeads, kPrefillRowsPerWarpgroup, kPrefillRowsPerWarpgroup * kHeads>;
  const int wg = tid / kWarpgroupThreads, t = tid % kWarpgroupThreads, warp = t / 32, lane = t % 32;
  const int barrier = 1 + wg;
  CandidateScratch& scratch = s.scratch[wg];
  // Accumulator layout of wgmma m64nN: rows r0 and r0 + 8 of the page; after GroupScores' quad
  // reduction this lane holds query (lane >> 1) & 1 of the pair for token r0 + 8 * (lane & 1).
  const int r0 = 16 * warp + lane / 4;
  const int query = (lane >> 1) & 1;
  const int warp_token = lane / 4 + 8 * (lane & 1);
  const int token = 16 * warp + warp_token;
  const int64_t first_row = row0 + kPrefillRowsPerWarpgroup * wg;
  const KeyRange keys = RowKeys(p, first_row + query);  // of this lane's query
  Weights weights;
#pragma unroll
  for (int q = 0; q < kPrefillRowsPerWarpgroup; ++q) {  // rows past M read row M - 1's (never output)
    const int64_t row = first_row + q < p.rows ? first_row + q : p.rows - 1;
    LoadHeadWeights<kHeads>(p.weights + row * kHeads, lane, weights.held[q]);
  }
  RowCandidates rows[2] = {{s.words[2 * wg], 0, kNotCandidate}, {s.words[2 * wg + 1], 0, kNotCandidate}};
  const uint32_t desc_q = SmemDescLow(s.q_tiles + wg * kPrefillRowsPerWarpgroup * kQTileBytes<kHeads>);
  MbarWait(&s.q_full, 0);

  // Two pages per step: both pages' products, then (nothing in flight) both pages' scores, which
  // the compiler interleaves (two independent epilogues: twice the instruction-level parallelism of
  // one), one threshold test and candidate exchange for both, and any cut. The other warpgroup's
  // products run on the tensor cores meanwhile. An odd last page is paired with itself (its second
  // copy's positions lie past every row's end, so it adds nothing).
  int stage = 0;
  uint32_t phase = 0;
  const int32_t first_key = static_cast<int32_t>(pages.first * kPageTokens) + token;
  const int32_t begin = static_cast<int32_t>(keys.begin), end = static_cast<int32_t>(keys.end);
  auto advance = [&] {
    if (++stage == kPrefillStages) {
      stage = 0;
      phase ^= 1;
    }
  };
  for (int i = 0; i < pages.count; i += kPrefillPagesPerStep) {
    const bool pair = i + 1 < pages.count;  // uniform
    const int stage0 = stage;
    const uint32_t phase0 = phase;
    if (pair) advance();
    float acc[kPrefillPagesPerStep][kHeads];
    IssuePage<kHeads>(s, acc[0], desc_q, stage0, phase0);
    IssuePage<kHeads>(s, acc[1], desc_q, stage, phase);
    WgmmaWait<0>();
    FenceOperand(acc[0]);
    FenceOperand(acc[1]);
    const int stages[kPrefillPagesPerStep] = {stage0, stage};
    bool enters[kPrefillPagesPerStep];
    uint64_t words[kPrefillPagesPerStep];
#pragma unroll
    for (int pg = 0; pg < kPrefillPagesPerStep; ++pg) {
      const float score = PageScore<kHeads>(acc[pg], weights, s.scales[stages[pg]][r0], s.scales[stages[pg]][r0 + 8],
                                            lane);
      const uint32_t key = ScoreToKey(score);
      const int32_t j = first_key + (i + pg) * kPageTokens;
      const uint32_t threshold = query == 0 ? rows[0].threshold : rows[1].threshold;
      enters[pg] = j >= begin && j < end && key > threshold;
      words[pg] = RankWord(key, static_cast<uint32_t>(j - begin));
    }
    MbarArrive(&s.empty[stage0]);
    if (pair) MbarArrive(&s.empty[stage]);
    advance();
    AppendPages<kPrefillPagesPerStep>(rows, enters, words, query, warp_token, scratch, warp, lane,
                                      (i / kPrefillPagesPerStep) & 1, barrier);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (rows[q].count > kCandidateCapacity - kPrefillPagesPerStep * kPageTokens) {
        rows[q].Cut(p.topk, scratch, t, barrier);
      }
    }
  }

#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int64_t row = first_row + q;
    if (row >= p.rows) break;  // uniform
    const KeyRange row_keys = RowKeys(p, row);
    EmitRow(rows[q], p.topk, p.sorted, p.absolute_ids ? row_keys.begin : 0, p.topk_indices + row * p.topk, scratch, t,
            barrier);
  }
}

template <int kHeads>
__global__ void __launch_bounds__(kPrefillThreads, 1)
    PrefillRowsKernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap scale_map,
                      const __grid_constant__ CUtensorMap q_map, const PrefillParams p) {
  extern __shared__ uint8_t smem_raw[];
  PrefillSmem<kHeads>& s = *reinterpret_cast<PrefillSmem<kHeads>*>(AlignedSmem<1024>(smem_raw));
  const int tid = threadIdx.x;
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * kPrefillBlockRows;
  if (tid == kPrefillMathThreads) {
    if (p.num_keys > 0) {  // with no keys the maps are left unencoded and never used
      PrefetchTensorMap(&k_map);
      PrefetchTensorMap(&scale_map);
    }
    PrefetchTensorMap(&q_map);
  }
  if (tid == 0) {
    for (int st = 0; st < kPrefillStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kPrefillMathThreads);
    }
    MbarInit(&s.q_full, 1);
    FenceBarrierInit();
  }
  __syncthreads();
  // Everything above touches only parameters and shared memory; below, inputs the stream's
  // previous kernel may write (programmatic launch, launch/tuning.h).
  WaitForPrecedingGrid();
  AllowDependentLaunch();
  const BlockPages pages = PagesOfBlock(p, row0);
  // One branch per role, so that each warpgroup's setmaxnreg is the first thing its branch does.
  if (tid >= kPrefillMathThreads) {
    ShrinkRegisters<kPrefillProducerRegisters>();
    if (tid == kPrefillMathThreads) ProduceBlock(s, k_map, scale_map, q_map, row0, pages);
  } else {
    GrowRegisters<kPrefillMathRegisters>();
    ScoreAndSelectRows(s, p, row0, pages, tid);
  }
}

}  // namespace ffi_dsa::sm90
