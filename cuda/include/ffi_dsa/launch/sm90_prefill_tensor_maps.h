// TMA descriptors of a prefill call's keys, key scales and Q, laid out for the sm90 kernel's tiles.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/launch/tensor_maps.h"
#include "ffi_dsa/validate/prefill.h"

namespace ffi_dsa::sm90 {

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
