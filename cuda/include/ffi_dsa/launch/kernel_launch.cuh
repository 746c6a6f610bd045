// One kernel launch with the launch attributes the CUDA paths use: a thread-block cluster and
// programmatic stream serialization (cudaLaunchKernelEx, CUDA 12+, sm_90 and later).
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <cstddef>
#include <utility>

namespace ffi_dsa {

// Launch settings with optional thread-block clusters (cluster > 0) and programmatic stream
// serialization. With the latter a kernel's CTAs may be placed once every CTA of the stream's
// previous kernel has run griddepcontrol.launch_dependents (or exited), and overlap its end: the
// launch latency and the kernel's prologue (barrier init, descriptor and L2 prefetches) hide
// behind it. Each kernel runs griddepcontrol.wait before it reads anything that kernel may have
// written.
class Launch {
 public:
  Launch(unsigned grid, unsigned threads, size_t smem, cudaStream_t stream, int cluster, bool programmatic) {
    config_.gridDim = dim3(grid);
    config_.blockDim = dim3(threads);
    config_.dynamicSmemBytes = smem;
    config_.stream = stream;
    if (cluster > 0) {
      cudaLaunchAttribute& a = attrs_[config_.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = static_cast<unsigned>(cluster);
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
    }
    if (programmatic) {
      cudaLaunchAttribute& a = attrs_[config_.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    config_.attrs = attrs_;
  }
  template <typename... Params, typename... Args>
  void Run(void (*kernel)(Params...), Args&&... args) {
    TVM_FFI_CHECK_CUDA_ERROR(cudaLaunchKernelEx(&config_, kernel, std::forward<Args>(args)...));
  }

 private:
  cudaLaunchConfig_t config_{};
  cudaLaunchAttribute attrs_[2];
};

}  // namespace ffi_dsa
