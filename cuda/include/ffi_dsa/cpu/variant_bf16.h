// The BF16 kernel (vdpbf16ps), included after variant_common.h inside namespace avx512bf16.
// Each FP8 value becomes an exact BF16 and each product of two of them is exact; vdpbf16ps adds
// the two products of a pair to an FP32 accumulator, so the scores keep FP32 accumulation like
// the FP32 variants (only the order of the adds differs). Heads are the vector lanes, a token's
// (d, d + 1) pair is broadcast: a register block holds kTokensPerBlock tokens x 4 vectors (64 heads).
// No include guard: included once per variant namespace (score_simd.h).

constexpr int kPairs = kHeadDim / 2;
constexpr int kTokensPerBlock = 6;                          // 24 accumulators of 32 zmm registers
constexpr int kTailTokens = kPageTokens % kTokensPerBlock;  // the page's last, shorter block
static_assert(kTailTokens > 0 && kHeadVecs * kLanes == kNumHeads);

// A query row prepared once per work item: for each pair p and head h, the 32-bit word holding
// BF16 q[h][2p] (low half) and q[h][2p + 1] (high half), the layout vdpbf16ps pairs with k.
struct PreparedQuery {
  alignas(64) uint32_t q_pairs[kPairs][kNumHeads];
  alignas(64) float weights[kNumHeads];
};

FFI_DSA_CPU_TARGET inline void PrepareQuery(const uint8_t* q_row, const float* weights_row, PreparedQuery* out) {
  const auto& table = E4M3Bf16Table();
  for (int h = 0; h < kNumHeads; ++h) {
    const uint8_t* q = q_row + h * kHeadDim;
    for (int p = 0; p < kPairs; ++p) out->q_pairs[p][h] = table[q[2 * p]] | (uint32_t{table[q[2 * p + 1]]} << 16);
    out->weights[h] = weights_row[h];
  }
}

// 2 * kLanes FP8 bytes to BF16; exact, since every E4M3 value is a BF16 value.
FFI_DSA_CPU_TARGET inline void DecodeE4M3ToBf16(const uint8_t* bytes, uint16_t* out) {
  const __m512 low = DecodeE4M3(bytes), high = DecodeE4M3(bytes + kLanes);
  _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(high, low));
}

// logits[i][h] = sum_d q[h][d] * k[i][d] for kTok BF16 token rows k [kTok][kHeadDim].
template <int kTok>
FFI_DSA_CPU_TARGET inline void LogitsBlock(const PreparedQuery& pq, const uint16_t* k, float* logits) {
  __m512 acc[kTok][kHeadVecs];
#pragma GCC unroll 8
  for (int i = 0; i < kTok; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kHeadVecs; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kPairs; ++p) {
    __m512bh q[kHeadVecs];
#pragma GCC unroll 4
    for (int j = 0; j < kHeadVecs; ++j) q[j] = (__m512bh)_mm512_load_si512(&pq.q_pairs[p][j * kLanes]);
#pragma GCC unroll 8
    for (int i = 0; i < kTok; ++i) {
      uint32_t pair;
      std::memcpy(&pair, k + i * kHeadDim + 2 * p, sizeof(pair));
      const __m512bh kk = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
      for (int j = 0; j < kHeadVecs; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], q[j], kk);
    }
  }
  for (int i = 0; i < kTok; ++i) {
    for (int j = 0; j < kHeadVecs; ++j) _mm512_store_ps(logits + i * kNumHeads + j * kLanes, acc[i][j]);
  }
}

// Writes the rank keys of the first `count` tokens of `page` (count <= 64).
FFI_DSA_CPU_TARGET inline void ScorePage(const PreparedQuery& pq, const uint8_t* page, int count, uint32_t* keys) {
  alignas(64) float scale[kPageTokens];
  alignas(64) uint16_t k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kNumHeads];
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed
  for (int t0 = 0; t0 < count; t0 += kTokensPerBlock) {
    // A block may run past `count`: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += 2 * kLanes) DecodeE4M3ToBf16(page + t0 * kHeadDim + e, k + e);
    if (full) {
      LogitsBlock<kTokensPerBlock>(pq, k, logits);
    } else {
      LogitsBlock<kTailTokens>(pq, k, logits);
    }
    ScoreTokens(logits, pq.weights, scale + t0, rows < count - t0 ? rows : count - t0, keys + t0);
  }
}
