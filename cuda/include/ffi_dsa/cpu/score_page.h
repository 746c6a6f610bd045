// CPU scoring of one 64-token page against the query rows that see it, the hot loop of the CPU
// path: the portable variant ("scalar"), plain fixed-trip loops the compiler may vectorize for the
// build's baseline ISA. The SIMD variants (score_simd.h) compute the same scores with explicit
// vectors. Every variant is a template on the head count H (kNumHeads or kNumHeadsNarrow), so a
// 32-head query is scored as exactly 32 heads.
#pragma once
#include <cstdint>
#include <cstring>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/fp8_e4m3.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu {

// relu that keeps NaN (std::max(x, 0) would turn NaN into 0, against the SPEC).
inline float ReluKeepNaN(float x) { return x < 0.0f ? 0.0f : x; }

namespace scalar {

// A query row prepared once per work item: q transposed to [D][H] so the inner loop runs over heads.
template <int kHeads>
struct PreparedQuery {
  alignas(64) float q_t[kHeadDim][kHeads];
  alignas(64) float weights[kHeads];
};

template <int kHeads>
inline void PrepareQuery(const uint8_t* q_row, const float* weights_row, PreparedQuery<kHeads>* out) {
  const auto& table = E4M3Table();
  for (int h = 0; h < kHeads; ++h) {
    for (int d = 0; d < kHeadDim; ++d) out->q_t[d][h] = table[q_row[h * kHeadDim + d]];
    out->weights[h] = weights_row[h];
  }
}

constexpr int kTokenBlock = 4;  // tokens per register block: 4 x H fp32 accumulators

// Rank keys of the first `count` tokens of the decoded page k against one query.
template <int kHeads>
inline void ScoreDecoded(const PreparedQuery<kHeads>& pq, const float (*k)[kHeadDim], const float* scale,
                         int count, uint32_t* keys) {
  for (int t0 = 0; t0 < count; t0 += kTokenBlock) {
    alignas(64) float acc[kTokenBlock][kHeads] = {};
    for (int d = 0; d < kHeadDim; ++d) {
#pragma GCC unroll 4
      for (int i = 0; i < kTokenBlock; ++i) {
        const float kv = k[t0 + i][d];
#pragma GCC ivdep
        for (int h = 0; h < kHeads; ++h) acc[i][h] += kv * pq.q_t[d][h];
      }
    }
    for (int i = 0; i < kTokenBlock && t0 + i < count; ++i) {
      float score = 0.0f;
      for (int h = 0; h < kHeads; ++h) score += pq.weights[h] * ReluKeepNaN(acc[i][h] * scale[t0 + i]);
      keys[t0 + i] = ScoreToKey(score);
    }
  }
}

// Decodes the tokens of `page` any of the queries sees once, then scores them for each query.
template <int kHeads>
inline void ScorePage(const PageQueries<PreparedQuery<kHeads>>& queries, const uint8_t* page) {
  const auto& table = E4M3Table();
  alignas(64) float k[kPageTokens][kHeadDim];
  float scale[kPageTokens];
  const int padded = (queries.MaxCount() + kTokenBlock - 1) / kTokenBlock * kTokenBlock;
  for (int t = 0; t < padded; ++t) {
    const uint8_t* row = page + t * kHeadDim;  // rows past the counts exist (same page) but are unused
    for (int d = 0; d < kHeadDim; ++d) k[t][d] = table[row[d]];
  }
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed
  for (int i = 0; i < queries.size; ++i) {
    ScoreDecoded(*queries.query[i], k, scale, queries.count[i], queries.keys[i]);
  }
}

}  // namespace scalar
}  // namespace ffi_dsa::cpu
