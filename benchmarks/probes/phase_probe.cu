// What a select phase's building blocks cost on one CTA (cycles per repetition, SM clock):
// nvcc -O3 -arch=sm_90a -o /tmp/phase_probe benchmarks/probes/phase_probe.cu && /tmp/phase_probe
// Each variant runs R times back to back in one CTA of T threads; thread 0 reads clock64 after a
// barrier before and after. One CTA alone (a W1 select) and 132 at once (one an SM, W3-like).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#include "probe_launch.cuh"

constexpr int kBins = 4096;
constexpr int R = 64;

__device__ __forceinline__ uint32_t Hash(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}

template <int T>
__global__ void __launch_bounds__(T, 1) Probe(int variant, unsigned long long* out, uint32_t* sink) {
  __shared__ __align__(16) uint32_t hist[kBins];
  __shared__ uint32_t warp_sums[32];
  __shared__ __align__(16) uint32_t keys[T * 4];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < kBins; i += T) hist[i] = Hash(i) & 3;
  for (int i = tid; i < T * 4; i += T) keys[i] = Hash(i + 77);
  if (tid < 32) warp_sums[tid] = 0;
  __syncthreads();
  uint32_t acc = 0;
  const unsigned long long t0 = clock64();
  __syncthreads();
  const unsigned long long t1 = clock64();
#pragma unroll 1
  for (int r = 0; r < R; ++r) {
    if (variant == 0) {  // a barrier alone
      __syncthreads();
    } else if (variant == 1) {  // the smallest exchange: a warp sum published, read after a barrier
      const uint32_t v = __reduce_add_sync(0xFFFFFFFFu, hist[(tid + r) % kBins]);
      if (lane == 0) warp_sums[warp] = v;
      __syncthreads();
      acc += warp_sums[(lane + r) % (T / 32)];
      __syncthreads();
    } else if (variant == 2) {  // ThresholdBinLocal's shape (two barriers)
      const uint32_t per = kBins / T;
      uint32_t sum = 0;
      for (uint32_t i = 0; i < per; i += 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(&hist[(kBins - per * (tid + 1) + i + 4 * r) % kBins]);
        sum += v.x + v.y + v.z + v.w;
      }
      const uint32_t w = __reduce_add_sync(0xFFFFFFFFu, sum);
      if (lane == 0) warp_sums[warp] = w;
      __syncthreads();
      uint32_t x = lane < T / 32 ? warp_sums[lane] : 0u;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o) x += y;
      }
      if (warp == 0 && lane == 31) hist[r % kBins] = x;
      acc += x;
      __syncthreads();
    } else if (variant == 3) {  // binning: 8 keys a thread into 4096 shared bins, then a barrier
#pragma unroll
      for (int i = 0; i < 8; ++i) atomicAdd(&hist[((keys[(i % 4) * T + tid] ^ (i * 0x9E3779B9u)) + r) % kBins], 1u);
      __syncthreads();
    } else if (variant == 4) {  // the emit's shape: 2 quads a thread, 4 ballots each, stores
      const uint32_t below = (1u << lane) - 1u;
      uint32_t slot = r;
      for (int q = 0; q < 2; ++q) {
        const uint4 k = *reinterpret_cast<const uint4*>(&keys[(q * T + tid) * 4 % (T * 4)]);
        const uint32_t kk[4] = {k.x, k.y, k.z, k.w};
        for (int i = 0; i < 4; ++i) {
          const bool win = (kk[i] + r) > 0xC0000000u;
          slot += __popc(__ballot_sync(0xFFFFFFFFu, win) & below);
          if (win) sink[(slot + blockIdx.x * 64) % (1 << 20)] = kk[i];
        }
      }
      __syncthreads();
    }
  }
  const unsigned long long t2 = clock64();
  if (tid == 0) out[blockIdx.x] = (t2 - t1) / R;
  if (acc == 0xFFFFFFFFu) sink[0] = acc + (uint32_t)t0;
}

template <int T>
void Run(int ctas) {
  unsigned long long* out;
  uint32_t* sink;
  cudaMalloc(&out, 256 * sizeof(unsigned long long));
  cudaMalloc(&sink, (1 << 20) * sizeof(uint32_t));
  const char* names[] = {"barrier", "warp sum + barrier x2", "threshold shape", "binning 8 keys", "emit 8 keys"};
  for (int v = 0; v < 5; ++v) {
    for (int rep = 0; rep < 3; ++rep) Probe<T><<<ctas, T>>>(v, out, sink);
    cudaDeviceSynchronize();
    const CycleSpread c = SpreadOf(out, ctas);
    printf("T=%4d ctas=%3d %-24s cycles/rep min %5llu max %5llu\n", T, ctas, names[v], c.min, c.max);
  }
  cudaFree(out);
  cudaFree(sink);
}

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Clusters: variant 0 a cluster barrier alone; 1 a chain of dependent loads from the next rank's
// shared memory (DSMEM round trip); 2 sixteen independent DSMEM loads summed (the cluster
// threshold's group sums), then a CTA barrier.
__global__ void __launch_bounds__(1024, 1) ClusterProbe(int variant, unsigned long long* out, uint32_t* sink) {
  __shared__ uint32_t ring[1024];
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank(), size = cluster.num_blocks();
  ring[tid] = (tid * 7 + 1) % 1024;
  cluster.sync();
  uint32_t acc = 0, idx = tid % 1024;
  const uint32_t* next = cluster.map_shared_rank(ring, (rank + 1) % size);
  __syncthreads();
  const unsigned long long t1 = clock64();
#pragma unroll 1
  for (int r = 0; r < R; ++r) {
    if (variant == 0) {
      cluster.sync();
    } else if (variant == 1) {
      if (tid < 32) idx = next[idx];
    } else {
      if (tid < 128) {
#pragma unroll
        for (int k = 0; k < 16; ++k) acc += k < (int)size ? cluster.map_shared_rank(ring, k)[(tid + r) % 1024] : 0u;
      }
      __syncthreads();
    }
  }
  if (variant == 1) __syncwarp();
  const unsigned long long t2 = clock64();
  if (tid == 0) out[blockIdx.x] = (t2 - t1) / R;
  if (acc + idx == 0xFFFFFFFFu) sink[0] = acc;
  cluster.sync();
}

void RunClusters(int size) {
  unsigned long long* out;
  uint32_t* sink;
  cudaMalloc(&out, 256 * sizeof(unsigned long long));
  cudaMalloc(&sink, 64);
  const char* names[] = {"cluster barrier", "DSMEM dependent load", "16 DSMEM loads + barrier"};
  for (int v = 0; v < 3; ++v) {
    LaunchClusterThrice(ClusterProbe, size, v, out, sink);
    const CycleSpread c = SpreadOf(out, size);
    printf("cluster=%2d %-26s cycles/rep min %5llu max %5llu  (%s)\n", size, names[v], c.min, c.max,
           cudaGetErrorString(cudaGetLastError()));
  }
  cudaFree(out);
  cudaFree(sink);
}

int main() {
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  printf("SM clock (attribute) %d MHz\n", clock_khz / 1000);
  Run<1024>(1);
  Run<1024>(132);
  Run<512>(1);
  for (int c : {2, 8, 16}) RunClusters(c);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
