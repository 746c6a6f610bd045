// The SIMD variants of the CPU scoring, compiled side by side for x86-64 with per-function ISA
// attributes, so a module built for a lower baseline (x86-64, x86-64-v3) still carries them and
// picks one at run time (dispatch.h) without executing an instruction its CPU lacks:
//   avx2        FP32 FMA on 8-lane vectors
//   avx512      FP32 FMA on 16-lane vectors
//   avx512bf16  vdpbf16ps: FP8 decodes exactly to BF16 (3 mantissa bits fit in 7), BF16 pairs are
//               multiplied exactly and accumulated in FP32, twice the products per instruction.
// Each is a template on the head count H (kNumHeads or kNumHeadsNarrow).
#pragma once
#include <cstdint>
#include <cstring>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/cpu/page_queries.h"
#include "ffi_dsa/fp8_e4m3.h"
#include "ffi_dsa/rank_key.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FFI_DSA_CPU_X86 1
#include <immintrin.h>
#else
#define FFI_DSA_CPU_X86 0
#endif

#if FFI_DSA_CPU_X86
namespace ffi_dsa::cpu {

namespace avx2 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx2,fma")))
constexpr int kLanes = 8;
constexpr int kHeadVecsPerBlock = 2;  // 6 tokens x 2 vectors: 12 accumulators of 16 ymm registers
// The ISA hooks variant_common.h needs (see there).
FFI_DSA_CPU_TARGET inline __m256i WidenBytes(const uint8_t* bytes) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
}
FFI_DSA_CPU_TARGET inline float ReduceAdd(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  return _mm_cvtss_f32(_mm_add_ss(sum, _mm_movehdup_ps(sum)));
}
#include "ffi_dsa/cpu/variant_common.h"
#include "ffi_dsa/cpu/variant_fp32.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx2

namespace avx512 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
constexpr int kLanes = 16;
constexpr int kHeadVecsPerBlock = 4;  // 6 tokens x 4 vectors: 24 accumulators of 32 zmm registers
// The ISA hooks variant_common.h needs (see there); avx512bf16 uses them too.
FFI_DSA_CPU_TARGET inline __m512i WidenBytes(const uint8_t* bytes) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
}
FFI_DSA_CPU_TARGET inline float ReduceAdd(__m512 v) { return _mm512_reduce_add_ps(v); }
#include "ffi_dsa/cpu/variant_common.h"
#include "ffi_dsa/cpu/variant_fp32.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx512

namespace avx512bf16 {
#define FFI_DSA_CPU_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))
constexpr int kLanes = 16;
using avx512::ReduceAdd;  // an AVX-512 subset: inlines into this variant's functions
using avx512::WidenBytes;
#include "ffi_dsa/cpu/variant_common.h"
#include "ffi_dsa/cpu/variant_bf16.h"
#undef FFI_DSA_CPU_TARGET
}  // namespace avx512bf16

}  // namespace ffi_dsa::cpu
#endif  // FFI_DSA_CPU_X86
