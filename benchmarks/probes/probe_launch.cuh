// What the probes share: a kernel launched as one cluster of `size` CTAs of 1024 threads, three
// times (the first warms up), and the spread of the per-CTA cycle counts a launch wrote.
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

template <typename... Params, typename... Args>
void LaunchClusterThrice(void (*kernel)(Params...), int size, Args... args) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(size);
  cfg.blockDim = dim3(1024);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = size, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cfg.attrs = &attr, cfg.numAttrs = 1;
  for (int rep = 0; rep < 3; ++rep) cudaLaunchKernelEx(&cfg, kernel, args...);
  cudaDeviceSynchronize();
}

struct CycleSpread {
  unsigned long long min, max;
};
inline CycleSpread SpreadOf(const unsigned long long* device_cycles, int ctas) {
  unsigned long long h[256];
  cudaMemcpy(h, device_cycles, ctas * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
  CycleSpread s{~0ull, 0};
  for (int i = 0; i < ctas; ++i) s.min = h[i] < s.min ? h[i] : s.min, s.max = h[i] > s.max ? h[i] : s.max;
  return s;
}
