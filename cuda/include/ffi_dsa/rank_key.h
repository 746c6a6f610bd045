// The ranking of docs/contract.md §2 as unsigned integer order, shared by the CPU and CUDA paths so that both
// break ties and place NaN identically.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FFI_DSA_HD __host__ __device__ __forceinline__
#else
#define FFI_DSA_HD inline
#endif

namespace ffi_dsa {

// 0 is reserved for "not a candidate" (a token on an invalid page); NaN maps to 1 so it ranks
// below every number; -0 and +0 map to one key so they tie, as they do in torch.topk.
constexpr uint32_t kNotCandidate = 0u;
constexpr uint32_t kNaNKey = 1u;

FFI_DSA_HD uint32_t ScoreToKey(float score) {
  if (score != score) return kNaNKey;
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(score);
#else
  std::memcpy(&bits, &score, sizeof(bits));
#endif
  if (score == 0.0f) bits = 0u;
  // Flip negatives entirely and set the sign bit of positives: monotone in the float value.
  // The smallest number, -inf, lands on 0x007FFFFF, well above the two reserved keys.
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Total order used for selection: larger key first, then smaller position. Packing both in
// one word makes every candidate distinct, so "top K" has exactly one answer.
FFI_DSA_HD uint64_t RankWord(uint32_t key, uint32_t position) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(0xFFFFFFFFu - position);
}
FFI_DSA_HD uint32_t RankWordPosition(uint64_t word) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(word & 0xFFFFFFFFull);
}

}  // namespace ffi_dsa
