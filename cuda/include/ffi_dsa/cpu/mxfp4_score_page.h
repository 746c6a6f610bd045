// The portable MXFP4 scoring variant ("scalar"): plain fixed-trip loops over one 64-token page of
// 68-byte tokens, as score_page.h is for FP8 pages. Each head's logit is the sum over its 4 blocks
// of (exact 32-element block sum) x 2^(query's byte - 127) x 2^(token's byte - 127).
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/mxfp4_query.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/cpu/score_page.h"
#include "ffi_dsa/mxfp4_e2m1.h"
#include "ffi_dsa/rank_key.h"

namespace ffi_dsa::cpu::scalar {

template <int kHeads>
using Mxfp4PreparedQuery = Mxfp4QueryF32<kHeads>;

template <int kHeads>
inline void PrepareMxfp4Query(const QueryRowView& v, Mxfp4PreparedQuery<kHeads>* out) {
  PrepareMxfp4QueryF32<kHeads>(v, out);
}

// Rank keys of the first `count` tokens of the decoded page k against one query.
template <int kHeads>
inline void ScoreMxfp4Decoded(const Mxfp4PreparedQuery<kHeads>& pq, const float (*k)[kHeadDim],
                              const float (*scale)[kMxfp4Blocks], int count, uint32_t* keys) {
  for (int t0 = 0; t0 < count; t0 += kTokenBlock) {
    alignas(64) float logit[kTokenBlock][kHeads] = {};
    for (int c = 0; c < kMxfp4Blocks; ++c) {
      alignas(64) float acc[kTokenBlock][kHeads] = {};
      for (int d = c * kMxfp4Block; d < (c + 1) * kMxfp4Block; ++d) {
#pragma GCC unroll 4
        for (int i = 0; i < kTokenBlock; ++i) {
          const float kv = k[t0 + i][d];
#pragma GCC ivdep
          for (int h = 0; h < kHeads; ++h) acc[i][h] += kv * pq.q_t[d][h];
        }
      }
      for (int i = 0; i < kTokenBlock; ++i) {
        const float ks = scale[t0 + i][c];
        for (int h = 0; h < kHeads; ++h) logit[i][h] += ScaleBlockSum(acc[i][h], pq.q_scale[c][h], ks);
      }
    }
    for (int i = 0; i < kTokenBlock && t0 + i < count; ++i) {
      float score = 0.0f;
      for (int h = 0; h < kHeads; ++h) score += pq.weights[h] * ReluKeepNaN(logit[i][h]);
      keys[t0 + i] = ScoreToKey(score);
    }
  }
}

// Decodes the tokens of `page` any of the queries sees once, then scores them for each query.
template <int kHeads>
inline void ScoreMxfp4Page(const PageQueries<Mxfp4PreparedQuery<kHeads>>& queries, const uint8_t* page) {
  const auto& pairs = E2M1PairTable();
  alignas(64) float k[kPageTokens][kHeadDim];
  float scale[kPageTokens][kMxfp4Blocks];
  const int padded = (queries.MaxCount() + kTokenBlock - 1) / kTokenBlock * kTokenBlock;
  for (int t = 0; t < padded; ++t) {
    const uint8_t* row = page + t * kMxfp4HeadBytes;  // rows past the counts exist (same page) but are unused
    for (int j = 0; j < kMxfp4HeadBytes; ++j) {
      k[t][2 * j] = pairs[row[j]][0];
      k[t][2 * j + 1] = pairs[row[j]][1];
    }
  }
  DecodePageScales(page, scale);
  for (int i = 0; i < queries.size; ++i) {
    ScoreMxfp4Decoded(*queries.query[i], k, scale, queries.count[i], queries.keys[i]);
  }
}

}  // namespace ffi_dsa::cpu::scalar
