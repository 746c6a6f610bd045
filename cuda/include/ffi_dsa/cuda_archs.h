// The GPU architectures the sources hold kernels for (one folder each: cuda/csrc/sm_90a/, ...): what
// each is called, the one compute capability its arch-specific code runs on, and what must be known
// of it without a GPU: the scratch a decode call takes, which JAX sizes at trace time, when no CUDA
// module need be loaded. Plain C++: the CPU module exports it (ffi_dsa.jax_ops asks it), and the CUDA
// binding finds a device's arch here (launch/cuda_arch_entries.h binds each to its kernels).
#pragma once

#include <cstdint>

#include "ffi_dsa/launch/sm90_workspace_bytes.h"

namespace ffi_dsa {

struct CudaArch {
  const char* name;  // as nvcc names it: "sm_90a"
  int major, minor;  // arch-specific ("a") code runs on exactly this compute capability
  // Bytes of scratch a decode call of B * N query rows over a table of max_pages takes.
  int64_t (*decode_workspace_bytes)(int64_t query_rows, int64_t max_pages);
};

inline constexpr CudaArch kCudaArchs[] = {
    {"sm_90a", 9, 0, sm90::WorkspaceBytes},
};

}  // namespace ffi_dsa
