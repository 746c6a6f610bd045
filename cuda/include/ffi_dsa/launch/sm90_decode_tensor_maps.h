// TMA descriptors of a decode call's K cache and Q, laid out for the sm90 kernels' wgmma tiles.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/launch/tensor_maps.h"
#include "ffi_dsa/validate/decode.h"

namespace ffi_dsa::sm90 {

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

}  // namespace ffi_dsa::sm90
