// The FP32 kernel of one SIMD variant (AVX2, AVX-512), included after variant_common.h inside the
// variant's namespace, which also defines kHeadVecsPerBlock (head vectors per register block).
// FP8 x FP8 products are exact in float32 (4 x 4 significant bits), so FMA changes no product.
// Heads are the vector lanes, tokens are broadcast: a register block holds kTokensPerBlock tokens
// x kVecsPerBlock<H> vectors of accumulators.
// No include guard: included once per variant namespace (score_simd.h).

constexpr int kTokensPerBlock = 6;
constexpr int kTailTokens = kPageTokens % kTokensPerBlock;  // the page's last, shorter block
static_assert(kTailTokens > 0);
// 32 heads may fill fewer vectors than a block holds.
template <int kHeads>
constexpr int kVecsPerBlock = kHeadVecs<kHeads> < kHeadVecsPerBlock ? kHeadVecs<kHeads> : kHeadVecsPerBlock;
static_assert(kNumHeads % (kLanes * kVecsPerBlock<kNumHeads>) == 0 &&
              kNumHeadsNarrow % (kLanes * kVecsPerBlock<kNumHeadsNarrow>) == 0);

// A query row prepared once per work item: q transposed to [D][H] so a vector spans heads.
template <int kHeads>
struct PreparedQuery {
  alignas(64) float q_t[kHeadDim][kHeads];
  alignas(64) float weights[kHeads];
};

template <int kHeads>
FFI_DSA_CPU_TARGET inline void PrepareQuery(const uint8_t* q_row, const float* weights_row,
                                            PreparedQuery<kHeads>* out) {
  const auto& table = E4M3Table();
  for (int h = 0; h < kHeads; ++h) {
    for (int d = 0; d < kHeadDim; ++d) out->q_t[d][h] = table[q_row[h * kHeadDim + d]];
    out->weights[h] = weights_row[h];
  }
}

// logits[i][h] = sum_d q[h][d] * k[i][d] for kTok decoded token rows k [kTok][kHeadDim].
template <int kTok, int kHeads>
FFI_DSA_CPU_TARGET inline void LogitsBlock(const PreparedQuery<kHeads>& pq, const float* k, float* logits) {
  constexpr int kVecs = kVecsPerBlock<kHeads>;
  for (int h0 = 0; h0 < kHeads; h0 += kLanes * kVecs) {
    VecF acc[kTok][kVecs] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      VecF q[kVecs];
#pragma GCC unroll 8
      for (int j = 0; j < kVecs; ++j) q[j] = LoadF(&pq.q_t[d][h0 + j * kLanes]);
#pragma GCC unroll 8
      for (int i = 0; i < kTok; ++i) {
        const float kv = k[i * kHeadDim + d];
#pragma GCC unroll 8
        for (int j = 0; j < kVecs; ++j) acc[i][j] += q[j] * kv;
      }
    }
    for (int i = 0; i < kTok; ++i) {
      for (int j = 0; j < kVecs; ++j) StoreF(logits + i * kHeads + h0 + j * kLanes, acc[i][j]);
    }
  }
}

// Decodes each block of the page's tokens once and scores it for every query that sees it.
template <int kHeads>
FFI_DSA_CPU_TARGET inline void ScorePage(const PageQueries<PreparedQuery<kHeads>>& queries, const uint8_t* page) {
  alignas(64) float scale[kPageTokens];
  alignas(64) float k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kHeads];
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed
  const int decoded = queries.MaxCount();
  for (int t0 = 0; t0 < decoded; t0 += kTokensPerBlock) {
    // A block may run past a query's count: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += kLanes) StoreF(k + e, DecodeE4M3(page + t0 * kHeadDim + e));
    if (full) {
      ScoreBlock<kHeads, LogitsBlock<kTokensPerBlock, kHeads>>(queries, k, scale, t0, rows, logits);
    } else {
      ScoreBlock<kHeads, LogitsBlock<kTailTokens, kHeads>>(queries, k, scale, t0, rows, logits);
    }
  }
}
