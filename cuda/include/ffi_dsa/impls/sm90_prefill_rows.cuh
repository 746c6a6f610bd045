// PrefillRowsKernel: the prefill op (docs/contract.md §8) in one kernel. Each CTA takes a block of
// four consecutive query rows, streams the keys any of them sees once, scores them on the tensor
// cores and selects while it scores (sm90_prefill_candidates.cuh): the [M, N] scores never leave
// the SM, and the call needs no workspace.
//
// Roles (one CTA, 640 threads):
//   warpgroups 0-3  math, in two teams of two: team e scores rows 2e and 2e + 1 of the block, its
//                   warpgroup m the pages m, m + 2, m + 4, ... of the block's range: one wgmma
//                   m64nCk32 sequence per page with both rows' heads on N (C = 2 x H columns, the
//                   layout of DeepGEMM's fp8_mqa_logits and of the decode kernels,
//                   sm90_page_epilogue.cuh), then the scores (relu, head weights, head sum, key
//                   scale). Each warp adds the words of the ones that beat its rows' thresholds
//                   to its own regions of the rows' buffers; the team meets once per epoch of a
//                   few pages, and cuts a row only when some warp's region could not take another
//                   epoch; at the end it selects and writes each row.
//                   Four math warps per scheduler (DeepGEMM's logits kernel runs four math
//                   warpgroups too): while one warp waits on its products or its team's barrier,
//                   the others issue, and the tensor cores always hold some warpgroup's products.
//   warpgroup 4     producer, one thread: the block's Q (4 rows x H heads) once, then every key
//                   page into a ring of kPrefillStages stages (keys and their scales by TMA; keys
//                   and scales past N are zero-filled by the TMA unit and masked by the math
//                   threads). It sleeps between polls of a busy stage (MbarWaitBackoff): its
//                   scheduler also issues for math warps.
// Both teams consume every page of the block's range, so a page is read from L2 once for four
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

constexpr int kPrefillTeams = 2;
constexpr int kPrefillBlockRows = kTeamRows * kPrefillTeams;
constexpr int kPrefillMathThreads = kPrefillTeams * kTeamThreads;
constexpr int kPrefillThreads = kPrefillMathThreads + kWarpgroupThreads;
// Registers per thread after the role split (setmaxnreg): the launch gives each thread 96 (640
// threads: whole warpgroups of 65536 / 640), the producer warpgroup (one issuing thread) gives most
// of its own to the math warpgroups, which hold one page's accumulators, both rows' head weights
// (read per page from shared memory instead, they would take more of its bandwidth than the wgmma
// operands do) and the candidate state.
constexpr uint32_t kPrefillLaunchRegisters = 65536 / kPrefillThreads / 8 * 8;
constexpr uint32_t kPrefillMathRegisters = 112;
constexpr uint32_t kPrefillProducerRegisters = 24;
static_assert(kPrefillMathThreads * kPrefillMathRegisters + kWarpgroupThreads * kPrefillProducerRegisters <=
                  kPrefillThreads * kPrefillLaunchRegisters,
              "the register split must fit the CTA's launch allocation");
// Pages in flight: a page is consumed in about the tensor-core time of its four rows' products,
// and four of those cover an L2 round trip of the TMA unit; every stage fewer leaves its 8.25 KB
// to the candidate buffers, whose size sets how often rows are cut. Even, so that each warpgroup
// of a team, taking every other page, keeps to the same half of the stages per phase.
constexpr int kPrefillStages = 4;
static_assert(kPrefillStages % kTeamWarpgroups == 0, "a warpgroup's pages advance the ring by whole turns");
// A warpgroup's pages per turn of the ring, and the turns of an epoch: even, so that every epoch
// starts each stage at phase 0.
constexpr int kStagesPerMember = kPrefillStages / kTeamWarpgroups;
constexpr int kEpochTurns = kEpochPages / kStagesPerMember;
static_assert(kEpochTurns * kStagesPerMember == kEpochPages && kEpochTurns % 2 == 0,
              "an epoch turns the stage ring a whole, even number of times");
constexpr int kKeyScaleBytes = kPageTokens * 4;

template <int kHeads>
struct alignas(1024) PrefillSmem {
  uint8_t k_tiles[kPrefillStages][kPageFp8Bytes];  // 1024-aligned: TMA swizzle-128B atoms
  uint8_t q_tiles[kPrefillBlockRows * kQTileBytes<kHeads>];
  uint64_t words[kPrefillBlockRows][kCandidateCapacity];
  float scales[kPrefillStages][kPageTokens];
  CandidateScratch scratch[kPrefillTeams];
  uint64_t full[kPrefillStages];
  uint64_t empty[kPrefillStages];
  uint64_t q_full;
};

template <int kHeads>
inline constexpr size_t PrefillSmemBytes() { return 1024 /* alignment slack */ + sizeof(PrefillSmem<kHeads>); }
static_assert(PrefillSmemBytes<64>() <= 227 * 1024, "a CTA may have 227 KB of shared memory on sm_90");

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
// team's two Q tiles into `acc`; the caller waits for them.
template <int kHeads>
__device__ __forceinline__ void IssuePage(PrefillSmem<kHeads>& s, float (&acc)[kHeads], uint32_t desc_q, int stage,
                                          uint32_t phase) {
  MbarWait(&s.full[stage], phase);
  IssueProducts<kTeamRows * kHeads>(acc, SmemDescLow(s.k_tiles[stage]), desc_q);
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
    GroupScores<kHeads, kTeamRows, 0, Weights, true>(acc, weights, scale0, scale1, lane, score);
  } else {
    GroupScores<kHeads, kTeamRows, 0>(acc, weights, scale0, scale1, lane, score);
  }
  return score[0];
}

// A math warpgroup: its share of its team's pages, scored; the team's two rows selected.
template <int kHeads>
__device__ __forceinline__ void ScoreAndSelectRows(PrefillSmem<kHeads>& s, const PrefillParams& p, int64_t row0,
                                                   BlockPages pages, uint32_t tid) {
  using Weights = RowWeights<kHeads, kTeamRows, kTeamRows * kHeads>;
  // Lane values from unsigned arithmetic, once: the loop below runs near the register cap, and
  // whatever ptxas rebuilds there it rebuilds on every page.
  // The warp's index read through a shuffle: ptxas then knows it is warp-uniform, and keeps the
  // stage, phase and descriptors derived from it in uniform registers (DeepGEMM does the same).
  const uint32_t cta_warp = __shfl_sync(0xFFFFFFFFu, tid / 32, 0);
  const int team = static_cast<int>(cta_warp / kTeamWarps), t = static_cast<int>(tid % kTeamThreads);
  const int member = static_cast<int>(cta_warp / 4 % kTeamWarpgroups);
  const int warp = static_cast<int>(cta_warp % 4), lane = static_cast<int>(tid % 32);
  const int barrier = 1 + team;
  CandidateScratch& scratch = s.scratch[team];
  // Accumulator layout of wgmma m64nN: rows r0 and r0 + 8 of the page; after GroupScores' quad
  // reduction this lane holds query (lane >> 1) & 1 of the pair for token r0 + 8 * (lane & 1).
  const int r0 = 16 * warp + (lane >> 2);
  const int query = (lane >> 1) & 1;
  const int warp_token = (lane >> 2) + 8 * (lane & 1);
  const int token = 16 * warp + warp_token;
  const int64_t first_row = row0 + kTeamRows * team;
  const KeyRange keys = RowKeys(p, first_row + query);  // of this lane's query
  Weights weights;
#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {  // rows past M read row M - 1's (never output)
    const int64_t row = first_row + q < p.rows ? first_row + q : p.rows - 1;
    LoadHeadWeights<kHeads>(p.weights + row * kHeads, lane, weights.held[q]);
  }
  RowRegion rows[kTeamRows] = {{s.words[kTeamRows * team], kNotCandidate},
                               {s.words[kTeamRows * team + 1], kNotCandidate}};
  const uint32_t desc_q = SmemDescLow(s.q_tiles + team * kTeamRows * kQTileBytes<kHeads>);
  MbarWait(&s.q_full, 0);

  // Each warpgroup of the team scores every other page (member 0 the even ones), reading its
  // products as soon as they land (the stage is released at once), and each warp adds the page's
  // entering words to its regions; the team meets once per epoch of kTeamEpochPages pages. An epoch
  // turns the stage ring a whole, even number of times, so each of its pages has a stage and a
  // phase known at compile time (page u of a turn: stage member + 2u): no stage arithmetic, and
  // the barrier and tile addresses are immediates.
  // A token's position in this lane's row is its page's first key plus lane_offset; it is a key of
  // the row when that is below row_length (unsigned: positions before the row wrap above it).
  // Both fit 32 bits: keys lie below N < 2^31 (checked on the host).
  const int32_t lane_offset = token - static_cast<int32_t>(keys.begin);
  const uint32_t row_length = static_cast<uint32_t>(keys.end - keys.begin);
  const uint32_t row_lanes = query == 0 ? kFirstRowLanes : ~kFirstRowLanes, row_shift = query == 0 ? 0u : 16u;
  // This warp's region of this lane's row, its counts of words in its regions of both rows, and the
  // largest key this lane has added (the top of the cuts' radix range).
  uint64_t* const region = (query == 0 ? rows[0].words : rows[1].words) + (t / 32) * kRegionWords;
  uint32_t counts = 0, lane_max = kNotCandidate;
  const int epochs = (pages.count + kTeamEpochPages - 1) / kTeamEpochPages;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const int first_page = epoch * kTeamEpochPages;
    const int epoch_end = pages.count < first_page + kTeamEpochPages ? pages.count : first_page + kTeamEpochPages;
    // Thresholds change only between epochs.
    const uint32_t threshold = query == 0 ? rows[0].threshold : rows[1].threshold;
    for (int turn = 0; turn < kEpochTurns; ++turn) {
      const uint32_t phase = static_cast<uint32_t>(turn) & 1u;
#pragma unroll
      for (int u = 0; u < kStagesPerMember; ++u) {
        const int i = first_page + member + kTeamWarpgroups * (turn * kStagesPerMember + u);
        if (i >= epoch_end) break;  // uniform; later pages of the epoch are past it too
        const int stage = member + kTeamWarpgroups * u;
        float acc[kHeads];
        IssuePage<kHeads>(s, acc, desc_q, stage, phase);
        const float scale0 = s.scales[stage][r0], scale1 = s.scales[stage][r0 + 8];
        WgmmaWait<0>();
        FenceOperand(acc);
        MbarArrive(&s.empty[stage]);
        const uint32_t key = ScoreToKey(PageScore<kHeads>(acc, weights, scale0, scale1, lane));
        const uint32_t position =
            static_cast<uint32_t>(static_cast<int32_t>((pages.first + i) * kPageTokens) + lane_offset);
        const bool enters = position < row_length && key > threshold;
        AppendWord(region, counts, enters, RankWord(key, position), row_lanes, row_shift);
        lane_max = enters && key > lane_max ? key : lane_max;
      }
    }
    EndEpoch(rows, counts, lane_max, query, p.topk, scratch, t, barrier);
  }
  const RowTotals totals = GatherTotals(counts, lane_max, query, scratch, t, barrier);

#pragma unroll
  for (int q = 0; q < kTeamRows; ++q) {
    const int64_t row = first_row + q;
    if (row >= p.rows) break;  // uniform
    const KeyRange row_keys = RowKeys(p, row);
    EmitRow(rows[q], q, totals, counts, p.topk, p.sorted, row_keys.end - row_keys.begin,
            p.absolute_ids ? row_keys.begin : 0, p.topk_indices + row * p.topk, scratch, t, barrier);
  }
}

template <int kHeads>
__global__ void __launch_bounds__(kPrefillThreads, 1)
    PrefillRowsKernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap scale_map,
                      const __grid_constant__ CUtensorMap q_map, const PrefillParams p) {
  extern __shared__ uint8_t smem_raw[];
  PrefillSmem<kHeads>& s = *reinterpret_cast<PrefillSmem<kHeads>*>(AlignedSmem<1024>(smem_raw));
  const uint32_t tid = threadIdx.x;
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
      MbarInit(&s.empty[st], kPrefillTeams * kWarpgroupThreads);  // one warpgroup of each team
    }
    MbarInit(&s.q_full, 1);
    for (int e = 0; e < kPrefillTeams; ++e) {
      CandidateScratch& scratch = s.scratch[e];
      scratch.moved = 0u;
      for (int q = 0; q < kTeamRows; ++q) scratch.max_key[q] = kNotCandidate;
    }
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
