// How long after a producer grid's last store does a PDL-launched consumer see it?
// mode 0: the consumer waits with griddepcontrol.wait (today's select);
// mode 1: each producer CTA zeroes its flag before launch_dependents and sets it (release) after
//         its last store; the consumer polls the flags (acquire), then griddepcontrol.wait at exit.
// nvcc -O3 -arch=sm_90a -o /tmp/pdl_probe benchmarks/probes/pdl_probe.cu && /tmp/pdl_probe
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

constexpr int kIters = 300;
constexpr int kMaxA = 256;

__device__ __forceinline__ unsigned long long Now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(640, 1) Producer(uint32_t* flags, uint32_t* data, unsigned long long* a_end, int iter,
                                                   int work_ns, int mode) {
  extern __shared__ uint8_t big[];
  const int tid = threadIdx.x, b = blockIdx.x;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (mode == 1 && tid == 0) {
    flags[b] = 0;
    __threadfence();
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const unsigned long long t0 = Now();
  const unsigned long long until = t0 + work_ns + (b * 37 % 17) * 15;
  while (Now() < until) {
  }
  big[tid] = static_cast<uint8_t>(tid);
  data[b * 640 + tid] = iter;
  __syncthreads();
  if (tid == 0) {
    a_end[iter * kMaxA + b] = Now();
    if (mode == 1) {
      __threadfence();
      StoreRelease(flags + b, 1u);
    }
  }
}

__global__ void __launch_bounds__(1024, 1) Consumer(const uint32_t* flags, const uint32_t* data, int producers,
                                                    unsigned long long* b_start, uint32_t* errors, int iter,
                                                    int mode) {
  extern __shared__ uint8_t big[];
  const int tid = threadIdx.x;
  __shared__ uint32_t bad;
  if (tid == 0) bad = 0;
  big[tid] = 0;
  if (mode == 0) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  } else {
    if (tid < producers) {
      while (LoadAcquire(flags + tid) != 1u) {
      }
    }
  }
  __syncthreads();
  if (tid == 0) b_start[iter * 16 + blockIdx.x] = Now();
  uint32_t mine = 0;
  for (int i = tid; i < producers * 640; i += 1024) mine += __ldcg(data + i) != static_cast<uint32_t>(iter);
  if (mine) atomicAdd(&bad, mine);
  __syncthreads();
  if (tid == 0 && bad) atomicAdd(errors, bad);
  if (mode == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
}

int main() {
  uint32_t *flags, *data, *errors;
  unsigned long long *a_end, *b_start;
  cudaMalloc(&flags, kMaxA * 4);
  cudaMemset(flags, 0xFF, kMaxA * 4);  // garbage a previous call left
  cudaMalloc(&data, kMaxA * 640 * 4);
  cudaMalloc(&errors, 4);
  cudaMalloc(&a_end, kIters * kMaxA * 8);
  cudaMalloc(&b_start, kIters * 16 * 8);
  const int a_smem = 200 * 1024, b_smem = 64 * 1024;
  cudaFuncSetAttribute(Producer, cudaFuncAttributeMaxDynamicSharedMemorySize, a_smem);
  cudaFuncSetAttribute(Consumer, cudaFuncAttributeMaxDynamicSharedMemorySize, b_smem);
  cudaStream_t st;
  cudaStreamCreate(&st);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("SMs %d\n", sms);
  for (int na : {128, sms}) {
    for (int nb : {1, 16}) {
      for (int mode : {0, 1}) {
        cudaMemset(errors, 0, 4);
        for (int it = 0; it < kIters; ++it) {
          cudaLaunchConfig_t ca{};
          ca.gridDim = na, ca.blockDim = 640, ca.dynamicSmemBytes = a_smem, ca.stream = st, ca.attrs = &attr, ca.numAttrs = 1;
          cudaLaunchKernelEx(&ca, Producer, flags, data, a_end, it, 3000, mode);
          cudaLaunchConfig_t cb{};
          cb.gridDim = nb, cb.blockDim = 1024, cb.dynamicSmemBytes = b_smem, cb.stream = st, cb.attrs = &attr, cb.numAttrs = 1;
          cudaLaunchKernelEx(&cb, Consumer, (const uint32_t*)flags, (const uint32_t*)data, na, b_start, errors, it, mode);
        }
        if (cudaStreamSynchronize(st) != cudaSuccess) {
          printf("error %s\n", cudaGetErrorString(cudaGetLastError()));
          return 1;
        }
        std::vector<unsigned long long> ha(kIters * kMaxA), hb(kIters * 16);
        uint32_t herr;
        cudaMemcpy(ha.data(), a_end, ha.size() * 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(hb.data(), b_start, hb.size() * 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(&herr, errors, 4, cudaMemcpyDeviceToHost);
        std::vector<double> d;
        for (int it = 20; it < kIters; ++it) {
          unsigned long long last = 0, last_b = 0;
          for (int b = 0; b < na; ++b) last = std::max(last, ha[it * kMaxA + b]);
          for (int b = 0; b < nb; ++b) last_b = std::max(last_b, hb[it * 16 + b]);
          d.push_back(double(static_cast<long long>(last_b - last)));
        }
        std::sort(d.begin(), d.end());
        printf("producers %3d consumers %2d mode %d (%s): last store -> last consumer start ns p10 %.0f median %.0f p90 %.0f; stale reads %u\n",
               na, nb, mode, mode ? "flags" : "griddepcontrol.wait", d[d.size() / 10], d[d.size() / 2],
               d[d.size() * 9 / 10], herr);
      }
    }
  }
  return 0;
}
