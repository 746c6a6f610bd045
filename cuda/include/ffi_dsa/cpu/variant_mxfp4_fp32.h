// The MXFP4 kernel of the FP32 SIMD variants (AVX2, AVX-512), included after variant_common.h and
// variant_fp32.h inside the variant's namespace, which also defines DecodeE2M1Lanes (kLanes E2M1
// values of kLanes / 2 bytes to float32). FP8's register blocks (kTokensPerBlock tokens x
// kVecsPerBlock<H> head vectors, heads as lanes, tokens broadcast), run once per 32-element block:
// E2M1 products are exact in float32 and a block's 32 of them add exactly, so each block sum is
// exact before its two scales (powers of two) multiply it, their product first (mxfp4_query.h).
// No include guard: included once per variant namespace (mxfp4_simd.h).

template <int kHeads>
using Mxfp4PreparedQuery = Mxfp4QueryF32<kHeads>;

template <int kHeads>
FFI_DSA_CPU_TARGET inline void PrepareMxfp4Query(const QueryRowView& v, Mxfp4PreparedQuery<kHeads>* out) {
  PrepareMxfp4QueryF32<kHeads>(v, out);
}

// logits[i][h] = sum_c q_scale[c][h] * k_scale[i][c] * sum_{d in block c} q[h][d] * k[i][d] for kTok
// decoded tokens. Each block's partial adds into `logits` (memory, L1): FP8's register block holds
// the block sums, and keeping the running logits in registers beside them measured slower here.
template <int kTok, int kHeads>
FFI_DSA_CPU_TARGET inline void Mxfp4LogitsBlock(const Mxfp4PreparedQuery<kHeads>& pq, const Mxfp4Tokens<float>* k,
                                                float* logits) {
  constexpr int kVecs = kVecsPerBlock<kHeads>;
  for (int h0 = 0; h0 < kHeads; h0 += kLanes * kVecs) {
    for (int c = 0; c < kMxfp4Blocks; ++c) {
      VecF acc[kTok][kVecs] = {};
      for (int d = c * kMxfp4Block; d < (c + 1) * kMxfp4Block; ++d) {
        VecF q[kVecs];
#pragma GCC unroll 8
        for (int j = 0; j < kVecs; ++j) q[j] = LoadF(&pq.q_t[d][h0 + j * kLanes]);
#pragma GCC unroll 8
        for (int i = 0; i < kTok; ++i) {
          const float kv = k->values[i * kHeadDim + d];
#pragma GCC unroll 8
          for (int j = 0; j < kVecs; ++j) acc[i][j] += q[j] * kv;
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < kTok; ++i) {
        const float ks = k->scale[i][c];
#pragma GCC unroll 8
        for (int j = 0; j < kVecs; ++j) {
          float* out = logits + i * kHeads + h0 + j * kLanes;
          const VecF part = acc[i][j] * (LoadF(&pq.q_scale[c][h0 + j * kLanes]) * ks);  // ScaleBlockSum
          StoreF(out, c == 0 ? part : LoadF(out) + part);
        }
      }
    }
  }
}

// Decodes each block of the page's tokens once and scores it for every query that sees it.
template <int kHeads>
FFI_DSA_CPU_TARGET inline void ScoreMxfp4Page(const PageQueries<Mxfp4PreparedQuery<kHeads>>& queries,
                                              const uint8_t* page) {
  alignas(64) float scale[kPageTokens][kMxfp4Blocks];
  alignas(64) float k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kHeads];
  DecodePageScales(page, scale);
  const int decoded = queries.MaxCount();
  for (int t0 = 0; t0 < decoded; t0 += kTokensPerBlock) {
    // A block may run past a query's count: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += kLanes) {
      StoreF(k + e, DecodeE2M1Lanes(page + (t0 * kHeadDim + e) / 2));
    }
    const Mxfp4Tokens<float> tokens{k, scale + t0};
    if (full) {
      ScoreBlock<kHeads, Mxfp4LogitsBlock<kTokensPerBlock, kHeads>>(queries, &tokens, UnitScales(), t0, rows, logits);
    } else {
      ScoreBlock<kHeads, Mxfp4LogitsBlock<kTailTokens, kHeads>>(queries, &tokens, UnitScales(), t0, rows, logits);
    }
  }
}
