// The MXFP4 kernel of the BF16 variant (vdpbf16ps), included after variant_common.h and
// variant_bf16.h inside namespace avx512bf16. Every E2M1 value is a BF16 value and the two products
// of a pair add exactly, so a block's 16 pair instructions leave its exact sum in an FP32
// accumulator (a multiple of 0.25 below 2^11: no denormal for vdpbf16ps to flush); the block's two
// scales then multiply it. Byte j of a token (or a head) is the pair (2j, 2j + 1) vdpbf16ps takes.
// No include guard: included once in namespace avx512bf16 (mxfp4_simd.h).

constexpr int kPairsPerMxfp4Block = kMxfp4Block / 2;

// A query row prepared once per work item: for each byte p and head h, the BF16 pair of the byte's two values.
template <int kHeads>
struct Mxfp4PreparedQuery {
  alignas(64) uint32_t q_pairs[kMxfp4HeadBytes][kHeads];
  alignas(64) float q_scale[kMxfp4Blocks][kHeads];  // 2^(byte - 127), NaN for byte 255
  alignas(64) float weights[kHeads];
};

template <int kHeads>
FFI_DSA_CPU_TARGET inline void PrepareMxfp4Query(const QueryRowView& v, Mxfp4PreparedQuery<kHeads>* out) {
  const auto& bf16 = E2M1Bf16Table();
  for (int h = 0; h < kHeads; ++h) {
    for (int p = 0; p < kMxfp4HeadBytes; ++p) {
      const uint8_t byte = v.q[h * kMxfp4HeadBytes + p];
      out->q_pairs[p][h] = static_cast<uint32_t>(bf16[byte & 0xF]) | static_cast<uint32_t>(bf16[byte >> 4]) << 16;
    }
  }
  FillMxfp4ScalesAndWeights<kHeads>(v, out);
}

// 16 bytes (32 E2M1 values) to 32 BF16 values in element order: each byte twice, shifted by 0 and
// 4 bits, looked up in the doubled 32-entry table (a low-nibble word keeps its high nibble's bit 0 in
// index bit 4, which the doubled table ignores).
FFI_DSA_CPU_TARGET inline void DecodeE2M1ToBf16(const uint8_t* bytes, __m512i table, uint16_t* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  const __m256i twice = _mm256_set_m128i(_mm_unpackhi_epi8(b, b), _mm_unpacklo_epi8(b, b));
  const __m512i shifts = _mm512_set1_epi32(4 << 16);  // 0 for element 2j, 4 for element 2j + 1
  const __m512i nibbles = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(twice), shifts);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(nibbles, table));
}

template <int kHeads>
constexpr int kMxfp4Vecs = kHeadVecs<kHeads> < kMxfp4VecsPerBlock ? kHeadVecs<kHeads> : kMxfp4VecsPerBlock;

// logits[i][h] as the FP32 variants' Mxfp4LogitsBlock computes them, for kTok BF16 token rows,
// kMxfp4Vecs<H> head vectors at a time (block sums and running logits in registers).
template <int kTok, int kHeads>
FFI_DSA_CPU_TARGET inline void Mxfp4LogitsBlock(const Mxfp4PreparedQuery<kHeads>& pq, const Mxfp4Tokens<uint16_t>* k,
                                                float* logits) {
  constexpr int kVecs = kMxfp4Vecs<kHeads>;
  for (int h0 = 0; h0 < kHeads; h0 += kLanes * kVecs) {
    __m512 total[kTok][kVecs];
    for (int c = 0; c < kMxfp4Blocks; ++c) {
      __m512 acc[kTok][kVecs];
#pragma GCC unroll 8
      for (int i = 0; i < kTok; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_setzero_ps();
      }
      for (int p = c * kPairsPerMxfp4Block; p < (c + 1) * kPairsPerMxfp4Block; ++p) {
        __m512bh q[kVecs];
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) q[j] = (__m512bh)_mm512_load_si512(&pq.q_pairs[p][h0 + j * kLanes]);
#pragma GCC unroll 8
        for (int i = 0; i < kTok; ++i) {
          uint32_t pair;
          std::memcpy(&pair, k->values + i * kHeadDim + 2 * p, sizeof(pair));
          const __m512bh kk = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
          for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], q[j], kk);
        }
      }
      __m512 qs[kVecs];
#pragma GCC unroll 4
      for (int j = 0; j < kVecs; ++j) qs[j] = _mm512_load_ps(&pq.q_scale[c][h0 + j * kLanes]);
#pragma GCC unroll 8
      for (int i = 0; i < kTok; ++i) {
        const __m512 ks = _mm512_set1_ps(k->scale[i][c]);
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) {
          const __m512 part = _mm512_mul_ps(acc[i][j], _mm512_mul_ps(qs[j], ks));  // ScaleBlockSum's order
          total[i][j] = c == 0 ? part : _mm512_add_ps(total[i][j], part);
        }
      }
    }
    for (int i = 0; i < kTok; ++i) {
      for (int j = 0; j < kVecs; ++j) _mm512_store_ps(logits + i * kHeads + h0 + j * kLanes, total[i][j]);
    }
  }
}

// Decodes each block of the page's tokens once and scores it for every query that sees it.
template <int kHeads>
FFI_DSA_CPU_TARGET inline void ScoreMxfp4Page(const PageQueries<Mxfp4PreparedQuery<kHeads>>& queries,
                                              const uint8_t* page) {
  alignas(64) float scale[kPageTokens][kMxfp4Blocks];
  alignas(64) uint16_t k[kTokensPerBlock * kHeadDim];
  alignas(64) float logits[kTokensPerBlock * kHeads];
  DecodePageScales(page, scale);
  const __m512i table = _mm512_loadu_si512(E2M1Bf16Table().data());
  const int decoded = queries.MaxCount();
  for (int t0 = 0; t0 < decoded; t0 += kTokensPerBlock) {
    // A block may run past a query's count: those rows exist (same page), their keys are not written.
    const bool full = t0 + kTokensPerBlock <= kPageTokens;
    const int rows = full ? kTokensPerBlock : kTailTokens;
    for (int e = 0; e < rows * kHeadDim; e += kBf16PerVector) {
      DecodeE2M1ToBf16(page + (t0 * kHeadDim + e) / 2, table, k + e);
    }
    const Mxfp4Tokens<uint16_t> tokens{k, scale + t0};
    if (full) {
      ScoreBlock<kHeads, Mxfp4LogitsBlock<kTokensPerBlock, kHeads>>(queries, &tokens, UnitScales(), t0, rows, logits);
    } else {
      ScoreBlock<kHeads, Mxfp4LogitsBlock<kTailTokens, kHeads>>(queries, &tokens, UnitScales(), t0, rows, logits);
    }
  }
}
