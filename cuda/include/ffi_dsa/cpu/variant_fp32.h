// The FP32 kernel of one SIMD variant (AVX2, AVX-512), included after variant_common.h inside the
// variant's namespace, which also defines kHeadVecsPerBlock (head vectors per register block).
// FP8 x FP8 products are exact in float32 (4 x 4 significant bits), so FMA changes no product.
// Heads are the vector lanes, tokens are broadcast: a register block holds kTokensPerBlock tokens
// x kHeadVecsPerBlock vectors of accumulators.
// No include guard: included once per variant namespace (score_simd.h).

constexpr int kTokensPerBlock = 6;
constexpr int kTailTokens = kPageTokens % kTokensPerBlock;  // the page's last, shorter block
static_assert(kTailTokens > 0 && kNumHeads % (kLanes * kHeadVecsPerBlock) == 0);

// A query row prepared once per work item: q transposed to [D][H] so a vector spans heads.
struct PreparedQuery {
  alignas(64) float q_t[kHeadDim][kNumHeads];
  alignas(64) float weights[kNumHeads];
};

FFI_DSA_CPU_TARGET inline void PrepareQuery(const uint8_t* q_row, const float* weights_row, PreparedQuery* out) {
  const auto& table = E4M3Table();
  for (int h = 0; h < kNumHeads; ++h) {
    for (int d = 0; d < kHeadDim; ++d) out->q_t[d][h] = table[q_row[h * kHeadDim + d]];
    out->weights[h] = weights_row[h];
  }
}

// logits[i][h] = sum_d q[h][d] * k[i][d] for kTok decoded token rows k [kTok][kHeadDim].
template <int kTok>
FFI_DSA_CPU_TARGET inline void LogitsBlock(const PreparedQuery& pq, const float* k, float* logits) {
  for (int h0 = 0; h0 < kNumHeads; h0 += kLanes * kHeadVecsPerBlock) {
    VecF acc[kTok][kHeadVecsPerBlock] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      VecF q[kHeadVecsPerBlock];
#pragma GCC unroll 8
      for (int j = 0; j < kHeadVecsPerBlock; ++j) q[j] = LoadF(&pq.q_t[d][h0 + j * kLanes]);
#pragma GCC unroll 8
      for (int i = 0; i < kTok; ++i) {
        const float kv = k[i * kHeadDim + d];
#pragma GCC unroll 8
        for (int j = 0; j < kHeadVecsPerBlock; ++j) acc[i][j] += q[j] * kv;
      }
    }
    for (int i = 0; i < kTok; ++i) {
      for (int j = 0; j < kHeadVecsPerBlock; ++j) StoreF(logits + i * kNumHeads + h0 + j * kLanes, acc[i][j]);
    }
  }
}

// Writes the rank keys of the first `count` tokens of `page` (count <= 64).
FFI_DSA_CPU_TARGET inline void ScorePage(const PreparedQuery& pq, const uint8_t* page, int count, uint32_t* keys) {
  alignas(64) float scale[kPageTokens];
  alignas(64) float k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kNumHeads];
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed
  for (int t0 = 0; t0 < count; t0 += kTokensPerBlock) {
    // A block may run past `count`: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += kLanes) StoreF(k + e, DecodeE4M3(page + t0 * kHeadDim + e));
    if (full) {
      LogitsBlock<kTokensPerBlock>(pq, k, logits);
    } else {
      LogitsBlock<kTailTokens>(pq, k, logits);
    }
    ScoreTokens(logits, pq.weights, scale + t0, rows < count - t0 ? rows : count - t0, keys + t0);
  }
}
