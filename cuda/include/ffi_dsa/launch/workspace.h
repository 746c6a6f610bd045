// Per-call scratch (ScorePagesKernel's rank keys, read back by SelectRowsKernel).
#pragma once

#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <cstddef>
#include <cstdint>

namespace ffi_dsa::sm90 {

// From the caller's allocator when tvm-ffi offers one: torch's caching allocator (graph-capture
// safe, stream ordered), or XLA's workspace output under JAX (jax-tvm-ffi carves it from a buffer
// XLA sized with WorkspaceBytes, so the call allocates nothing and XLA may capture it in a command
// buffer). Otherwise stream-ordered cudaMallocAsync/cudaFreeAsync, which CUDA graphs capture as
// memory nodes.
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
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  bool async_ = false;
  tvm::ffi::Tensor owner_;
};

}  // namespace ffi_dsa::sm90
