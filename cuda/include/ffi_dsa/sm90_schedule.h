// Host-side schedule of the Hopper path, from shapes only (seq_lens stays on the device, so the
// launch is the same on every call and can be captured in a CUDA graph).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ffi_dsa/contract.h"

namespace ffi_dsa::sm90 {

struct ChunkSchedule {
  int32_t chunk_pages;     // pages one CTA scores
  int32_t chunks_per_row;  // grid.y; chunks past a row's length exit at once
  int32_t cand_stride;     // workspace slots per chunk: min(K, chunk tokens)
};

// Enough CTAs to cover the SMs twice, but:
//  - no chunk holds more than kMaxChunkPages (its keys live in shared memory);
//  - chunks of fewer than K tokens add merge work and save nothing in selection, so rows are
//    split finer only to fill the machine;
//  - at most kMaxMergeChunks chunks per row unless a row is too long for that, which bounds the
//    merge kernel's candidate count at kMaxMergeChunks * K.
inline ChunkSchedule PlanChunks(int64_t batch, int64_t max_pages, int64_t topk, int num_sms) {
  constexpr int64_t kMaxChunkPages = 256;  // 16K tokens = 64 KB of keys
  constexpr int64_t kMaxMergeChunks = 16;
  const int64_t pages = std::max<int64_t>(1, max_pages);
  const int64_t target_ctas = 2 * static_cast<int64_t>(std::max(1, num_sms));
  const int64_t want_chunks = std::max<int64_t>(1, (target_ctas + batch - 1) / std::max<int64_t>(1, batch));
  int64_t chunk_pages = (pages + want_chunks - 1) / want_chunks;
  chunk_pages = std::max(chunk_pages, std::min<int64_t>(pages, std::max<int64_t>(1, topk / kPageTokens)));
  chunk_pages = std::max(chunk_pages, (pages + kMaxMergeChunks - 1) / kMaxMergeChunks);
  chunk_pages = std::clamp<int64_t>(chunk_pages, 1, kMaxChunkPages);
  ChunkSchedule s;
  s.chunk_pages = static_cast<int32_t>(chunk_pages);
  s.chunks_per_row = static_cast<int32_t>((pages + chunk_pages - 1) / chunk_pages);
  s.cand_stride = static_cast<int32_t>(std::min<int64_t>(topk, chunk_pages * kPageTokens));
  return s;
}

}  // namespace ffi_dsa::sm90
