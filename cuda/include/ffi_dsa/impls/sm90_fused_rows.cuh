// One-kernel Hopper path for big batches of short rows (B >= ~0.7 x SMs, every row <= 16K
// tokens: the large-batch decode step): one CTA per row scores the whole row straight into shared
// memory and selects it from there (sm90_select_rows.cuh: SelectSlice). Against the two-kernel
// path (score everything into a workspace, then select) it saves a launch, the workspace round
// trip through L2, and the wait for the whole scoring grid before any select starts: a CTA whose
// row is done selects while the others still stream. With this many rows every SM streams
// anyway, so the per-row CTA costs no bandwidth (one CTA pulls at most ~33 GB/s, v5 trace: ~92
// together reach HBM speed). Measured on H100 (v13, benchmarks/NOTES.md): W5 (128 x 8K) 70.5 ->
// 63.1 µs; the same kernel with a cluster of 8-16 CTAs per row for small batches was slower than
// the two kernels everywhere (W1 17.5 -> 21.8, W6 50.1 -> 73.3 µs), so small batches keep them.
//
// Roles (512 threads = the select's thread count): four math warpgroups, each its own producer.
// Page i of the row goes to warpgroup i % 4 and stage i % kFusedStages; the warpgroup's first
// thread issues the page's TMA kFusedStages pages ahead, once its own 128 threads have released
// the stage (empty mbarrier). No producer warpgroup: the select that follows wants all 512
// threads, and one issuing thread per warpgroup keeps the SM's TMA unit busy (v5 trace: 2 or 4
// issuers both reach its ~450 cycles per page).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/impls/sm90_rows.cuh"
#include "ffi_dsa/impls/sm90_score_pages.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct FusedParams {
  const uint8_t* k_cache;
  const float* weights;
  SelectParams select;  // keys and staged_capacity unused: the row's keys never leave shared memory
};

constexpr int kFusedThreads = kSelectThreads;
static_assert(kFusedThreads == kMathWarpgroups * kWarpgroupThreads, "every thread scores, then selects");
// Two stages per warpgroup: one page computed while the next is in flight.
constexpr int kFusedStages = 2 * kMathWarpgroups;
// Longest row a CTA scores and stages (64 KB of keys; 216,064 B = 211 KB of shared memory in all).
constexpr uint32_t kFusedMaxRowTokens = 16384;
static_assert(kFusedMaxRowTokens / kPageTokens <= kMaxStagedPages, "the row's page ids in SelectSmem");

struct alignas(1024) FusedRing {
  uint8_t k_tiles[kFusedStages][kPageFp8Bytes];  // each 1024-aligned: TMA swizzle-128B atoms
  uint8_t q_tile[kQTileBytes];
  float scales[kFusedStages][kPageTokens];
  uint64_t full[kFusedStages];
  uint64_t empty[kFusedStages];
  uint64_t q_full;
};
struct FusedSmem {
  FusedRing ring;
  SelectSmem select;
};
__host__ __device__ constexpr size_t FusedKeysOffset() { return (sizeof(FusedSmem) + 127) / 128 * 128; }
__host__ __device__ constexpr size_t FusedSmemBytes(uint32_t row_capacity) {
  return 1024 /* alignment slack */ + FusedKeysOffset() + size_t(row_capacity) * sizeof(uint32_t);
}

__global__ void __launch_bounds__(kFusedThreads, 1)
    FusedRowsKernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap q_map,
                    const FusedParams fp) {
  extern __shared__ uint8_t fused_smem_raw[];
  uint8_t* base = AlignedSmem<1024>(fused_smem_raw);
  FusedSmem& smem = *reinterpret_cast<FusedSmem*>(base);
  FusedRing& ring = smem.ring;
  uint32_t* row_keys = reinterpret_cast<uint32_t*>(base + FusedKeysOffset());
  const SelectParams& p = fp.select;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  // Programmatic dependent launch both ways (sm90_score_pages.cuh): the next call's first kernel may
  // be placed as our CTAs leave (no workspace here); ours may be placed while the stream's previous
  // kernel ends.
  if (p.let_next_in) AllowDependentLaunch();
  WaitForPrecedingGrid();

  const int64_t n = ClampedLength(p.seq_lens, row, p.max_pages);
  if (!ScoresNeeded(n, p.topk, p.sorted)) {
    WriteWholeRow(p, row, n, smem.select);
    return;
  }
  ResetClusterSelect(smem.select.select);
  const uint32_t m = static_cast<uint32_t>(n);  // <= kFusedMaxRowTokens (the host checks the table width)
  const int pages = static_cast<int>((m + kPageTokens - 1) / kPageTokens);
  const int32_t* table = p.block_table + row * p.max_pages;
  int32_t* row_pages = smem.select.slice_pages;
  const int wg = tid / kWarpgroupThreads;
  const bool issuer = tid % kWarpgroupThreads == 0;
  auto page_id = [&](int i) {
    const int32_t page = table[i];
    return page >= 0 && page < p.num_pages ? page : -1;  // -1: not a page, its tokens are not candidates
  };
  if (tid == 0) {
    for (int st = 0; st < kFusedStages; ++st) {
      MbarInit(&ring.full[st], 1);
      MbarInit(&ring.empty[st], kWarpgroupThreads);
    }
    MbarInit(&ring.q_full, 1);
    FenceBarrierInit();
    if (pages > 0) {
      if (p.num_pages > 0) PrefetchTensorMap(&k_map);  // with no pages the map is left unencoded
      MbarArriveExpectTx(&ring.q_full, kQTileBytes);
      TmaLoad2d(ring.q_tile, &q_map, 0, static_cast<int32_t>(row * kNumHeads), &ring.q_full);
    }
  }
  for (int i = tid; i < pages; i += kFusedThreads) row_pages[i] = page_id(i);
  __syncthreads();  // barrier init, row_pages, the select's reset

  auto issue = [&](int i) {
    const int st = i % kFusedStages;
    const int32_t page = row_pages[i];
    if (page >= 0) {
      MbarArriveExpectTx(&ring.full[st], kPageFp8Bytes + kScaleBytes);
      TmaLoad3d(ring.k_tiles[st], &k_map, 0, 0, page, &ring.full[st]);
      BulkLoad(ring.scales[st], fp.k_cache + int64_t(page) * kPageBytes + kPageFp8Bytes, kScaleBytes, &ring.full[st]);
    } else {
      MbarArrive(&ring.full[st]);  // nothing to load: the consumers see the invalid id themselves
    }
  };
  if (issuer) {
    for (int i = wg; i < pages && i < kFusedStages; i += kMathWarpgroups) issue(i);
  }
  __syncwarp();

  // ---- score the row into shared memory ---------------------------------------------------
  const int warp = (tid % kWarpgroupThreads) / 32, lane = tid % 32;
  const int r0 = 16 * warp + lane / 4;  // wgmma m64nN accumulator rows r0 and r0 + 8
  SliceStats thread_stats = EmptyStats();  // this thread's share of the row's stats, gathered while scoring
  if (wg < pages) {
    float w[16];
    const float* wrow = fp.weights + row * kNumHeads + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      w[2 * j] = __ldg(wrow + 8 * j);
      w[2 * j + 1] = __ldg(wrow + 8 * j + 1);
    }
    MbarWait(&ring.q_full, 0);
    const uint64_t desc_q = SmemDescSw128(ring.q_tile);
    const uint32_t written = (m + 3) / 4 * 4;  // the select reads whole quads: pad with kNotCandidate
    for (int i = wg; i < pages; i += kMathWarpgroups) {
      const int st = i % kFusedStages;
      const uint32_t phase = (i / kFusedStages) & 1;
      MbarWait(&ring.full[st], phase);
      const bool valid = row_pages[i] >= 0;  // uniform over the warpgroup
      float acc[32];
      float scale0 = 0.0f, scale1 = 0.0f;
      if (valid) PageLogits(acc, ring.k_tiles[st], desc_q, ring.scales[st], r0, scale0, scale1);
      MbarArrive(&ring.empty[st]);  // this thread no longer reads the stage
      if (issuer && i + kFusedStages < pages) {
        MbarWait(&ring.empty[st], phase);  // every thread of the warpgroup released it
        issue(i + kFusedStages);
      }
      __syncwarp();  // converged again for the shuffles below and the next wgmma (.aligned)
      uint32_t k0 = kNotCandidate, k1 = kNotCandidate;
      if (valid) {  // (the quad's shuffles in TokenScore need every lane)
        k0 = ScoreToKey(TokenScore(acc, 0, scale0, w));
        k1 = ScoreToKey(TokenScore(acc, 2, scale1, w));
      }
      if (lane % 4 == 0) {  // (the quad's four lanes hold the same two keys)
        const uint32_t t0 = uint32_t(i) * kPageTokens + r0, t1 = t0 + 8;
        if (t0 >= m) k0 = kNotCandidate;
        if (t1 >= m) k1 = kNotCandidate;
        AddKey(thread_stats, k0);
        AddKey(thread_stats, k1);
        if (t0 < written) row_keys[t0] = k0;
        if (t1 < written) row_keys[t1] = k1;
      }
    }
  }
  __syncthreads();  // the row's keys are in shared memory

  const KeySpan keys{row_keys, nullptr, m};
  SelectSlice(p, smem.select, row, n, /*begin=*/0, keys, thread_stats, row_pages, /*landed=*/nullptr,
              /*cluster_size=*/1, /*cluster_rank=*/0);
}

}  // namespace ffi_dsa::sm90
