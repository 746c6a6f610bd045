// Constants of the operator contract (SPEC.md), shared by every native path.
#pragma once
#include <cstdint>

namespace ffi_dsa {

constexpr int kNumHeads = 64;          // H: index heads per query row
constexpr int kHeadDim = 128;          // D: FP8 bytes per head / per key token
constexpr int kPageTokens = 64;        // tokens per cache page
constexpr int kTokenBytes = 132;       // per token in the packed layout: 128 fp8 + 4 scale bytes
constexpr int kPageFp8Bytes = kPageTokens * kHeadDim;         // 8192: fp8 rows come first
constexpr int kPageBytes = kPageTokens * kTokenBytes;          // 8448: then 64 float32 scales
constexpr int kMaxTopK = 2048;         // largest K any path accepts (smem budget of the CUDA path)

}  // namespace ffi_dsa
