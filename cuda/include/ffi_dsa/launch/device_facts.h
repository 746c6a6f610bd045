// What a launch needs to know about the device, found once per device (not per call: keeps the
// launch path free of driver queries, and capture-safe), and the kernel attributes set with it.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/cuda/base.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ffi_dsa/contract.h"
#include "ffi_dsa/impls/sm90_fused_rows.cuh"
#include "ffi_dsa/impls/sm90_prefill_rows.cuh"
#include "ffi_dsa/impls/sm90_score_pages.cuh"
#include "ffi_dsa/impls/sm90_select_rows.cuh"
#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

struct DeviceFacts {
  int sm_count = 0, major = 0, minor = 0;
  size_t max_smem_optin = 0;
  // Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (0: none fits).
  ClusterOccupancy select_clusters{};
};

// How many select clusters of each size, at SelectRowsKernel's largest shared memory, can be
// resident at once. A cluster's CTAs share one GPC, so this is not SMs / size: a 16-CTA cluster
// needs 16 free SMs in one GPC, which a part with fewer SMs per GPC lacks (its launch would fail),
// and a GPC of fewer than 16 free SMs holds one 8-CTA cluster, not two.
inline ClusterOccupancy SelectClusterOccupancy() {
  ClusterOccupancy occupancy{};
  for (int size = 1; size <= kMaxSelectCluster; ++size) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(kSelectThreads);
    config.dynamicSmemBytes = SelectSmemBytes(kMaxStagedKeys);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(size);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, SelectRowsKernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused size is an answer, not a sticky error
      clusters = 0;
    }
    occupancy.active[size] = clusters;
  }
  occupancy.active[1] = std::max(occupancy.active[1], 1);  // one CTA per row always launches
  return occupancy;
}

// Calls f(heads, queries) for every (H, N) the kernels are compiled for, each as a constexpr
// functor (heads() is usable as a template argument).
template <typename F>
void ForEachQueryShape(F&& f) {
  auto for_queries = [&](auto heads) {
    f(heads, std::integral_constant<int, 1>{});
    f(heads, std::integral_constant<int, 2>{});
    f(heads, std::integral_constant<int, 3>{});
    f(heads, std::integral_constant<int, 4>{});
  };
  static_assert(kMaxQueries == 4, "one instantiation per N");
  for_queries(std::integral_constant<int, kNumHeads>{});
  for_queries(std::integral_constant<int, kNumHeadsNarrow>{});
}

// Every kernel may use the device's whole opt-in shared memory; SelectRowsKernel may form clusters
// beyond the portable 8 CTAs.
inline void SetKernelAttributes(int optin) {
  std::vector<const void*> kernels{reinterpret_cast<const void*>(SelectRowsKernel)};
  ForEachQueryShape([&kernels](auto heads, auto queries) {
    kernels.push_back(reinterpret_cast<const void*>(ScorePagesKernel<heads(), queries()>));
    kernels.push_back(reinterpret_cast<const void*>(FusedRowsKernel<heads(), queries()>));
  });
  kernels.push_back(reinterpret_cast<const void*>(PrefillRowsKernel<kNumHeads>));
  kernels.push_back(reinterpret_cast<const void*>(PrefillRowsKernel<kNumHeadsNarrow>));
  for (const void* kernel : kernels) {
    TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  }
  TVM_FFI_CHECK_CUDA_ERROR(cudaFuncSetAttribute(SelectRowsKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

// The current device's facts; on an sm_90 device also the kernel attributes, once.
inline const DeviceFacts& GetDeviceFacts(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceFacts, kMaxDevices> facts;
  static std::array<std::once_flag, kMaxDevices> once;
  if (device < 0 || device >= kMaxDevices) TVM_FFI_THROW(ValueError) << "CUDA device id " << device << " out of range";
  std::call_once(once[device], [device] {
    DeviceFacts f;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device));
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device));
    int optin = 0;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    f.max_smem_optin = static_cast<size_t>(optin);
    if (f.major == 9 && f.minor == 0) {
      // The kernels have fixed shared-memory footprints: check them once per device, not per call.
      const size_t select_bytes = SelectSmemBytes(kMaxStagedKeys);
      const size_t score_bytes = std::max(ScoreSmemBytes<kNumHeads, kMaxQueries>(), PrefillSmemBytes<kNumHeads>());
      if (std::max(score_bytes, select_bytes) > f.max_smem_optin) {
        TVM_FFI_THROW(RuntimeError) << "internal: the kernels need " << score_bytes << " and " << select_bytes
                                    << " B of shared memory, device " << device << " allows " << f.max_smem_optin;
      }
      SetKernelAttributes(optin);
      f.select_clusters = SelectClusterOccupancy();
    }
    facts[device] = f;
  });
  return facts[device];
}

}  // namespace ffi_dsa::sm90
