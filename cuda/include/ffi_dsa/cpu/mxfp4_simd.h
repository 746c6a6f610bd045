// The SIMD variants of the MXFP4 scoring, beside the FP8 ones in the same variant namespaces
// (score_simd.h: the same ISA attributes, vectors and per-token scoring), so dispatch picks the
// MXFP4 kernel of the same variant (avx2, avx512, avx512bf16) as the FP8 one. Each namespace first
// defines DecodeE2M1Lanes, the one hook its FP32 kernel needs in the ISA's intrinsics (the BF16
// kernel, the head vectors its register block spans).
#pragma once
#include <cstdint>
#include <cstring>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/mxfp4_query.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/cpu/score_simd.h"
#include "ffi_dsa/mxfp4_e2m1.h"

#if FFI_DSA_CPU_X86
namespace ffi_dsa::cpu {

namespace avx2 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx2,fma")))
// 4 bytes to 8 float32 values in element order: each byte twice, shifted by 0 and 4 bits; the
// magnitude from an 8-entry permute (index bits 2..0), the sign from bit 3.
FFI_DSA_CPU_TARGET inline VecF DecodeE2M1Lanes(const uint8_t* bytes) {
  int32_t word;
  std::memcpy(&word, bytes, sizeof(word));
  const __m128i b = _mm_cvtsi32_si128(word);
  const __m256i lanes = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  const __m256i nibbles = _mm256_srlv_epi32(lanes, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  const __m256 magnitude = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kE2M1Magnitudes), nibbles);
  constexpr int kSignShift = 31 - 3;
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(nibbles, kSignShift), _mm256_set1_epi32(INT32_MIN));
  return (VecF)_mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
}
#include "ffi_dsa/cpu/variant_mxfp4_fp32.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx2

namespace avx512 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
// 8 bytes to 16 float32 values in element order: each byte twice, shifted by 0 and 4 bits, looked
// up in the 16-entry table (the permute reads index bits 3..0: sign and magnitude).
FFI_DSA_CPU_TARGET inline VecF DecodeE2M1Lanes(const uint8_t* bytes) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
  const __m512i lanes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  const __m512i nibbles = _mm512_srlv_epi32(lanes, _mm512_set1_epi64(int64_t{4} << 32));
  return (VecF)_mm512_permutexvar_ps(nibbles, _mm512_loadu_ps(E2M1Table().data()));
}
#include "ffi_dsa/cpu/variant_mxfp4_fp32.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx512

namespace avx512bf16 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))
// 6 tokens x 2 head vectors, twice (block sums and running logits): 24 of 32 zmm registers
constexpr int kMxfp4VecsPerBlock = 2;
#include "ffi_dsa/cpu/variant_mxfp4_bf16.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx512bf16

}  // namespace ffi_dsa::cpu
#endif  // FFI_DSA_CPU_X86
