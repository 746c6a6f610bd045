// The argument checks of the MXFP4 op (docs/contract.md §9): decode over DeepSeek-V4's 68-byte
// MXFP4 pages, with E2M1 queries and their UE8M0 scales. Everything but q, q_scale and the page
// format is decode's, checked by decode's own helpers (validate/decode.h).
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/validate/common.h"
#include "ffi_dsa/validate/decode.h"

namespace ffi_dsa {

// Decode's views and sizes, with q [B * N * H, 64] E2M1 bytes and k_cache [num_pages, 4352] pages,
// plus q's scales: four UE8M0 bytes per (query row, head), one int32 each.
struct Mxfp4Args : IndexerArgs {
  const int32_t* q_scale = nullptr;  // [B * N, H]
};

// The parameter names of ffi_dsa.mxfp4_call, in its order (ffi_dsa/mxfp4.py names them alike).
inline constexpr const char* kMxfp4ArgNames[7] = {"q", "q_scale", "k_cache", "weights", "seq_lens", "block_table",
                                                   "topk_indices"};

// Checks dtypes, ranks, shapes against each other, K, devices and contiguity. Argument order: q,
// q_scale, k_cache, weights, seq_lens, block_table, topk_indices. q is [B, H, 64] or [B, N, H, 64]
// uint8 (int8 accepted); q_scale [B * N, H] or [B, N, H] int32; k_cache [num_pages, 64, 1, 68] uint8
// (int8 accepted); the rest as decode's.
inline IndexerShape CheckMxfp4Meta(const ArgMeta& q, const ArgMeta& q_scale, const ArgMeta& k_cache,
                                   const ArgMeta& weights, const ArgMeta& seq_lens, const ArgMeta& block_table,
                                   const ArgMeta& topk_indices) {
  using namespace detail;
  CheckDType(q, IsByte(q.dtype), "uint8 (two E2M1 values per byte; int8 accepted)");
  CheckDType(q_scale, Is(q_scale.dtype, kDLInt, 32), "int32 (four UE8M0 scale bytes per head, little-endian)");
  CheckDType(k_cache, IsByte(k_cache.dtype), "uint8 or int8 (packed MXFP4 values + UE8M0 scale bytes)");
  CheckRowArgDTypes(weights, seq_lens, block_table, topk_indices);

  CheckRankIn(q, 3, "[B, H, 64]", 4, "[B, N, H, 64]");
  CheckRankIn(q_scale, 2, "[B * N, H]", 3, "[B, N, H]");
  CheckRank(k_cache, 4, "[num_pages, 64, 1, 68]");

  if (q.size(q.ndim() - 1) == kHeadDim) {
    TVM_FFI_THROW(ValueError) << q.name << " has " << kHeadDim << " bytes per head (shape " << ShapeString(q)
                              << "), an FP8 query's; an MXFP4 query packs a head's " << kHeadDim
                              << " E2M1 values into " << kMxfp4HeadBytes << " bytes (call ffi_dsa.call for FP8)";
  }
  IndexerShape s = PagedQueryShape(q, kMxfp4HeadBytes, "bytes per head: 128 E2M1 values, two per byte");
  CheckQueryRows(q_scale, 3, s, "B * N, query rows, from q");
  CheckDim(q_scale, q_scale.ndim() - 1, s.heads, "H, index heads, from q");
  CheckNotOtherPageFormat(k_cache, kTokenBytes, "FP8 pages",
                          "MXFP4 pages of 68 bytes per token: call ffi_dsa.call / topk_indexer for FP8 pages");
  CheckPageDims(k_cache, kMxfp4TokenBytes, "64 E2M1 value bytes + 4 UE8M0 scale bytes");
  CheckRowArgDims(q, s, weights, seq_lens, block_table, topk_indices);
  CheckPlacements({&q, &q_scale, &k_cache, &weights, &seq_lens, &block_table, &topk_indices});
  return s;
}

// `expected_device_type` is the device the calling module serves (kDLCPU or kDLCUDA).
inline Mxfp4Args CheckMxfp4Args(const tvm::ffi::TensorView& q, const tvm::ffi::TensorView& q_scale,
                                const tvm::ffi::TensorView& k_cache, const tvm::ffi::TensorView& weights,
                                const tvm::ffi::TensorView& seq_lens, const tvm::ffi::TensorView& block_table,
                                const tvm::ffi::TensorView& topk_indices, DLDeviceType expected_device_type) {
  const auto m = ServedArgMetas(kMxfp4ArgNames, {q, q_scale, k_cache, weights, seq_lens, block_table, topk_indices},
                                expected_device_type);
  Mxfp4Args args;
  static_cast<IndexerShape&>(args) = CheckMxfp4Meta(m[0], m[1], m[2], m[3], m[4], m[5], m[6]);
  detail::SetPagedArgs(args, q, k_cache, weights, seq_lens, block_table, topk_indices);
  args.q_scale = detail::DataAs<const int32_t>(q_scale);
  return args;
}

}  // namespace ffi_dsa
