// What every MXFP4 scoring variant shares (docs/contract.md §9): the decoded query of the FP32
// variants (scalar, AVX2, AVX-512), the decoded scales of a query and of a page, and the unit scales
// that let the MXFP4 variants reuse the FP8 variants' per-token scoring (their scales act on each
// block sum, so the per-token scale of the FP8 page is 1).
#pragma once
#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/row_pages.h"
#include "ffi_dsa/mxfp4_e2m1.h"

namespace ffi_dsa::cpu {

// A query row decoded once per work item: E2M1 values transposed to [D][H] (a vector spans heads)
// and unscaled, so that each 32-element block sum is exact; the block scales apart.
template <int kHeads>
struct Mxfp4QueryF32 {
  alignas(64) float q_t[kHeadDim][kHeads];
  alignas(64) float q_scale[kMxfp4Blocks][kHeads];  // 2^(byte - 127), NaN for byte 255
  alignas(64) float weights[kHeads];
};

// The scales and weights of a query row, for any variant's prepared query.
template <int kHeads, typename Query>
inline void FillMxfp4ScalesAndWeights(const QueryRowView& v, Query* out) {
  for (int h = 0; h < kHeads; ++h) {
    for (int c = 0; c < kMxfp4Blocks; ++c) out->q_scale[c][h] = DecodeUe8m0(ScaleByte(v.q_scale[h], c));
    out->weights[h] = v.weights[h];
  }
}

template <int kHeads>
inline void PrepareMxfp4QueryF32(const QueryRowView& v, Mxfp4QueryF32<kHeads>* out) {
  const auto& pairs = E2M1PairTable();
  for (int h = 0; h < kHeads; ++h) {
    for (int j = 0; j < kMxfp4HeadBytes; ++j) {
      const auto& pair = pairs[v.q[h * kMxfp4HeadBytes + j]];
      out->q_t[2 * j][h] = pair[0];
      out->q_t[2 * j + 1][h] = pair[1];
    }
  }
  FillMxfp4ScalesAndWeights<kHeads>(v, out);
}

// A block sum times its two scales, 2^(sq - 127) * 2^(sk - 127) first: that product is exactly
// 2^(sq + sk - 254) whenever that is a float32 value (either factor alone may be far from it:
// 2^123 * 2^-123), and then so is its product with the sum whenever that is one. Every variant
// multiplies in this order (the SIMD ones inline it on vectors).
inline float ScaleBlockSum(float block_sum, float q_scale, float k_scale) { return block_sum * (q_scale * k_scale); }

// The block scales of a page's 64 tokens, [token][block] (each variant reads those of the tokens it decodes).
inline void DecodePageScales(const uint8_t* page, float (*scale)[kMxfp4Blocks]) {
  const uint8_t* bytes = page + kMxfp4PageValueBytes;
  for (int t = 0; t < kPageTokens; ++t) {
    for (int c = 0; c < kMxfp4Blocks; ++c) scale[t][c] = DecodeUe8m0(bytes[t * kMxfp4Blocks + c]);
  }
}

// A decoded block of tokens as a variant's logits function reads it: values [tokens][D] (float32 or
// BF16 bits) and their block scales [tokens][kMxfp4Blocks].
template <typename Value>
struct Mxfp4Tokens {
  const Value* values;
  const float (*scale)[kMxfp4Blocks];
};

// The per-token scale the FP8 variants' scoring multiplies a logit by: 1 for MXFP4 (exact).
inline const float* UnitScales() {
  alignas(64) static const float ones[kPageTokens] = {
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  return ones;
}

}  // namespace ffi_dsa::cpu
