// TMA descriptors of the call's K cache and Q, encoded on the host for every call (they hold the
// tensors' addresses) and passed to the kernels as __grid_constant__ parameters.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/validate.h"
#include "ffi_dsa/validate_prefill.h"

namespace ffi_dsa::sm90 {

inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  // Through the runtime's entry-point query: no link-time dependency on libcuda.
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    TVM_FFI_CHECK_CUDA_ERROR(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled is not available from the CUDA driver";
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// FP8 bytes in wgmma's swizzle-128B layout by default; the prefill key scales as plain float32.
inline CUtensorMap EncodeTiled(void* base, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                               const cuuint32_t* box, CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8,
                               CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap map{};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = TensorMapEncoder()(&map, type, rank, base, dims, strides, box, element_strides,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled failed with CUresult " << r;
  return map;
}

// The FP8 rows of every page as a 3-D tensor [num_pages][64 tokens][128 bytes] with the page
// stride of 8448 bytes; one box is one page, swizzled 128B for wgmma.
inline CUtensorMap KCacheTensorMap(const uint8_t* k_cache, int64_t num_pages) {
  if (num_pages == 0) return CUtensorMap{};  // every page id is invalid: nothing is ever loaded
  const cuuint64_t dims[3] = {kHeadDim, kPageTokens, static_cast<cuuint64_t>(num_pages)};
  const cuuint64_t strides[2] = {kHeadDim, kPageBytes};
  const cuuint32_t box[3] = {kHeadDim, kPageTokens, 1};
  return EncodeTiled(const_cast<uint8_t*>(k_cache), 3, dims, strides, box);
}

// Q as [B * N * H heads][128 bytes]; one box is one row's N queries x H heads (at most 256
// rows, TMA's box limit), swizzled exactly like a K tile.
inline CUtensorMap QTensorMap(const IndexerArgs& a) {
  const cuuint64_t dims[2] = {kHeadDim, static_cast<cuuint64_t>(a.query_rows() * a.heads)};
  const cuuint64_t strides[1] = {kHeadDim};
  const cuuint32_t box[2] = {kHeadDim, static_cast<cuuint32_t>(a.queries * a.heads)};
  static_assert(kMaxQueries * kNumHeads <= 256, "one TMA box per row's queries");
  return EncodeTiled(const_cast<uint8_t*>(a.q), 2, dims, strides, box);
}

// Prefill: k [N, 128] as 64-key pages (boxes past N are zero-filled), its scales [N] as 64-float
// boxes, and q [M * H, 128] as blocks of `block_rows` rows' heads. Left unencoded without keys.
inline CUtensorMap PrefillKeysTensorMap(const PrefillArgs& a) {
  if (a.num_keys == 0) return CUtensorMap{};
  const cuuint64_t dims[2] = {kHeadDim, static_cast<cuuint64_t>(a.num_keys)};
  const cuuint64_t strides[1] = {kHeadDim};
  const cuuint32_t box[2] = {kHeadDim, kPageTokens};
  return EncodeTiled(const_cast<uint8_t*>(a.k), 2, dims, strides, box);
}
inline CUtensorMap PrefillScalesTensorMap(const PrefillArgs& a) {
  if (a.num_keys == 0) return CUtensorMap{};
  // As [1][N]: the encoder takes a rank-1 map only with strides it never reads, so the row stride
  // (the scales' bytes rounded up to 16, as strides must be) is given for a single row.
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.num_keys), 1};
  const cuuint64_t strides[1] = {(static_cast<cuuint64_t>(a.num_keys) * 4 + 15) / 16 * 16};
  const cuuint32_t box[2] = {kPageTokens, 1};
  return EncodeTiled(const_cast<float*>(a.k_scale), 2, dims, strides, box, CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                     CU_TENSOR_MAP_SWIZZLE_NONE);
}
inline CUtensorMap PrefillQTensorMap(const PrefillArgs& a, int block_rows) {
  const cuuint64_t dims[2] = {kHeadDim, static_cast<cuuint64_t>(a.rows * a.heads)};
  const cuuint64_t strides[1] = {kHeadDim};
  const cuuint32_t box[2] = {kHeadDim, static_cast<cuuint32_t>(block_rows * a.heads)};
  return EncodeTiled(const_cast<uint8_t*>(a.q), 2, dims, strides, box);
}

}  // namespace ffi_dsa::sm90
