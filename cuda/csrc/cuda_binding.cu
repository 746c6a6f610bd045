// CUDA module (Hopper, sm_90a): checks the arguments once (validate.h), picks the schedule from
// shapes (sm90_schedule.h), and launches the kernels of impls/ on the caller's stream.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "ffi_dsa/impls/sm90_merge_chunks.cuh"
#include "ffi_dsa/impls/sm90_score_chunk.cuh"
#include "ffi_dsa/sm90_schedule.h"
#include "ffi_dsa/validate.h"

namespace {

using tvm::ffi::TensorView;
namespace sm90 = ffi_dsa::sm90;

struct DeviceInfo {
  int sm_count = 0, major = 0, minor = 0;
  size_t max_smem_optin = 0;
};

// Device facts and kernel attributes, set once per device (not per call: keeps the launch path
// free of driver queries, and capture-safe).
const DeviceInfo& GetDeviceInfo(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceInfo, kMaxDevices> infos;
  static std::array<std::once_flag, kMaxDevices> once;
  if (device < 0 || device >= kMaxDevices) TVM_FFI_THROW(ValueError) << "CUDA device id " << device << " out of range";
  std::call_once(once[device], [device] {
    DeviceInfo info;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, device));
    int optin = 0;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    info.max_smem_optin = static_cast<size_t>(optin);
    if (info.major == 9 && info.minor == 0) {
      TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(sm90::ScoreChunkKernel,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
      TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(sm90::MergeChunksKernel,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    }
    infos[device] = info;
  });
  return infos[device];
}

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
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

// The FP8 rows of every page as a 3-D tensor [num_pages][64 tokens][128 bytes] with the page
// stride of 8448 bytes; one box is one page, swizzled 128B for wgmma.
CUtensorMap KCacheTensorMap(const uint8_t* k_cache, int64_t num_pages) {
  CUtensorMap map{};
  if (num_pages == 0) return map;  // every page id is invalid: nothing is ever loaded
  const cuuint64_t dims[3] = {ffi_dsa::kHeadDim, ffi_dsa::kPageTokens, static_cast<cuuint64_t>(num_pages)};
  const cuuint64_t strides[2] = {ffi_dsa::kHeadDim, ffi_dsa::kPageBytes};
  const cuuint32_t box[3] = {ffi_dsa::kHeadDim, ffi_dsa::kPageTokens, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = TensorMapEncoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(k_cache),
                                        dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) TVM_FFI_THROW(RuntimeError) << "cuTensorMapEncodeTiled failed with CUresult " << r;
  return map;
}

// Scratch for rows spanning several chunks. From the caller's framework allocator when tvm-ffi
// provides one (torch's caching allocator: graph-capture safe, stream ordered); otherwise
// stream-ordered cudaMallocAsync/cudaFreeAsync, which CUDA graphs capture as memory nodes.
class Workspace {
 public:
  Workspace(size_t bytes, DLDevice device, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (TVMFFIEnvGetDLPackManagedTensorAllocator() != nullptr) {
      const int64_t shape[1] = {static_cast<int64_t>(bytes)};
      owner_ = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(shape, 1),
                                              DLDataType{kDLUInt, 8, 1}, device);
      ptr_ = owner_.data_ptr();
    } else {
      TVM_FFI_CHECK_CUDA_ERROR(cudaMallocAsync(&ptr_, bytes, stream_));
      async_ = true;
    }
  }
  ~Workspace() {
    if (async_) cudaFreeAsync(ptr_, stream_);
  }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  bool async_ = false;
  tvm::ffi::Tensor owner_;
};

size_t AlignUp(size_t x) { return (x + 255) / 256 * 256; }

void TopkIndexerCuda(TensorView q, TensorView k_cache, TensorView weights, TensorView seq_lens,
                     TensorView block_table, TensorView topk_indices, bool sorted_by_score) {
  const ffi_dsa::IndexerArgs a =
      ffi_dsa::CheckIndexerArgs(q, k_cache, weights, seq_lens, block_table, topk_indices, kDLCUDA);
  if (reinterpret_cast<uintptr_t>(a.k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0) {
    TVM_FFI_THROW(ValueError) << "q_index_fp8 and k_index_cache_fp8 must start on a 16-byte boundary "
                              << "(TMA and vector loads); got a view at an odd offset";
  }
  if (a.batch == 0 || a.topk == 0) return;
  const int device = a.device.device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  const DeviceInfo& info = GetDeviceInfo(device);
  if (!(info.major == 9 && info.minor == 0)) {
    TVM_FFI_THROW(RuntimeError) << "the ffi_dsa CUDA kernel needs a Hopper GPU (sm_90a); device " << device
                                << " is sm_" << info.major << info.minor;
  }
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));

  const sm90::ChunkSchedule plan = sm90::PlanChunks(a.batch, a.max_pages, a.topk, info.sm_count, sm90::kMergeSmemKeys);
  const int64_t slots = a.batch * plan.chunks_per_row;
  const size_t count_bytes = AlignUp(slots * sizeof(int32_t));
  const size_t cand_bytes = AlignUp(slots * plan.cand_stride * sizeof(uint32_t));
  Workspace workspace(plan.chunks_per_row > 1 ? count_bytes + 2 * cand_bytes : 0, a.device, stream);

  sm90::ChunkParams p{};
  p.q = a.q;
  p.k_cache = a.k_cache;
  p.weights = a.weights;
  p.seq_lens = a.seq_lens;
  p.block_table = a.block_table;
  p.topk_indices = a.topk_indices;
  if (plan.chunks_per_row > 1) {
    p.cand_count = reinterpret_cast<int32_t*>(workspace.data());
    p.cand_keys = reinterpret_cast<uint32_t*>(workspace.data() + count_bytes);
    p.cand_pos = reinterpret_cast<int32_t*>(workspace.data() + count_bytes + cand_bytes);
  }
  p.num_pages = a.num_pages;
  p.max_pages = static_cast<int32_t>(a.max_pages);
  p.topk = static_cast<int32_t>(a.topk);
  p.chunk_pages = plan.chunk_pages;
  p.chunks_per_row = plan.chunks_per_row;
  p.cand_stride = plan.cand_stride;
  p.sorted = sorted_by_score;

  const CUtensorMap k_map = KCacheTensorMap(a.k_cache, a.num_pages);
  const size_t chunk_smem = sm90::ChunkSmemBytes(plan.chunk_pages);
  if (chunk_smem > info.max_smem_optin) {
    TVM_FFI_THROW(RuntimeError) << "internal: chunk of " << plan.chunk_pages << " pages needs " << chunk_smem
                                << " B of shared memory, device allows " << info.max_smem_optin;
  }
  sm90::ScoreChunkKernel<<<dim3(static_cast<unsigned>(a.batch), plan.chunks_per_row), sm90::kChunkThreads,
                           chunk_smem, stream>>>(k_map, p);
  TVM_FFI_CHECK_CUDA_ERROR(cudaGetLastError());
  if (plan.chunks_per_row > 1) {
    const size_t merge_smem = sm90::MergeSmemBytes(plan.chunks_per_row, plan.cand_stride);
    if (merge_smem > info.max_smem_optin) {
      TVM_FFI_THROW(RuntimeError) << "internal: merge of " << plan.chunks_per_row << " chunks needs " << merge_smem
                                  << " B of shared memory, device allows " << info.max_smem_optin;
    }
    sm90::MergeChunksKernel<<<static_cast<unsigned>(a.batch), sm90::kMergeThreads, merge_smem, stream>>>(p);
    TVM_FFI_CHECK_CUDA_ERROR(cudaGetLastError());
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_indexer, TopkIndexerCuda);

