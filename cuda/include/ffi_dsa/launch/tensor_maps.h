// Encoding TMA descriptors on the host. Each op's launch encodes its tensors' descriptors for every
// call (they hold the tensors' addresses: sm90_decode_tensor_maps.h, sm90_prefill_tensor_maps.h) and
// passes them to the kernels as __grid_constant__ parameters.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <cstdint>

namespace ffi_dsa {

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

}  // namespace ffi_dsa
