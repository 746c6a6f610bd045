// CPU scoring of one 64-token page against one query row, the hot loop of the CPU path: the
// portable variant ("scalar"), plain fixed-trip loops the compiler may vectorize for the build's
// baseline ISA. The SIMD variants (score_simd.h) compute the same scores with explicit vectors.
#pragma once
#include <cstdint>
#include <cstring>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/fp8_e4m3.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu {

// relu that keeps NaN (std::max(x, 0) would turn NaN into 0, against the SPEC).
inline float ReluKeepNaN(float x) { return x < 0.0f ? 0.0f : x; }

namespace scalar {

// A query row prepared once per work item: q transposed to [D][H] so the inner loop runs over heads.
struct PreparedQuery {
  alignas(64) float q_t[kHeadDim][kNumHeads];
  alignas(64) float weights[kNumHeads];
};

inline void PrepareQuery(const uint8_t* q_row, const float* weights_row, PreparedQuery* out) {
  const auto& table = E4M3Table();
  for (int h = 0; h < kNumHeads; ++h) {
    for (int d = 0; d < kHeadDim; ++d) out->q_t[d][h] = table[q_row[h * kHeadDim + d]];
    out->weights[h] = weights_row[h];
  }
}

constexpr int kTokenBlock = 4;  // tokens per register block: 4 x 64 fp32 accumulators

// Writes the rank keys of the first `count` tokens of `page` (count <= 64).
inline void ScorePage(const PreparedQuery& pq, const uint8_t* page, int count, uint32_t* keys) {
  const auto& table = E4M3Table();
  alignas(64) float k[kPageTokens][kHeadDim];
  float scale[kPageTokens];
  const int padded = (count + kTokenBlock - 1) / kTokenBlock * kTokenBlock;
  for (int t = 0; t < padded; ++t) {
    const uint8_t* row = page + t * kHeadDim;  // rows past `count` exist (same page) but are unused
    for (int d = 0; d < kHeadDim; ++d) k[t][d] = table[row[d]];
  }
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed

  for (int t0 = 0; t0 < padded; t0 += kTokenBlock) {
    alignas(64) float acc[kTokenBlock][kNumHeads] = {};
    for (int d = 0; d < kHeadDim; ++d) {
#pragma GCC unroll 4
      for (int i = 0; i < kTokenBlock; ++i) {
        const float kv = k[t0 + i][d];
#pragma GCC ivdep
        for (int h = 0; h < kNumHeads; ++h) acc[i][h] += kv * pq.q_t[d][h];
      }
    }
    for (int i = 0; i < kTokenBlock && t0 + i < count; ++i) {
      float score = 0.0f;
      for (int h = 0; h < kNumHeads; ++h) score += pq.weights[h] * ReluKeepNaN(acc[i][h] * scale[t0 + i]);
      keys[t0 + i] = ScoreToKey(score);
    }
  }
}

}  // namespace scalar
}  // namespace ffi_dsa::cpu
