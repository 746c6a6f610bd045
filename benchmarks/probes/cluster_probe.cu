// Cluster barrier variants on CTAs of 1024 threads (cycles per repetition, SM clock):
// nvcc -O3 -arch=sm_90a -o /tmp/cluster_probe benchmarks/probes/cluster_probe.cu && /tmp/cluster_probe
// 0 cg cluster.sync (barrier.cluster arrive.release + wait.acquire, every thread)
// 1 barrier.cluster.arrive.relaxed + wait (no release: no data ordering)
// 2 __syncthreads, one thread's fence.acq_rel.cluster, then 1
// 3 mbarriers: __syncthreads, warp 0's lanes arrive (release.cluster) on every rank's mbarrier
//   (two alternating, so a fast CTA's next arrival never lands in the current phase), every
//   thread waits on its own (try_wait.parity.acquire.cluster)
// 4 as 3 but only warp 0 waits, then __syncthreads
// Each repetition also writes one word of shared memory that rank+1 reads after the barrier
// (checked: a wrong value counts as an error).
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "probe_launch.cuh"
namespace cg = cooperative_groups;
constexpr int R = 64;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint32_t MapA(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void RemoteArrive(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
__device__ __forceinline__ void WaitParity(uint32_t addr, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

__global__ void __launch_bounds__(1024, 1) ClusterBar(int variant, unsigned long long* out, uint32_t* errors) {
  __shared__ __align__(8) uint64_t bars[2];
  __shared__ uint32_t word[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank(), size = cluster.num_blocks();
  if (tid == 0) {
    for (int b = 0; b < 2; ++b)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(&bars[b])), "r"(size) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    word[0] = word[1] = 0;
  }
  cluster.sync();
  const uint32_t* next_word = cluster.map_shared_rank(word, (rank + 1) % size);
  uint32_t bad = 0;
  const unsigned long long t1 = clock64();
#pragma unroll 1
  for (int r = 0; r < R; ++r) {
    if (tid == 0) word[r & 1] = r + 1;  // written before the barrier, read by rank - 1 after it
    if (variant == 0) {
      cluster.sync();
    } else if (variant == 1 || variant == 2) {
      if (variant == 2) {
        __syncthreads();
        if (tid == 0) asm volatile("fence.acq_rel.cluster;" ::: "memory");
      }
      asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
    } else {
      __syncthreads();
      const int b = r & 1;
      if (tid < (int)size) RemoteArrive(MapA(SmemAddr(&bars[b]), tid));
      const uint32_t parity = (r >> 1) & 1;
      if (variant == 3 || tid < 32) WaitParity(SmemAddr(&bars[b]), parity);
      if (variant == 4) __syncthreads();
    }
    if (tid == 32) bad += next_word[r & 1] != uint32_t(r + 1);
  }
  const unsigned long long t2 = clock64();
  if (tid == 0) out[blockIdx.x] = (t2 - t1) / R;
  if (tid == 32 && bad) atomicAdd(errors, bad);
  cluster.sync();
}

int main() {
  unsigned long long* out;
  uint32_t* errors;
  cudaMalloc(&out, 256 * sizeof(unsigned long long));
  cudaMalloc(&errors, 4);
  const char* names[] = {"cg cluster.sync", "arrive.relaxed + wait", "syncthreads+fence+relaxed", "mbarrier, all wait",
                         "mbarrier, warp 0 + sync"};
  for (int size : {2, 8, 16}) {
    for (int v = 0; v < 5; ++v) {
      cudaMemset(errors, 0, 4);
      LaunchClusterThrice(ClusterBar, size, v, out, errors);
      uint32_t e = 0;
      cudaMemcpy(&e, errors, 4, cudaMemcpyDeviceToHost);
      const CycleSpread c = SpreadOf(out, size);
      printf("cluster=%2d %-28s cycles/rep min %5llu max %5llu stale reads %u (%s)\n", size, names[v], c.min, c.max, e,
             cudaGetErrorString(cudaGetLastError()));
    }
  }
  return 0;
}
