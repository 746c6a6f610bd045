// Kernel 1 of the Hopper path: score one chunk (a run of pages) of one row and select in place.
//
// Roles (one CTA, 640 threads):
//   warpgroups 0-3  math: page i goes to warpgroup i % 4; 4 x wgmma m64n64k32 (tokens = M,
//                   heads = N, both K-major FP8 in 128B-swizzled smem) -> scale, relu, head
//                   weights, head sum in registers -> one rank key per token in smem.
//   warpgroup 4     producer: one thread walks the chunk's page ids and streams each page
//                   (8 KB of FP8 rows by TMA, 256 B of scales by a bulk copy) into a ring of
//                   kStages stages (full/empty mbarriers). Invalid page ids are never loaded.
// Four math warpgroups, not a deeper software pipeline in one: the per-page chain (wgmma, then
// ~100 dependent ALU ops of epilogue) is latency, and more warps per scheduler hide it best.
// Then all 640 threads select the chunk's top-K from the keys in smem (sm90_block_select.cuh).
// A row that fits in one chunk writes its final answer here; otherwise the chunk writes its
// winners (key, position) to the workspace and the merge kernel finishes the row.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_block_select.cuh"
#include "ffi_dsa/impls/sm90_ptx.cuh"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::sm90 {

struct ChunkParams {
  const uint8_t* q;
  const uint8_t* k_cache;
  const float* weights;
  const int32_t* seq_lens;
  const int32_t* block_table;
  int32_t* topk_indices;
  // Workspace, used only by rows spanning several chunks: [B, chunks_per_row, cand_stride].
  uint32_t* cand_keys;
  int32_t* cand_pos;
  int32_t* cand_count;  // [B, chunks_per_row]
  int64_t num_pages;
  int32_t max_pages;
  int32_t topk;
  int32_t chunk_pages;
  int32_t chunks_per_row;
  int32_t cand_stride;
  bool sorted;
};

constexpr int kChunkThreads = 640;
constexpr int kMathWarpgroups = 4;
constexpr int kWarpgroupThreads = 128;
constexpr int kProducerThread = kMathWarpgroups * kWarpgroupThreads;
constexpr int kStages = 12;  // 4 stages being computed + 8 in flight
constexpr int kScaleBytes = kPageTokens * 4;
constexpr int kIssuerWarps = 4;

struct alignas(1024) ChunkSmem {
  union Ring {
    uint8_t k_tiles[kStages][kPageFp8Bytes];  // each tile 1024-aligned: TMA swizzle-128B atoms
    SortStorage<kChunkThreads> sorting;       // reused once every page has been consumed
  } ring;
  uint8_t q_tile[kNumHeads * kHeadDim];
  float scales[kStages][kPageTokens];
  float weights[kNumHeads];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  SelectStorage<kChunkThreads> select;
};
static_assert(sizeof(SortStorage<kChunkThreads>) <= sizeof(uint8_t[kStages][kPageFp8Bytes]),
              "sort scratch must fit in the page ring");

// Dynamic smem after ChunkSmem: page ids [chunk_pages], then keys [chunk_pages * 64].
__host__ __device__ inline size_t ChunkSmemBytes(int chunk_pages) {
  return 1024 /* alignment slack */ + sizeof(ChunkSmem) + size_t(chunk_pages) * 4 +
         size_t(chunk_pages) * kPageTokens * 4;
}

// Score of one accumulator row of this thread (`half` 0: row r0, 2: row r0 + 8), summed over
// the quad that shares the row. SPEC order is relu(logit * scale); for a non-negative scale
// that cannot overflow a logit (< 2^64) that equals scale * relu(logit), which saves a multiply
// per head. Four partial sums shorten the dependent chain.
__device__ __forceinline__ float TokenScore(const float (&acc)[32], int half, float scale, const float (&w)[16]) {
  float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float score;
  if (scale >= 0.0f && scale < 1.8446744e19f) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      part[(2 * j) & 3] = fmaf(w[2 * j], ReluNaN(acc[4 * j + half]), part[(2 * j) & 3]);
      part[(2 * j + 1) & 3] = fmaf(w[2 * j + 1], ReluNaN(acc[4 * j + half + 1]), part[(2 * j + 1) & 3]);
    }
    score = ((part[0] + part[1]) + (part[2] + part[3])) * scale;
  } else {  // negative, huge, infinite or NaN scale: exactly as written
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      part[(2 * j) & 3] = fmaf(w[2 * j], ReluNaN(acc[4 * j + half] * scale), part[(2 * j) & 3]);
      part[(2 * j + 1) & 3] = fmaf(w[2 * j + 1], ReluNaN(acc[4 * j + half + 1] * scale), part[(2 * j + 1) & 3]);
    }
    score = (part[0] + part[1]) + (part[2] + part[3]);
  }
  score += __shfl_xor_sync(0xFFFFFFFFu, score, 1);
  score += __shfl_xor_sync(0xFFFFFFFFu, score, 2);
  return score;
}

__device__ __forceinline__ int64_t ClampedLength(const int32_t* seq_lens, int b, int32_t max_pages) {
  const int64_t n = seq_lens[b];
  return n < 0 ? 0 : (n > int64_t(max_pages) * kPageTokens ? int64_t(max_pages) * kPageTokens : n);
}

__global__ void __launch_bounds__(kChunkThreads, 1)
    ScoreChunkKernel(const __grid_constant__ CUtensorMap k_map, const ChunkParams p) {
  extern __shared__ uint8_t smem_raw[];
  ChunkSmem& s = *reinterpret_cast<ChunkSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  int32_t* page_ids = reinterpret_cast<int32_t*>(&s + 1);
  uint32_t* keys = reinterpret_cast<uint32_t*>(page_ids + p.chunk_pages);

  const int b = blockIdx.x, chunk = blockIdx.y, tid = threadIdx.x;
  const int64_t n = ClampedLength(p.seq_lens, b, p.max_pages);
  const int pages_total = static_cast<int>((n + kPageTokens - 1) / kPageTokens);
  const int active_chunks = (pages_total + p.chunk_pages - 1) / p.chunk_pages;
  // Chunk 0 always runs: an empty row still needs its -1s.
  if (chunk >= (active_chunks > 0 ? active_chunks : 1)) return;
  const int first_page = chunk * p.chunk_pages;
  const int my_pages = max(0, min(p.chunk_pages, pages_total - first_page));
  const int64_t tokens_left = n - int64_t(first_page) * kPageTokens;
  const int64_t chunk_tokens = int64_t(p.chunk_pages) * kPageTokens;
  const uint32_t my_tokens = static_cast<uint32_t>(tokens_left < 0 ? 0 : (tokens_left < chunk_tokens ? tokens_left : chunk_tokens));
  const bool final_output = active_chunks <= 1;

  // ---- prologue --------------------------------------------------------------------------
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kWarpgroupThreads);
    }
    FenceBarrierInit();
  }
  for (int i = tid; i < my_pages; i += kChunkThreads) {
    page_ids[i] = p.block_table[int64_t(b) * p.max_pages + first_page + i];
  }
  // Q rows swizzled exactly as TMA swizzles the K tiles (16-byte piece XOR row % 8). Staged before
  // the one CTA-wide barrier: a named barrier for the math warps alone was the only barrier
  // racecheck could not reconcile with the block-wide ones that follow.
  const uint4* q_row = reinterpret_cast<const uint4*>(p.q + int64_t(b) * kNumHeads * kHeadDim);
  for (int c = tid; c < kNumHeads * kHeadDim / 16; c += kChunkThreads) {
    const int head = c >> 3, piece = c & 7;
    *reinterpret_cast<uint4*>(s.q_tile + head * kHeadDim + ((piece ^ (head & 7)) << 4)) = q_row[c];
  }
  if (tid < kNumHeads) s.weights[tid] = p.weights[int64_t(b) * kNumHeads + tid];
  FenceProxyAsyncShared();
  __syncthreads();

  // ---- scoring ----------------------------------------------------------------------------
  if (tid >= kProducerThread) {
    // Lane 0 of each producer warp streams every kIssuerWarps-th page. One issuing thread
    // capped a CTA at one page per ~600 cycles; with 2-4 the CTA reaches its TMA unit's own
    // limit of ~450 cycles per 8.4 KB page (clock64 traces on H100).
    // Whole warps run the loop and stay converged (lane 0 issues): a warp that reaches the
    // next __syncthreads (an .aligned bar.sync) split across lanes is undefined behaviour;
    // compute-sanitizer racecheck caught the barriers after it drifting.
    const int pw = (tid - kProducerThread) / 32;
    const bool leader = (tid & 31) == 0;
    if (pw < kIssuerWarps) {
      if (pw == 0 && leader) PrefetchTensorMap(&k_map);
      for (int i = pw; i < my_pages; i += kIssuerWarps) {
        const int st = i % kStages;
        if (i >= kStages) MbarWait(&s.empty[st], ((i / kStages) - 1) & 1);
        const int32_t page = page_ids[i];
        if (leader) {
          if (page >= 0 && page < p.num_pages) {
            MbarArriveExpectTx(&s.full[st], kPageFp8Bytes + kScaleBytes);
            TmaLoad3d(s.ring.k_tiles[st], &k_map, 0, 0, page, &s.full[st]);
            BulkLoad(s.scales[st], p.k_cache + int64_t(page) * kPageBytes + kPageFp8Bytes, kScaleBytes,
                     &s.full[st]);
          } else {
            MbarArrive(&s.full[st]);  // nothing to load: the consumers see the invalid id themselves
          }
        }
        __syncwarp();
      }
    }
  } else {

    const int wg = tid / kWarpgroupThreads, warp = (tid % kWarpgroupThreads) / 32, lane = tid % 32;
    // Accumulator layout of wgmma m64nN: thread holds rows r0 and r0 + 8, columns
    // 8j + 2 * (lane % 4) + {0, 1} for j < 8. Keep the matching head weights in registers.
    const int r0 = 16 * warp + lane / 4;
    float w[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      w[2 * j] = s.weights[8 * j + 2 * (lane % 4)];
      w[2 * j + 1] = s.weights[8 * j + 2 * (lane % 4) + 1];
    }
    const uint64_t desc_q = SmemDescSw128(s.q_tile);

    for (int i = wg; i < my_pages; i += kMathWarpgroups) {
      const int stage = i % kStages;
      MbarWait(&s.full[stage], (i / kStages) & 1);
      const int32_t page = page_ids[i];
      const bool valid = page >= 0 && page < p.num_pages;  // uniform over the warpgroup
      float acc[32];
      float scale0 = 0.0f, scale1 = 0.0f;
      if (valid) {
#pragma unroll
        for (int x = 0; x < 32; ++x) acc[x] = 0.0f;
        FenceOperand(acc);
        WgmmaFence();
        const uint64_t desc_k = SmemDescSw128(s.ring.k_tiles[stage]);
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 32; ++kk) {
          WgmmaM64N64K32E4M3(acc, DescAdvance(desc_k, kk * 32), DescAdvance(desc_q, kk * 32), kk > 0);
        }
        WgmmaCommit();
        scale0 = s.scales[stage][r0];  // overlaps the tensor-core work
        scale1 = s.scales[stage][r0 + 8];
        WgmmaWait<0>();
        FenceOperand(acc);
      }
      MbarArrive(&s.empty[stage]);  // this thread no longer reads the stage
      const uint32_t t0 = uint32_t(i) * kPageTokens + r0, t1 = t0 + 8;
      uint32_t k0 = kNotCandidate, k1 = kNotCandidate;
      if (valid) {
        const float s0 = TokenScore(acc, 0, scale0, w), s1 = TokenScore(acc, 2, scale1, w);
        k0 = ScoreToKey(s0);
        k1 = ScoreToKey(s1);
      }
      if (lane % 4 == 0) {
        if (t0 < my_tokens) keys[t0] = k0;
        if (t1 < my_tokens) keys[t1] = k1;
      }
    }
  }
  __syncthreads();

  // ---- selection --------------------------------------------------------------------------
  const Threshold th =
      my_tokens <= uint32_t(p.topk)
          ? kTakeAll
          : FindThreshold<kChunkThreads>(s.select, uint32_t(p.topk), [&](auto&& f) {
              for (uint32_t t = tid; t < my_tokens; t += kChunkThreads) f(keys[t]);
            });
  auto visit = [&](uint32_t begin, uint32_t end, auto&& f) {
    for (uint32_t t = begin; t < end; ++t) f(t, keys[t]);
  };
  auto global_id = [&](uint32_t t) {
    return static_cast<int32_t>(int64_t(page_ids[t / kPageTokens]) * kPageTokens + t % kPageTokens);
  };
  if (final_output) {
    int32_t* out = p.topk_indices + int64_t(b) * p.topk;
    if (!p.sorted) {
      const uint32_t selected = EmitOrdered<kChunkThreads>(
          s.select, my_tokens, th, visit, [&](uint32_t slot, uint32_t t, uint32_t) { out[slot] = global_id(t); });
      for (int i = selected + tid; i < p.topk; i += kChunkThreads) out[i] = -1;
    } else {
      const uint32_t selected = EmitOrdered<kChunkThreads>(
          s.select, my_tokens, th, visit,
          [&](uint32_t slot, uint32_t t, uint32_t key) { s.ring.sorting.words[slot] = RankWord(key, t); });
      SortSelectedDescending<kChunkThreads>(s.ring.sorting, selected);
      for (int i = tid; i < p.topk; i += kChunkThreads) {
        out[i] = i < int(selected) ? global_id(RankWordPosition(s.ring.sorting.words[i])) : -1;
      }
    }
  } else {
    const int64_t slot0 = (int64_t(b) * p.chunks_per_row + chunk) * p.cand_stride;
    const uint32_t position0 = uint32_t(first_page) * kPageTokens;
    const uint32_t selected =
        EmitOrdered<kChunkThreads>(s.select, my_tokens, th, visit, [&](uint32_t slot, uint32_t t, uint32_t key) {
          p.cand_keys[slot0 + slot] = key;
          p.cand_pos[slot0 + slot] = int32_t(position0 + t);
        });
    if (tid == 0) p.cand_count[int64_t(b) * p.chunks_per_row + chunk] = int32_t(selected);
  }
}

}  // namespace ffi_dsa::sm90
