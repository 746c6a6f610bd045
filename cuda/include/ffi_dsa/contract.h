// Constants of the operator contract (docs/contract.md), shared by every native path.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FFI_DSA_CONTRACT_HD __host__ __device__ __forceinline__
#else
#define FFI_DSA_CONTRACT_HD inline
#endif

namespace ffi_dsa {

constexpr int kNumHeads = 64;          // H: index heads per query row
constexpr int kHeadDim = 128;          // D: FP8 bytes per head / per key token
constexpr int kPageTokens = 64;        // tokens per cache page
constexpr int kTokenBytes = 132;       // per token in the packed layout: 128 fp8 + 4 scale bytes
constexpr int kPageFp8Bytes = kPageTokens * kHeadDim;         // 8192: fp8 rows come first
constexpr int kPageBytes = kPageTokens * kTokenBytes;          // 8448: then 64 float32 scales
constexpr int kMaxTopK = 2048;         // largest K any path accepts (smem budget of the CUDA path)

// docs/contract.md §3: a negative length counts as 0, one past the block table is cut to it.
FFI_DSA_CONTRACT_HD int64_t ClampLength(int64_t n, int64_t max_pages) {
  const int64_t cap = max_pages * kPageTokens;
  return n < 0 ? 0 : (n > cap ? cap : n);
}

// Global id of the token at position t of a row: page * 64 + slot.
FFI_DSA_CONTRACT_HD int32_t GlobalTokenId(const int32_t* row_table, int64_t t) {
  return static_cast<int32_t>(static_cast<int64_t>(row_table[t / kPageTokens]) * kPageTokens + t % kPageTokens);
}

}  // namespace ffi_dsa
