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

// Measured on H100: one CTA streams at most ~33 GB/s (its TMA unit issues one 8.4 KB page per
// ~450 cycles), so a row must be spread over many CTAs to be fast, while 132 CTAs already
// out-pull HBM. So: about two CTAs per SM in all, one chunk per row once the batch alone fills
// the machine, and no chunk over kMaxChunkPages (its keys live in shared memory). Chunks of
// fewer than K tokens pass all their tokens to the merge, which holds them in shared memory: a
// row with more tokens than that is cut into fewer chunks of more than K tokens, whose local
// top-K keeps the merge's input at chunks * K.
inline ChunkSchedule PlanChunks(int64_t batch, int64_t max_pages, int64_t topk, int num_sms,
                                int64_t merge_capacity) {
  constexpr int64_t kMaxChunkPages = 240;  // 15K tokens = 60 KB of keys: what shared memory leaves
  const int64_t pages = std::max<int64_t>(1, max_pages);
  const int64_t target_ctas = 2 * static_cast<int64_t>(std::max(1, num_sms));
  int64_t chunks = std::clamp<int64_t>(target_ctas / std::max<int64_t>(1, batch), 1, pages);
  auto merge_keys = [&](int64_t c) {
    const int64_t chunk_pages = (pages + c - 1) / c;
    return c * std::min<int64_t>(topk, chunk_pages * kPageTokens);
  };
  if (chunks > 1 && merge_keys(chunks) > merge_capacity) {
    chunks = std::max<int64_t>(1, merge_capacity / std::max<int64_t>(1, topk));
  }
  chunks = std::max(chunks, (pages + kMaxChunkPages - 1) / kMaxChunkPages);
  ChunkSchedule s;
  s.chunk_pages = static_cast<int32_t>((pages + chunks - 1) / chunks);
  s.chunks_per_row = static_cast<int32_t>((pages + s.chunk_pages - 1) / s.chunk_pages);
  s.cand_stride = static_cast<int32_t>(std::min<int64_t>(topk, int64_t(s.chunk_pages) * kPageTokens));
  return s;
}

}  // namespace ffi_dsa::sm90
