// Constants of the operator contract (docs/contract.md), shared by every native path.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FFI_DSA_CONTRACT_HD __host__ __device__ __forceinline__
#else
#define FFI_DSA_CONTRACT_HD inline
#endif

namespace ffi_dsa {

constexpr int kNumHeads = 64;          // H: index heads per query token (the reference op's)
constexpr int kNumHeadsNarrow = 32;    // the other H the op accepts (GLM-5-style indexers)
constexpr int kMaxQueries = 4;         // N: query tokens per row (MTP / speculative decode), 1..4
constexpr int kHeadDim = 128;          // D: FP8 bytes per head / per key token
constexpr int kPageTokens = 64;        // tokens per cache page
constexpr int kTokenBytes = 132;       // per token in the packed layout: 128 fp8 + 4 scale bytes
constexpr int kPageFp8Bytes = kPageTokens * kHeadDim;         // 8192: fp8 rows come first
constexpr int kPageBytes = kPageTokens * kTokenBytes;          // 8448: then 64 float32 scales
constexpr int kMaxTopK = 2048;         // largest K any path accepts (smem budget of the CUDA path)

// The MXFP4 page format (docs/contract.md §9, DeepSeek-V4's "mxfp4" indexer cache): E2M1 values, two
// a byte (element 2j in the low nibble of byte j), and one UE8M0 scale byte per 32 of them.
constexpr int kMxfp4Block = 32;                                // elements sharing one scale byte
constexpr int kMxfp4Blocks = kHeadDim / kMxfp4Block;          // 4 scale bytes per head / per token
constexpr int kMxfp4HeadBytes = kHeadDim / 2;                  // 64: a head's (a token's) value bytes
constexpr int kMxfp4TokenBytes = kMxfp4HeadBytes + kMxfp4Blocks;   // 68
constexpr int kMxfp4PageValueBytes = kPageTokens * kMxfp4HeadBytes;  // 4096: value rows come first
constexpr int kMxfp4PageBytes = kPageTokens * kMxfp4TokenBytes;      // 4352: then 64 x 4 scale bytes
constexpr int kUe8m0Bias = 127;        // a UE8M0 byte b scales by 2^(b - 127) ...
constexpr int kUe8m0NaN = 255;         // ... except 255, which is NaN (OCP MX)
static_assert(kMxfp4Blocks * 8 == 32, "a head's scale bytes are one int32 (q_scale)");

// docs/contract.md §3: a negative length counts as 0, one past the block table is cut to it.
FFI_DSA_CONTRACT_HD int64_t ClampLength(int64_t n, int64_t max_pages) {
  const int64_t cap = max_pages * kPageTokens;
  return n < 0 ? 0 : (n > cap ? cap : n);
}

FFI_DSA_CONTRACT_HD bool SupportedHeads(int64_t h) { return h == kNumHeads || h == kNumHeadsNarrow; }

// docs/contract.md §7: the N query tokens of a row are its last N tokens, causal among themselves.
// With seq_lens [B] query j of row b sees seq_lens[b] - (N - 1 - j) tokens; with seq_lens [B, N]
// it sees seq_lens[b, j]. Either count then follows the single-query rules (ClampLength).
FFI_DSA_CONTRACT_HD int64_t SeqLensIndex(int64_t b, int j, int queries, bool per_query_lens) {
  return per_query_lens ? b * queries + j : b;
}
FFI_DSA_CONTRACT_HD int64_t VisibleTokens(int32_t seq_len_entry, int j, int queries, bool per_query_lens,
                                          int64_t max_pages) {
  const int64_t seen = per_query_lens ? int64_t(seq_len_entry) : int64_t(seq_len_entry) - (queries - 1 - j);
  return ClampLength(seen, max_pages);
}

// docs/contract.md (prefill): query row i sees keys [ks[i], ke[i]) of k's N rows, with ks < 0 counting
// as 0 and ke > N cut to N; what is left empty (ks >= ke) is a row without candidates. Its ids are
// positions relative to the clamped start (ids="relative") or the keys' own rows (ids="absolute").
FFI_DSA_CONTRACT_HD int64_t PrefillKeyBegin(int32_t ks) { return ks < 0 ? 0 : ks; }
FFI_DSA_CONTRACT_HD int64_t PrefillKeyCount(int32_t ks, int32_t ke, int64_t num_keys) {
  const int64_t begin = PrefillKeyBegin(ks), end = ke < num_keys ? int64_t(ke) : num_keys;
  return end > begin ? end - begin : 0;
}

// Global id of the token at position t of a row: page * 64 + slot.
FFI_DSA_CONTRACT_HD int32_t GlobalTokenId(const int32_t* row_table, int64_t t) {
  return static_cast<int32_t>(static_cast<int64_t>(row_table[t / kPageTokens]) * kPageTokens + t % kPageTokens);
}

// What an output id is, the `ids` option of each op (docs/contract.md): the first name is the
// default, the second the one its native attribute (a bool) selects. Decode: a token's global slot
// (GlobalTokenId, SGLang's page-table ids) or its position t in its row (attribute `positions`:
// vLLM's decode ids). Prefill: j - the row's clamped start, or j itself (attribute `absolute_ids`).
inline constexpr const char* kDecodeIds[2] = {"slots", "positions"};
inline constexpr const char* kPrefillIds[2] = {"relative", "absolute"};

}  // namespace ffi_dsa
