// Vector helpers of one SIMD variant, included once per variant (score_simd.h) inside its
// namespace after it defines kLanes (floats per vector), FFI_DSA_CPU_TARGET (the ISA attribute) and
// two hooks spelled with the ISA's intrinsics, where GCC's generic code is slow: WidenBytes (kLanes
// bytes zero-extended to 32-bit lanes; GCC scalarizes __builtin_convertvector from bytes to ints,
// one insert per lane) and ReduceAdd (the sum of a vector's lanes, as a tree of adds):
// the same source becomes an AVX2, an AVX-512 and an AVX-512-BF16 build in one translation unit.
// GCC/Clang vector extensions keep it nearly free of per-ISA intrinsics.
// No include guard: included once per variant namespace (score_simd.h).

using VecF = float __attribute__((vector_size(kLanes * sizeof(float))));
using VecI = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
template <int kHeads>
constexpr int kHeadVecs = kHeads / kLanes;  // vectors spanning one token's heads
static_assert(kHeadVecs<kNumHeads> * kLanes == kNumHeads && kHeadVecs<kNumHeadsNarrow> * kLanes == kNumHeadsNarrow,
              "whole vectors of heads");

FFI_DSA_CPU_TARGET inline VecF LoadF(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

FFI_DSA_CPU_TARGET inline void StoreF(float* p, VecF v) { std::memcpy(p, &v, sizeof(v)); }

// Bit casts: a cast between vector types of one size reinterprets the bits (GCC/Clang vectors).
FFI_DSA_CPU_TARGET inline VecF AsF(VecI v) { return (VecF)v; }
FFI_DSA_CPU_TARGET inline VecI AsI(VecF v) { return (VecI)v; }

// kLanes FP8 E4M3 bytes to float32, exactly, with integer vector arithmetic (no table, no MXCSR
// dependence): normal numbers move their exponent bias from 7 to 127, subnormals are m * 2^-9
// (m < 8, exact in float), 0x7F/0xFF are NaN.
FFI_DSA_CPU_TARGET inline VecF DecodeE4M3(const uint8_t* bytes) {
  constexpr int32_t kMagnitudeMask = 0x7F, kSignBit = 0x80, kNaNMagnitude = 0x7F;
  constexpr int32_t kFirstNormal = 8;                           // magnitudes below it have exponent 0
  constexpr int32_t kExponentRebias = (127 - 7) << 23;
  constexpr int32_t kMantissaShift = 23 - 3;                    // 3 mantissa bits to float32's 23
  constexpr float kSubnormalUnit = 1.0f / 512.0f;               // 2^-9: E4M3's smallest subnormal
  const VecI byte = (VecI)WidenBytes(bytes);
  const VecI magnitude = byte & kMagnitudeMask;
  const VecF normal = AsF((magnitude << kMantissaShift) + kExponentRebias);
  const VecF subnormal = __builtin_convertvector(magnitude, VecF) * kSubnormalUnit;
  VecF value = magnitude < kFirstNormal ? subnormal : normal;
  value = magnitude == kNaNMagnitude ? VecF{} + __builtin_nanf("") : value;
  constexpr int kSignShift = 31 - 7;
  return AsF(AsI(value) | ((byte & kSignBit) << kSignShift));
}

// Rank keys of `count` tokens from their logits [count][kHeads]:
// score = sum_h weights[h] * relu(logit[h] * scale), relu keeping NaN as the SPEC asks.
template <int kHeads>
FFI_DSA_CPU_TARGET inline void ScoreTokens(const float* logits, const float* weights, const float* scale,
                                           int count, uint32_t* keys) {
  for (int i = 0; i < count; ++i) {
    VecF sum{};
    for (int j = 0; j < kHeadVecs<kHeads>; ++j) {
      const VecF x = LoadF(logits + i * kHeads + j * kLanes) * scale[i];
      sum += LoadF(weights + j * kLanes) * (x < 0.0f ? VecF{} : x);
    }
    keys[i] = ScoreToKey(ReduceAdd(sum));
  }
}

// Rank keys of one decoded block, tokens [t0, t0 + rows) of a page, for every query that sees some
// of them: Logits (the variant's LogitsBlock for this block size, a template argument so that it
// inlines under this variant's target) fills a query's logits from the block `k`.
template <int kHeads, auto Logits, typename Query, typename K>
FFI_DSA_CPU_TARGET inline void ScoreBlock(const PageQueries<Query>& queries, const K* k, const float* scale, int t0,
                                          int rows, float* logits) {
  for (int i = 0; i < queries.size; ++i) {
    const int left = queries.count[i] - t0;
    if (left <= 0) continue;
    Logits(*queries.query[i], k, logits);
    ScoreTokens<kHeads>(logits, queries.query[i]->weights, scale + t0, rows < left ? rows : left, queries.keys[i] + t0);
  }
}
