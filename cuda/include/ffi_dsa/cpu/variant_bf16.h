// The BF16 kernel (vdpbf16ps), included after variant_common.h inside namespace avx512bf16.
// Each FP8 value becomes an exact BF16 and each product of two of them is exact; vdpbf16ps adds
// the two products of a pair to an FP32 accumulator, so the scores keep FP32 accumulation like
// the FP32 variants (only the order of the adds differs). Heads are the vector lanes, a token's
// (d, d + 1) pair is broadcast: a register block holds kTokensPerBlock tokens x all H heads.
// vdpbf16ps treats denormals as zero and ignores MXCSR, which changes nothing here: no E4M3 value is
// a BF16 denormal (the smallest is 2^-9), and every product is a multiple of 2^-18, so no partial
// sum is a float32 denormal either.
// No include guard: included once per variant namespace (score_simd.h).

constexpr int kPairs = kHeadDim / 2;
constexpr int kBf16PerVector = 2 * kLanes;
constexpr int kTokensPerBlock = 6;                          // 64 heads: 24 accumulators of 32 zmm registers
constexpr int kTailTokens = kPageTokens % kTokensPerBlock;  // the page's last, shorter block
static_assert(kTailTokens > 0);

// A query row prepared once per work item: for each pair p and head h, the 32-bit word holding
// BF16 q[h][2p] (low half) and q[h][2p + 1] (high half), the layout vdpbf16ps pairs with k.
template <int kHeads>
struct PreparedQuery {
  alignas(64) uint32_t q_pairs[kPairs][kHeads];
  alignas(64) float weights[kHeads];
};

// BF16 bits of the 8 E4M3 subnormal magnitudes (m * 2^-9, m < 8) in the low words of a vector,
// the table DecodeE4M3ToBf16 looks them up in.
FFI_DSA_CPU_TARGET inline __m512i SubnormalBf16Table() {
  constexpr __mmask32 kFirstEight = 0xFF;
  return _mm512_maskz_loadu_epi16(kFirstEight, E4M3Bf16Table().data());
}

// 32 FP8 bytes to BF16, exactly, in 16-bit lanes (every E4M3 value is a BF16 value): normal numbers
// move their exponent bias from 7 to 127 and their 3 mantissa bits up to BF16's 7, subnormals come
// from the table, 0x7F/0xFF are NaN. Under half the instructions of decoding to float32 first.
FFI_DSA_CPU_TARGET inline void DecodeE4M3ToBf16(const uint8_t* bytes, __m512i subnormal_table, uint16_t* out) {
  constexpr short kMagnitudeMask = 0x7F, kSignBit = 0x80, kNaNMagnitude = 0x7F, kFirstNormal = 8;
  constexpr short kExponentRebias = (127 - 7) << 7;
  constexpr int kMantissaShift = 7 - 3, kSignShift = 15 - 7;
  constexpr short kBf16NaN = 0x7FC0;
  const __m512i byte = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  const __m512i magnitude = _mm512_and_si512(byte, _mm512_set1_epi16(kMagnitudeMask));
  const __m512i normal =
      _mm512_add_epi16(_mm512_slli_epi16(magnitude, kMantissaShift), _mm512_set1_epi16(kExponentRebias));
  const __mmask32 subnormal = _mm512_cmplt_epu16_mask(magnitude, _mm512_set1_epi16(kFirstNormal));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(magnitude, _mm512_set1_epi16(kNaNMagnitude));
  __m512i value = _mm512_mask_permutexvar_epi16(normal, subnormal, magnitude, subnormal_table);
  value = _mm512_mask_mov_epi16(value, nan, _mm512_set1_epi16(kBf16NaN));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(byte, _mm512_set1_epi16(kSignBit)), kSignShift);
  _mm512_storeu_si512(out, _mm512_or_si512(value, sign));
}

// Decodes each head's 128 FP8 values with the page decoder, then moves each (2p, 2p + 1) pair
// word from [h][p] to [p][h].
template <int kHeads>
FFI_DSA_CPU_TARGET inline void PrepareQuery(const uint8_t* q_row, const float* weights_row,
                                            PreparedQuery<kHeads>* out) {
  alignas(64) uint16_t decoded[kHeads][kHeadDim];
  const __m512i subnormal_table = SubnormalBf16Table();
  for (int h = 0; h < kHeads; ++h) {
    for (int e = 0; e < kHeadDim; e += kBf16PerVector) {
      DecodeE4M3ToBf16(q_row + h * kHeadDim + e, subnormal_table, &decoded[h][e]);
    }
  }
  // Word offsets of pair 0 of heads 0..15 in `decoded`; a gather per 16 heads moves one pair.
  constexpr int kWordsPerHead = kHeadDim / 2;
  const __m512i head_offsets = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(kWordsPerHead));
  for (int p = 0; p < kPairs; ++p) {
    for (int h0 = 0; h0 < kHeads; h0 += kLanes) {
      const __m512i pairs = _mm512_i32gather_epi32(head_offsets, &decoded[h0][2 * p], sizeof(uint32_t));
      _mm512_store_si512(&out->q_pairs[p][h0], pairs);
    }
  }
  std::memcpy(out->weights, weights_row, sizeof(out->weights));
}

// logits[i][h] = sum_d q[h][d] * k[i][d] for kTok BF16 token rows k [kTok][kHeadDim].
template <int kTok, int kHeads>
FFI_DSA_CPU_TARGET inline void LogitsBlock(const PreparedQuery<kHeads>& pq, const uint16_t* k, float* logits) {
  constexpr int kVecs = kHeadVecs<kHeads>;
  __m512 acc[kTok][kVecs];
#pragma GCC unroll 8
  for (int i = 0; i < kTok; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kPairs; ++p) {
    __m512bh q[kVecs];
#pragma GCC unroll 4
    for (int j = 0; j < kVecs; ++j) q[j] = (__m512bh)_mm512_load_si512(&pq.q_pairs[p][j * kLanes]);
#pragma GCC unroll 8
    for (int i = 0; i < kTok; ++i) {
      uint32_t pair;
      std::memcpy(&pair, k + i * kHeadDim + 2 * p, sizeof(pair));
      const __m512bh kk = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
      for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], q[j], kk);
    }
  }
  for (int i = 0; i < kTok; ++i) {
    for (int j = 0; j < kVecs; ++j) _mm512_store_ps(logits + i * kHeads + j * kLanes, acc[i][j]);
  }
}

// Decodes each block of the page's tokens once and scores it for every query that sees it.
template <int kHeads>
FFI_DSA_CPU_TARGET inline void ScorePage(const PageQueries<PreparedQuery<kHeads>>& queries, const uint8_t* page) {
  alignas(64) float scale[kPageTokens];
  alignas(64) uint16_t k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kHeads];
  std::memcpy(scale, page + kPageFp8Bytes, sizeof(scale));  // little-endian float32, as packed
  const __m512i subnormal_table = SubnormalBf16Table();
  const int decoded = queries.MaxCount();
  for (int t0 = 0; t0 < decoded; t0 += kTokensPerBlock) {
    // A block may run past a query's count: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += kBf16PerVector) {
      DecodeE4M3ToBf16(page + t0 * kHeadDim + e, subnormal_table, k + e);
    }
    if (full) {
      ScoreBlock<kHeads, LogitsBlock<kTokensPerBlock, kHeads>>(queries, k, scale, t0, rows, logits);
    } else {
      ScoreBlock<kHeads, LogitsBlock<kTailTokens, kHeads>>(queries, k, scale, t0, rows, logits);
    }
  }
}
